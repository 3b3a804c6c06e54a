#!/usr/bin/env python3
"""A search trial for ringleader's command searches: a known objective with epochs.

ringleader runs it as `python3 trial.py --lr 0.01 [--momentum 0.9 ...]` (each search
parameter becomes `--name value`, and `RINGLEADER_PARAM_<NAME>` in the environment). Each
"epoch" it prints a report line, which the node turns into the trial's metric:

    ringleader-report <epochs done> accuracy <value>

The accuracy rises with epochs towards a ceiling that is best at lr = 0.01 and momentum 0.9
(a smooth bowl in log10(lr)), so a search has something to find. Standard library only.

Test knobs: `--epochs N` (default 9), `--epoch-s S` seconds per epoch (default 0.05),
`--fail-trial K` exits 3 in trial K's first run, `--slow-trial K` makes trial K's
original run (not a speculative copy) 40x slower per epoch.
"""
import argparse
import math
import os
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--epoch-s", type=float, default=0.05)
    p.add_argument("--fail-trial", type=int, default=-1)
    p.add_argument("--slow-trial", type=int, default=-1)
    args, _ = p.parse_known_args()

    trial = int(os.environ.get("RINGLEADER_TRIAL_ID", "-1"))
    copy = os.environ.get("RINGLEADER_TRIAL_COPY", "0") == "1"
    attempt = int(os.environ.get("RINGLEADER_ATTEMPT", "1"))
    if args.fail_trial >= 0 and trial == args.fail_trial and attempt == 1:
        print(f"trial {trial}: failing on purpose", flush=True)
        sys.exit(3)
    slow = args.slow_trial >= 0 and trial == args.slow_trial and not copy

    ceiling = 0.98 - 0.08 * (math.log10(args.lr) + 2.0) ** 2 - 0.5 * (args.momentum - 0.9) ** 2
    for epoch in range(1, args.epochs + 1):
        time.sleep(args.epoch_s * (40 if slow else 1))
        accuracy = ceiling * (1.0 - math.exp(-epoch / 3.0))
        print(f"ringleader-report {epoch} accuracy {accuracy:.6f}", flush=True)
    print(f"done lr={args.lr} momentum={args.momentum} accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
