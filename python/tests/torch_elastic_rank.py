"""The book's elastic PyTorch script (issue 25, point 3) on a small MLP and generated
data, as a rank of the elastic tests and benchmarks. Beside the user's lines it logs, after
each step, `hash step=S gen=G rank=R world=N pid=P h=H t=T` (H: a digest of the parameters, T: the
wall clock),
a `samples_per_step` metric at each optimizer step (the global batch: this rank's samples
since the last step times the world), and takes three test hooks from the environment: STEP_SLEEP_S (compute per step, seconds),
SLOW_DIR (a rank sleeps SLOW_S more per step while SLOW_DIR/<its pid> exists) and
STOP_AT_FILE (once it holds a step number, every rank ends its loop at that step). With
RINGLEADER_CUDA_BACKEND=cpu:fakenccl its device group is the NCCL double (`nccl_double`)."""

import ctypes
import hashlib
import os
import time

import torch
import torch.nn.functional as F

import ringleader
import ringleader.torch as rlt

if os.environ.get("RINGLEADER_CUDA_BACKEND") == "cpu:fakenccl":
    import nccl_double  # noqa: F401  (registers the NCCL double: test_torch_nccl.py)

torch.manual_seed(0)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(1)
X = torch.randn(4096, 32, generator=g)
Y = (X[:, :8].sum(1) > 0).long() + 2 * (X[:, 8:16].sum(1) > 0).long()
dataset = torch.utils.data.TensorDataset(X, Y)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


step_sleep = float(os.environ.get("STEP_SLEEP_S", "0"))
slow_dir = os.environ.get("SLOW_DIR")
slow_s = float(os.environ.get("SLOW_S", "0.2"))
stop_file = os.environ.get("STOP_AT_FILE")
epochs = int(os.environ.get("EPOCHS", "1000"))
pid = os.getpid()


def stop_at():
    try:
        with open(stop_file) as f:
            return int(f.read())
    except (TypeError, OSError, ValueError):
        return None


def digest(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha1(ctypes.string_at(flat.data_ptr(), flat.numel() * 4)).hexdigest()[:16]


rlt.init()
if os.environ.get("RINGLEADER_CUDA_BACKEND") == "cpu:fakenccl" and \
        torch.distributed.is_initialized():  # a standby joiner has no group yet
    print(f"device_group={torch.distributed.get_backend_config()} pid={pid}", flush=True)
sampler = rlt.ElasticSampler(len(dataset), batch_size=32, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
model = rlt.DistributedDataParallel(Net())
opt = rlt.ElasticOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           model=model, sampler=sampler)
done = False
samples = 0
for epoch in sampler.epochs(epochs):
    for x, y in loader:
        if step_sleep:
            time.sleep(step_sleep)
        if slow_dir and os.path.exists(os.path.join(slow_dir, str(pid))):
            time.sleep(slow_s)
        before = opt.steps
        opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
        samples += len(x)
        if opt.steps != before:
            # The global batch of the step just taken (micro-batches accumulated included).
            ringleader.metric("samples_per_step", samples * rlt.world_size(), opt.steps)
            samples = 0
        ringleader.metric("loss", loss.item(), opt.steps)
        print(f"hash step={opt.steps} gen={rlt.generation()} rank={rlt.rank()} "
              f"world={rlt.world_size()} pid={pid} h={digest(model)} t={time.time():.3f}", flush=True)
        end = stop_at()
        if end is not None and opt.steps >= end:
            done = True
            break
    if done:
        break
print(f"finished steps={opt.steps} pid={pid} t={time.time()}", flush=True)
