# Writes a shared dataset for ringleader: a directory with train.safetensors (and optionally
# val.safetensors), tensors x (float32, or uint8 scaled by 1/255; [N, D], [N, H, W] or
# [N, C, H, W]) and y (integer labels in 0..65535, [N]). Without val.safetensors the last
# 10% of train validates. Usage: python3 make_dataset.py DIR
import os, sys

import numpy as np
from safetensors.numpy import save_file

out = sys.argv[1] if len(sys.argv) > 1 else "my-dataset"
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
x = rng.integers(0, 256, size=(1000, 28, 28), dtype=np.uint8)  # your images here
y = rng.integers(0, 10, size=1000).astype(np.int64)  # your labels here
save_file({"x": x[:900], "y": y[:900]}, os.path.join(out, "train.safetensors"))
save_file({"x": x[900:], "y": y[900:]}, os.path.join(out, "val.safetensors"))

# From PyTorch tensors (contiguous, on the CPU):
#   from safetensors.torch import save_file
#   save_file({"x": images.contiguous(), "y": labels}, "my-dataset/train.safetensors")
