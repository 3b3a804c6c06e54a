#!/usr/bin/env bash
# The project's test command (README, .ci/run): every test of the workspace, then a build
# check of the `cuda` feature (it must compile on a machine without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
# The checkpoint test reads safetensors from Python when it can; best effort, never fatal.
python3 -m pip install --quiet --disable-pip-version-check safetensors numpy >/dev/null 2>&1 || true
cargo test --workspace
cargo check -p collective --features cuda
