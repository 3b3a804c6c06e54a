#!/usr/bin/env python3
"""Allreduce baseline: MPI (mpi4py over the system Open MPI), numpy float32 buffers.

Started by mpirun, one process per rank:

    mpirun -np N --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1 \
        --mca btl tcp,self --mca btl_tcp_if_include lo \
        python3 scripts/baseline_allreduce_mpi.py [--sizes 4K,1M,64M] [--iters K] [--warmup W]

(scripts/bench-allreduce.sh shows how to run it across the network namespaces of
scripts/netns.sh.) Each size: a checked allreduce (sum of rank+1 must be N(N+1)/2), W warm-up
allreduces, then K timed comm.Allreduce(IN_PLACE, buf, SUM); rank 0 prints the median
per-operation time as

    mpi allreduce world=N size=BYTES time_ms=MEDIAN algbw_GBps=X busbw_GBps=Y

with algbw = BYTES / time (GB = 1e9 bytes) and busbw = algbw * 2(N-1)/N, the same line as
ringleader's collective-bench with the prefix word "mpi".
"""
import argparse
import math
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K,64K,1M,16M,64M"))
    ap.add_argument("--iters", type=int, default=None,
                    help="timed iterations per size (default: min(100, max(5, 128MiB/size)))")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up iterations per size (default: min(5, max(1, iters/5)))")
    args = ap.parse_args()

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    world = comm.Get_size()
    scale = np.float32(1.0 / world)
    for size in args.sizes:
        n = size // 4
        iters = args.iters if args.iters else default_iters(size)
        warmup = args.warmup if args.warmup is not None else default_warmup(iters)
        buf = np.full(n, rank + 1, dtype=np.float32)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        want = world * (world + 1) / 2
        if not (buf[0] == want and buf[-1] == want):
            print("mpi: wrong allreduce result %s != %s" % (buf[0], want), file=sys.stderr)
            comm.Abort(1)
        buf.fill(scale)
        for _ in range(warmup):
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            buf *= scale  # keep values bounded; outside the timed region below
        comm.Barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times.append(time.perf_counter() - t0)
            buf *= scale
        if rank == 0:
            report("mpi", world, size, times)
    comm.Barrier()


if __name__ == "__main__":
    main()
