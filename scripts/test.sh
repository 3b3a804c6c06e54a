#!/usr/bin/env bash
# The project's test command (README, .ci/run): every test of the workspace, then a build
# check of the `cuda` feature (it must compile on a machine without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
cargo check -p collective --features cuda
