"""A rank of the device-group tests (`test_torch_nccl.py`) with the NCCL double
(`nccl_double`) as its device group (`RINGLEADER_CUDA_BACKEND=cpu:fakenccl`), fed its
generations on stdin by the test. It counts the generation stores it builds and prints
`joined generation=G world=N backend=B stores=S device=D async_handling=A` after
`rlt.init()`; then, by its argument:

- `join`: a barrier on the ring (the test's rank takes part), `barrier`, and waits for
  the next generation, so a stop ends it;
- `train`: the README's elastic loop on a small MLP, `hash step=S gen=G h=H` after each
  step, then `clock in_forward=B between=MS` (whether the heartbeat's compute section was
  open inside the forward, and its time after the step: None outside one); once it reaches step LOSE_AT in generation 1 its device group loses its peers
  (`lost peers`; with WATCHDOG=1 the double then aborts itself, as torch's watchdog
  would); it ends at step STOP_AT printing `aborted=[…]` (each double's state).
"""

import ctypes
import hashlib
import os
import sys

import nccl_double
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringleader.torch as rlt
from ringleader.torch import _backend, _session

stores = []
_build_store = _backend._generation_store


def counting_store(*args, **kwargs):
    stores.append(1)
    return _build_store(*args, **kwargs)


_backend._generation_store = counting_store

_session.UNNAMED_FAILURE_WAIT_S = float(os.environ.get("UNNAMED_FAILURE_WAIT_S", "120"))
rlt.init()
sess = _session.session()


def joined():
    print(f"joined generation={rlt.generation()} world={rlt.world_size()} "
          f"backend={dist.get_backend_config()} stores={len(stores)} "
          f"device={sess.device_group.spec() if sess.device_group else None} "
          f"async_handling={os.environ.get('TORCH_NCCL_ASYNC_ERROR_HANDLING')}", flush=True)


joined()
if sys.argv[1] == "join":
    sess.ring.barrier()
    print("barrier", flush=True)
    sess.join_next()
    joined()
    sess.exit_stopped()

torch.manual_seed(0)
torch.set_num_threads(1)
X = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
Y = (X[:, :4].sum(1) > 0).long()
dataset = torch.utils.data.TensorDataset(X, Y)
model = rlt.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
sampler = rlt.ElasticSampler(len(dataset), batch_size=8, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
inner = torch.optim.SGD(model.parameters(), lr=0.05)
# SCHED=1: a StepLR (halved every 2 steps) given to the optimizer, `lr step=S lr=X` per step.
sched = torch.optim.lr_scheduler.StepLR(inner, step_size=2, gamma=0.5) \
    if os.environ.get("SCHED") == "1" else None
opt = rlt.ElasticOptimizer(inner, model=model, sampler=sampler, scheduler=sched)
lose_at, stop_at = int(os.environ["LOSE_AT"]), int(os.environ["STOP_AT"])
# Whether the heartbeat's compute section was open inside the last forward.
in_forward = None


def note_section(module, args):
    global in_forward
    in_forward = sess.clock.computing_ms() is not None


model.module.register_forward_pre_hook(note_section)
lost = False


def digest():
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha1(ctypes.string_at(flat.data_ptr(), flat.numel() * 4)).hexdigest()[:16]


done = False
for epoch in sampler.epochs(1000):
    for x, y in loader:
        opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
        print(f"hash step={opt.steps} gen={rlt.generation()} h={digest()}", flush=True)
        print(f"clock in_forward={in_forward} between={sess.clock.computing_ms()}", flush=True)
        if sched is not None:
            sched.step()
            print(f"lr step={opt.steps} lr={inner.param_groups[0]['lr']}", flush=True)
        if opt.steps == lose_at and rlt.generation() == 1 and not lost:
            lost = True
            watchdog = os.environ.get("WATCHDOG") == "1"
            nccl_double.instances[-1].lose_peers(watchdog_s=0.2 if watchdog else None)
            print("lost peers", flush=True)
        if opt.steps >= stop_at:
            done = True
            break
    if done:
        break
print(f"aborted={[b.aborted for b in nccl_double.instances]}", flush=True)
sess.exit_stopped()
