#!/usr/bin/env python3
"""Training baseline: PyTorch DistributedDataParallel with the Gloo backend, on CPU.

The configurations of scripts/bench-train.sh, for a side-by-side comparison:

  - `mlp`: 784-1024-1024-10 with ReLU (the trainer's `arch = "mlp"`, `hidden = [1024, 1024]`);
  - `cnn`: the trainer's `arch = "cnn"` with `channels = [16, 32]`, `kernel = 3`, `fc = 128`
    (trainer/src/cnn.rs): conv 1→16 3×3 pad 1, ReLU, 2×2 max-pool; conv 16→32 3×3 pad 1, ReLU,
    2×2 max-pool; dense 32·7·7→128, ReLU; dense 128→10;

on synthetic 28×28 one-channel images (10 classes), batch 64 per rank, cross-entropy, SGD
lr 0.01 with momentum 0.9 (the trainer's SGD default, which bench-train.sh keeps), one
thread per rank (`torch.set_num_threads(1)`). One process per rank, env:// rendezvous:

    RANK=R WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python3 scripts/baseline_train_ddp.py --model mlp [--steps 30] [--warmup 5] \\
        [--compression bf16]

Inside a network namespace set GLOO_SOCKET_IFNAME=eth0 (the hostname does not resolve to the
namespace's address). `--compression bf16` registers DDP's `bf16_compress_hook` (gradients
allreduced as bf16), the counterpart of the trainer's `grad_compression = "bf16"`.

After the warm-up steps (not timed) and a barrier, rank 0 times the next steps and prints

    ddp model=M workers=N samples_per_s=X step_ms=Y

`--device cuda` runs rank r on GPU r (LOCAL_RANK, else RANK) with the NCCL backend, the data
on the GPU (scripts/bench-gpu.sh's baseline). With samples_per_s = steps · batch · N / wall time.

`--cuda-graph` (with `--device cuda`, one rank) captures the whole step (forward, backward,
the optimizer's update) in one CUDA graph and replays it, as PyTorch's whole-network capture
does: no Python and no kernel launch per layer, the honest ceiling for this model on one GPU
(scripts/gpu-visit.sh). Its line ends with `graph=cuda`.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# Synthetic samples generated once per rank; steps cycle through them.
POOL_SAMPLES = 4096
CLASSES = 10


class Cnn(nn.Module):
    def __init__(self, channels=(16, 32), kernel=3, fc=128, classes=CLASSES):
        super().__init__()
        pad = kernel // 2
        self.conv1 = nn.Conv2d(1, channels[0], kernel, padding=pad)
        self.conv2 = nn.Conv2d(channels[0], channels[1], kernel, padding=pad)
        self.fc1 = nn.Linear(channels[1] * 7 * 7, fc)
        self.fc2 = nn.Linear(fc, classes)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = F.relu(self.fc1(h.flatten(1)))
        return self.fc2(h)


def build(model):
    if model == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 1024), nn.ReLU(),
            nn.Linear(1024, 1024), nn.ReLU(),
            nn.Linear(1024, CLASSES),
        )
    if model == "cnn":
        return Cnn()
    raise SystemExit("unknown model %r (mlp | cnn)" % model)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps (not timed)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--compression", default="none", choices=["none", "bf16"])
    p.add_argument("--timeout-s", type=int, default=120, help="rendezvous and op timeout")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: rank r on GPU r, NCCL backend (scripts/bench-gpu.sh)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="one rank on cuda: the whole step captured in a CUDA graph")
    a = p.parse_args()
    if a.cuda_graph and a.device != "cuda":
        p.error("--cuda-graph needs --device cuda")

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(7)  # same initial parameters on every rank (DDP broadcasts anyway)
    if a.cuda_graph and world != 1:
        raise SystemExit("--cuda-graph runs one rank (WORLD_SIZE=1)")
    if a.cuda_graph:
        # DDP's allreduce hooks stay out of the graph: one rank has nothing to reduce.
        model = build(a.model).to(dev)
    else:
        model = DDP(build(a.model).to(dev), device_ids=[dev.index] if cuda else None)
    if a.compression == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)

    g = torch.Generator().manual_seed(1000 + rank)
    xs = torch.randn(POOL_SAMPLES, 1, 28, 28, generator=g).to(dev)
    ys = torch.randint(0, CLASSES, (POOL_SAMPLES,), generator=g).to(dev)
    per_pool = POOL_SAMPLES // a.batch

    def step(i):
        lo = (i % per_pool) * a.batch
        x, y = xs[lo:lo + a.batch], ys[lo:lo + a.batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    if a.cuda_graph:
        step = captured(model, opt, xs, ys, a.batch, per_pool)
    for i in range(a.warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(a.warmup + i)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    wall = time.perf_counter() - t0
    if rank == 0:
        print("ddp model=%s workers=%d samples_per_s=%.1f step_ms=%.2f%s" % (
            a.model, world, a.steps * a.batch * world / wall, 1e3 * wall / a.steps,
            ("" if a.compression == "none" else " grad=" + a.compression)
            + (" graph=cuda" if a.cuda_graph else "")), flush=True)
    dist.destroy_process_group()


def captured(model, opt, xs, ys, batch, per_pool):
    """The step as one CUDA graph over static input buffers (PyTorch's whole-network capture:
    warm-up iterations on a side stream, then the capture); each call copies its batch into
    the buffers and replays the graph."""
    static_x, static_y = xs[:batch].clone(), ys[:batch].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(static_x), static_y).backward()
        opt.step()

    def replay(i):
        lo = (i % per_pool) * batch
        static_x.copy_(xs[lo:lo + batch])
        static_y.copy_(ys[lo:lo + batch])
        graph.replay()

    return replay


if __name__ == "__main__":
    main()
