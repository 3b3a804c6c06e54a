#!/usr/bin/env python3
"""The DDP script of scripts/bench-torch.sh: the same training step whatever the backend.

An MLP 784-2048-2048-10 with ReLU (5.8 M parameters, 23 MB of float32 gradients a step: big
enough for the allreduce's bandwidth to matter at 1 Gbit/s, where one step moves about 35 MB
in and out of each of 4 ranks), batch 16 per rank of synthetic 28×28 inputs, cross-entropy,
SGD lr 0.01 with momentum 0.9, one thread per rank, DDP's default buckets (25 MB, the first
1 MB). One process per rank, env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    python3 scripts/bench_torch_ddp.py [--backends ringleader,gloo] [--rounds 8] [--steps 5] \\
        [--warmup 3] [--batch 16] [--net loopback]

Each backend gets its own process group (the first listed is the default group, the others
come from `new_group(backend=…)`) and its own DDP model, identical at the start; the runs
alternate, `--steps` timed steps of each backend per round, so that both see the same load on
a shared machine. After the warm-up steps (not timed), rank 0 prints one line per backend,
from the median round (other processes' bursts on a shared host hit single rounds):

    torch ddp backend=B net=NET workers=N model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C

(samples_per_s = steps · batch · N / the median round's wall time, each round timed between
two barriers of its own group; cpu_ms = the median round's CPU time of rank 0's process a
step, every thread counted), then the same for DDP under `no_sync()`, the same step with no
collective at all: the bound that no backend passes (with more ranks than cores, wall time
follows CPU time, so a backend's ratio to another is bounded by how much of the step's CPU is
the collective's):

    torch ddp no_sync net=NET workers=N model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C

The "ringleader" backend comes from `ringleader.torch` (PYTHONPATH must reach the package).
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# Synthetic samples generated once per rank; steps cycle through them.
POOL_SAMPLES = 1024
CLASSES = 10
HIDDEN = 2048
# The run stepping under DDP's no_sync(): the step without any collective.
NO_SYNC = "no_sync"


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="ringleader,gloo")
    ap.add_argument("--net", default="loopback")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    backends = args.backends.split(",")
    torch.set_num_threads(1)
    if "ringleader" in backends:
        import ringleader.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(backends[0])
    groups = {backends[0]: dist.group.WORLD}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    xs = torch.randn(POOL_SAMPLES, 1, 28, 28, generator=g)
    ys = torch.randint(0, CLASSES, (POOL_SAMPLES,), generator=g)
    # The runs: one per backend, then NO_SYNC (a DDP model of the first backend's group
    # stepping under no_sync(): no collective).
    groups[NO_SYNC] = groups[backends[0]]
    runs = {}
    for b in backends + [NO_SYNC]:
        torch.manual_seed(0)
        model = DDP(mlp(), process_group=groups[b])
        runs[b] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    params = sum(p.numel() for p in runs[backends[0]][0].parameters())

    def step(b, i):
        model, opt = runs[b]
        lo = (i * args.batch) % (POOL_SAMPLES - args.batch)
        opt.zero_grad()
        with model.no_sync() if b == NO_SYNC else contextlib.nullcontext():
            F.cross_entropy(model(xs[lo:lo + args.batch]), ys[lo:lo + args.batch]).backward()
        opt.step()

    for b in runs:
        for i in range(args.warmup):
            step(b, i)
    walls = {b: [] for b in runs}
    cpus = {b: [] for b in runs}
    for r in range(args.rounds):
        for b in runs:
            dist.barrier(group=groups[b])
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(args.steps):
                step(b, args.warmup + r * args.steps + i)
            dist.barrier(group=groups[b])
            walls[b].append(time.perf_counter() - t0)
            cpus[b].append(time.process_time() - c0)
    if rank == 0:
        for b in runs:
            wall, cpu = statistics.median(walls[b]), statistics.median(cpus[b])
            sps = args.steps * args.batch * world / wall
            what = NO_SYNC if b == NO_SYNC else f"backend={b}"
            print(f"torch ddp {what} net={args.net} workers={world} "
                  f"model=mlp-{params / 1e6:.1f}M samples_per_s={sps:.0f} "
                  f"step_ms={1000 * wall / args.steps:.1f} "
                  f"cpu_ms={1000 * cpu / args.steps:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
