#!/usr/bin/env bash
# Builds the device kit: everything a visit to a GPU machine runs, with no Rust there, in one
# folder under 64 MiB (what the device tool carries: `carry: ["target/gpu-kit"]`).
#
#   scripts/gpu-kit.sh [--out DIR] [--no-build]
#
#   --out DIR    the kit folder (default target/gpu-kit; emptied first)
#   --no-build   take the release binaries already in target/release (built with
#                `--features cuda`) instead of building them
#
# What goes in:
#   bin/collective-bench, bin/train-worker   release, `--features cuda`, stripped
#   wheel/ringleader-*.whl                   scripts/build-wheel.sh around the stripped
#                                            `--features cuda` node, its extension stripped;
#                                            the visit's node is the wheel's (one copy only)
#   scripts/                                 gpu-visit.sh and what it runs (bench-gpu.sh and
#                                            its helpers, the PyTorch baselines, the torch
#                                            checks); the data is the synthetic set the specs
#                                            name, generated where it runs
# Then it checks the size with du and fails over 64 MiB. Run the visit with
# `bash target/gpu-kit/scripts/gpu-visit.sh` (see the book's GPU hosts page).
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/gpu-kit
build=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "gpu-kit: unknown argument: $1" >&2; exit 2 ;;
    esac
done
# What the device tool carries, in all, with the working tree.
kit_mib_max=64

if [[ $build -eq 1 ]]; then
    # One cargo call, so the three share one feature resolution (and one build of each crate).
    cargo build --release --locked -p ringleader -p collective -p trainer \
        --features ringleader/cuda,collective/cuda,trainer/cuda \
        --bin ringleader --bin collective-bench --bin train-worker
fi
for b in ringleader collective-bench train-worker; do
    [[ -x target/release/$b ]] || { echo "gpu-kit: target/release/$b missing" >&2; exit 1; }
done
if ! grep -q ncclCommInitRankConfig target/release/train-worker; then
    echo "gpu-kit: target/release/train-worker was built without --features cuda" >&2
    exit 1
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/wheel" "$out/scripts"
# Symbols and line tables go: a visit reads its lines, not backtraces' file names.
strip -o "$out/bin/collective-bench" target/release/collective-bench
strip -o "$out/bin/train-worker" target/release/train-worker
node=target/gpu-kit-node
strip -o "$node" target/release/ringleader
scripts/build-wheel.sh --node "$node" --strip >&2
wheel=$(ls -t target/wheels/ringleader-*.whl | head -n1)
cp "$wheel" "$out/wheel/"
rm -f "$node"
for f in gpu-visit.sh bench-gpu.sh train-spec.sh cuda-libs.sh baseline_train_ddp.py \
    gpu_torch_check.py; do
    cp "scripts/$f" "$out/scripts/"
done
git rev-parse HEAD >"$out/COMMIT" 2>/dev/null || echo unknown >"$out/COMMIT"

mib=$(du -sm "$out" | cut -f1)
du -sh "$out"/* | sed 's/^/gpu-kit: /'
if [[ $mib -gt $kit_mib_max ]]; then
    echo "gpu-kit: $out is $mib MiB, over $kit_mib_max MiB" >&2
    exit 1
fi
echo "gpu-kit ok: $out ($mib MiB of $kit_mib_max)"
