#!/usr/bin/env python3
"""Export scikit-learn's bundled 8x8 digits to examples/data/digits.bin.gz (run once).

Source: the UCI "Optical Recognition of Handwritten Digits" data set (Alpaydin & Kaynak,
1998; CC BY 4.0), as bundled by scikit-learn (BSD-3-Clause) in
sklearn/datasets/data/digits.csv.gz: 1,797 images of 8x8 pixels, values 0..16, labels 0..9.

Format (then gzip with mtime 0, so the output is byte-for-byte reproducible):
    b"RLDIGIT1"                       magic, 8 bytes
    u32 little-endian  n              number of samples (1797)
    u32 little-endian  pixels         pixels per sample (64)
    n records of: pixels bytes (0..16, row-major), 1 byte label (0..9)

The records are in a fixed shuffled order (numpy RandomState(20240601) permutation), so the
trainer's split is simply "first 1500 train, last 297 validation" and both halves hold all
ten classes in near-equal measure.

Usage: python3 scripts/export-digits.py [OUT]   (pip install scikit-learn numpy)
"""

import gzip
import hashlib
import io
import os
import struct
import sys

import numpy as np
from sklearn.datasets import load_digits

SEED = 20240601


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "examples", "data", "digits.bin.gz")
    d = load_digits()
    x = d.data.astype(np.uint8)
    y = d.target.astype(np.uint8)
    assert x.shape == (1797, 64) and x.max() <= 16 and y.max() == 9
    perm = np.random.RandomState(SEED).permutation(len(y))
    x, y = x[perm], y[perm]
    raw = io.BytesIO()
    raw.write(b"RLDIGIT1")
    raw.write(struct.pack("<II", len(y), x.shape[1]))
    for xi, yi in zip(x, y):
        raw.write(xi.tobytes())
        raw.write(bytes([int(yi)]))
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as f:
        f.write(raw.getvalue())
    data = buf.getvalue()
    with open(out, "wb") as f:
        f.write(data)
    val = np.bincount(y[1500:], minlength=10)
    print(f"wrote {out}: {len(data)} bytes, {len(y)} samples, sha256 "
          f"{hashlib.sha256(data).hexdigest()[:16]}, validation class counts {val.tolist()}")


if __name__ == "__main__":
    main()
