#!/usr/bin/env python3
"""Allreduce baseline: PyTorch torch.distributed with the Gloo backend, on CPU.

One process per rank:

    python3 scripts/baseline_allreduce_gloo.py --rank R --world N \
        --master-addr 127.0.0.1 --master-port 29500 [--sizes 4K,1M,64M] [--iters K] \
        [--warmup W] [--ifname lo]

Rank, world, master address and port fall back to the environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), as torchrun sets them. --ifname sets GLOO_SOCKET_IFNAME (inside a
network namespace the hostname does not resolve to the namespace's address: pass eth0).

Each size: a checked allreduce (sum of rank+1 must be N(N+1)/2), W warm-up allreduces, then K
timed ones (float32, SUM, in place); rank 0 prints the median per-operation time as

    gloo allreduce world=N size=BYTES time_ms=MEDIAN algbw_GBps=X busbw_GBps=Y

with algbw = BYTES / time (GB = 1e9 bytes) and busbw = algbw * 2(N-1)/N, the same line as
ringleader's collective-bench with the prefix word "gloo".
"""
import argparse
import datetime
import math
import os
import statistics
import sys
import time

UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
         "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text):
    t = text.strip().upper()
    i = len(t)
    while i > 0 and not t[i - 1].isdigit():
        i -= 1
    if i == 0 or t[i:] not in UNITS:
        raise argparse.ArgumentTypeError("bad size %r (examples: 4K, 64K, 1M, 64M, 4096)" % text)
    n = int(t[:i]) * UNITS[t[i:]]
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError("size %r must be a positive multiple of 4 bytes" % text)
    return n


def parse_sizes(text):
    return [parse_size(s) for s in text.split(",") if s.strip()]


def default_iters(size):
    """Iterations when --iters is not given: fewer for large messages."""
    return min(100, max(5, math.ceil((128 << 20) / size)))


def default_warmup(iters):
    return min(5, max(1, iters // 5))


def report(prefix, world, size, times_s):
    med = statistics.median(times_s)
    algbw = size / med / 1e9
    busbw = algbw * 2 * (world - 1) / world
    print("%s allreduce world=%d size=%d time_ms=%.4f algbw_GBps=%.4f busbw_GBps=%.4f"
          % (prefix, world, size, med * 1e3, algbw, busbw), flush=True)


def env_int(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, default=env_int("RANK"))
    ap.add_argument("--world", type=int, default=env_int("WORLD_SIZE"))
    ap.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    ap.add_argument("--master-port", type=int, default=env_int("MASTER_PORT") or 29500)
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K,64K,1M,16M,64M"))
    ap.add_argument("--iters", type=int, default=None,
                    help="timed iterations per size (default: min(100, max(5, 128MiB/size)))")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up iterations per size (default: min(5, max(1, iters/5)))")
    ap.add_argument("--ifname", default=None, help="network interface for Gloo (GLOO_SOCKET_IFNAME)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for rendezvous/ops")
    args = ap.parse_args()
    if args.rank is None or args.world is None:
        ap.error("--rank and --world (or RANK and WORLD_SIZE) are required")
    if not (args.world >= 1 and 0 <= args.rank < args.world):
        ap.error("need world >= 1 and 0 <= rank < world")
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        backend="gloo",
        init_method="tcp://%s:%d" % (args.master_addr, args.master_port),
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    world = args.world
    scale = 1.0 / world
    for size in args.sizes:
        n = size // 4
        iters = args.iters if args.iters else default_iters(size)
        warmup = args.warmup if args.warmup is not None else default_warmup(iters)
        buf = torch.full((n,), float(args.rank + 1), dtype=torch.float32)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        want = world * (world + 1) / 2
        if not (buf[0].item() == want and buf[-1].item() == want):
            print("gloo: wrong allreduce result %s != %s" % (buf[0].item(), want), file=sys.stderr)
            sys.exit(1)
        buf.fill_(scale)
        for _ in range(warmup):
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf.mul_(scale)  # keep values bounded; outside the timed region below
        dist.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            times.append(time.perf_counter() - t0)
            buf.mul_(scale)
        if args.rank == 0:
            report("gloo", world, size, times)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
