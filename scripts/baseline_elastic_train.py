#!/usr/bin/env python3
"""Worker script of the torchrun elastic baseline (scripts/baseline_elastic_torchrun.py).

A small DDP job as torchrun runs it: it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
TORCHELASTIC_RESTART_COUNT from the environment, trains a 64-H-10 MLP (H = `--hidden`, 64 by
default, as examples/ddp/train_ddp.py) on synthetic data with DistributedDataParallel over
Gloo on CPU, one thread per process, and prints, flushed, one line at start and one per
completed step:

    pid rank=R pid=P world=W restart=K t=<unix seconds>
    step rank=R world=W restart=K step=S t=<unix seconds>

(`--print-every N` prints the step line every N steps only; the default, 1, is every step.)

It follows torchrun's elastic contract: any restart re-runs the whole script, so the job
resumes from its last checkpoint. With `--ckpt-dir`, rank 0 writes {model, optimizer, step}
to `<ckpt-dir>/ckpt.pt` every `--ckpt-every` steps (atomically: write, then rename) and every
rank loads it at start, so a restarted group goes on from step (checkpoint + 1) and the steps
trained again after a fault are at most `--ckpt-every`. Without `--ckpt-dir` a restart begins
at step 1.

    torchrun --nproc-per-node 4 scripts/baseline_elastic_train.py --ckpt-dir /tmp/ck [--steps N]
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def emit(line: str) -> None:
    """One write per line: the workers share torchrun's stdout, and a line written in one
    write(2) of under PIPE_BUF bytes is never interleaved with another process's (print() with
    an unbuffered stdout writes the text and the newline separately)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="last step to train")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--ckpt-dir", default="", help="checkpoint directory (none: no checkpoints)")
    ap.add_argument("--ckpt-every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument("--print-every", type=int, default=1, help="steps between step lines")
    args = ap.parse_args()

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # Before the process group: the driver needs the PID even if the rendezvous never completes.
    emit(f"pid rank={rank} pid={os.getpid()} world={world} restart={restart} t={time.time():.6f}")

    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    start = 1
    ckpt = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_dir else ""
    if ckpt and os.path.exists(ckpt):
        # Every rank reads the same file: nobody writes it before DDP's first allreduce, which
        # needs every rank past this point.
        state = torch.load(ckpt, map_location="cpu")
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"]) + 1
    model = DDP(net)  # broadcasts rank 0's parameters

    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(512, 64, generator=gen)
    y = x[:, :10].argmax(dim=1)
    for step in range(start, args.steps + 1):
        idx = torch.randint(0, x.shape[0], (args.batch,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.print_every == 0:
            emit(f"step rank={rank} world={world} restart={restart} step={step} t={time.time():.6f}")
        if ckpt and rank == 0 and step % args.ckpt_every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
