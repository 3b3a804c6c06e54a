#!/usr/bin/env python3
"""Load a ringleader checkpoint directory with Python's `safetensors` and print it.

Usage: python3 trainer/scripts/check_checkpoint.py STORE/jobs/<job>/ckpt/<step>/
Prints `name shape sum` per parameter of model.safetensors (shape as AxB, sum in float64),
after checking the file lengths against the commit marker and meta.json's step against it.
Needs: pip install safetensors numpy
(PyTorch users: `safetensors.torch.load_file(path)` works the same way).
"""

import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def main() -> None:
    d = sys.argv[1]
    commit = json.load(open(os.path.join(d, "COMMIT")))
    for name, (length, _hash) in commit["files"].items():
        actual = os.path.getsize(os.path.join(d, name))
        assert actual == length, f"{name}: {actual} bytes, marker says {length}"
    meta = json.load(open(os.path.join(d, "meta.json")))
    assert meta["step"] == commit["step"], "meta and marker disagree"
    params = load_file(os.path.join(d, "model.safetensors"))
    opt = load_file(os.path.join(d, "optimizer.safetensors"))
    print(f"# step {meta['step']} epoch {meta['epoch']} params {len(params)} optimizer tensors {len(opt)}")
    for name in sorted(params):
        t = params[name]
        assert t.dtype == np.float32
        print(name, "x".join(str(s) for s in t.shape), repr(float(t.astype(np.float64).sum())))


if __name__ == "__main__":
    main()
