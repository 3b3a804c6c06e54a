#!/usr/bin/env bash
# GPU benchmark: NCCL allreduce through the collective crate (collective-bench --nccl), one
# rank per GPU of this host, bootstrapped over the collective's TCP rendezvous on 127.0.0.1.
#
#   scripts/bench-gpu.sh [--sizes 1M,16M,64M,256M] [--iters K] [--no-build]
#
#   --sizes     message sizes (K/M/G are binary: 64M = 67108864 bytes); f32 sum, out of place
#   --iters     timed iterations per size (median printed); default 20
#   --no-build  skip building (binary: $COLLECTIVE_BENCH or target/release/collective-bench,
#               which must be built with `--features cuda`)
#
# Output (rank 0):
#   gpu allreduce ranks=N size=BYTES time_ms=.. algbw_GBps=.. busbw_GBps=..
#   gpu train: not measured (GPU training is not implemented yet)
# busbw = algbw * 2(N-1)/N as in nccl-tests. With one GPU (ranks=1) there are no peers: busbw is
# then reported equal to algbw, the rate at which the GPU's own memory moves the buffer through
# NCCL, a local figure and not a network one.
#
# Without a GPU (no nvidia-smi) it prints "SKIPPED: no GPU (nvidia-smi not found)" and exits 0.
# cudarc loads libcuda.so and libnccl.so at run time; where only libnccl.so.2 exists (PyTorch's
# nvidia-nccl wheel, say) a libnccl.so link to it is made in a temporary directory and put on
# LD_LIBRARY_PATH.
set -euo pipefail

cd "$(dirname "$0")/.."

sizes=1M,16M,64M,256M
iters=20
build=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --sizes) sizes=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

train_line() {
    echo "gpu train: not measured (GPU training is not implemented yet)"
}

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "SKIPPED: no GPU (nvidia-smi not found)"
    train_line
    exit 0
fi
gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
if [[ "$gpus" -lt 1 ]]; then
    echo "SKIPPED: no GPU (nvidia-smi lists none)"
    train_line
    exit 0
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

# libnccl.so for cudarc's dynamic loading.
if ! ldconfig -p | grep -q 'libnccl\.so '; then
    so2=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
    if [[ -z "$so2" ]]; then
        py=${PYTHON:-python3}
        so2=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
    fi
    if [[ -n "$so2" && -e "$so2" ]]; then
        ln -s "$so2" "$tmp/libnccl.so"
        export LD_LIBRARY_PATH="$tmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        echo "SKIPPED: GPU present but libnccl not found (install NCCL or the nvidia-nccl wheel)"
        train_line
        exit 0
    fi
fi

bin=${COLLECTIVE_BENCH:-target/release/collective-bench}
if [[ $build -eq 1 ]]; then
    cargo build --release -p collective --features cuda --bin collective-bench >&2
fi

# Ports below the ephemeral range, one per rank.
base=$((23000 + RANDOM % 2000))
peers=$(seq 0 $((gpus - 1)) | awk -v b="$base" '{printf "%s127.0.0.1:%d", (NR>1?",":""), b+$1}')
for r in $(seq 1 $((gpus - 1))); do
    "$bin" --nccl --world "$gpus" --rank "$r" --device "$r" --peers "$peers" \
        --sizes "$sizes" --iters "$iters" >"$tmp/rank$r.log" 2>&1 &
    pids+=($!)
done
status=0
"$bin" --nccl --world "$gpus" --rank 0 --device 0 --peers "$peers" \
    --sizes "$sizes" --iters "$iters" || status=$?
for p in "${pids[@]}"; do
    wait "$p" || status=$?
done
pids=()
if [[ $status -ne 0 ]]; then
    for r in $(seq 1 $((gpus - 1))); do
        sed "s/^/rank $r: /" "$tmp/rank$r.log" >&2
    done
    echo "gpu allreduce FAILED (exit $status)" >&2
    exit "$status"
fi
train_line
