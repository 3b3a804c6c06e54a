#!/usr/bin/env bash
# GPU benchmark: NCCL allreduce through the collective crate (collective-bench --nccl), one
# rank per GPU of this host, bootstrapped over the collective's TCP rendezvous on 127.0.0.1;
# then data-parallel training on the GPUs (train-worker, one rank per GPU, gradients by NCCL)
# beside PyTorch DDP on the same GPUs, model and batch (scripts/baseline_train_ddp.py
# --device cuda), where torch is installed.
#
#   scripts/bench-gpu.sh [--sizes 1M,16M,64M,256M] [--iters K] [--no-build]
#
#   --sizes     message sizes (K/M/G are binary: 64M = 67108864 bytes); f32 sum, out of place
#   --iters     timed iterations per size (median printed); default 20
#   --no-build  use binaries built before, perhaps on another machine: $COLLECTIVE_BENCH
#               (default target/release/collective-bench) and $TRAIN_WORKER (default
#               target/release/train-worker), both built with `--features cuda`
#
# Output (rank 0):
#   gpu allreduce ranks=N size=BYTES time_ms=.. algbw_GBps=.. busbw_GBps=..
#   gpu train model=M ranks=N batch=B gradients=nccl samples_per_s=X torch_samples_per_s=Y
# (models mlp and cnn of scripts/train-spec.sh; BATCH per rank, default 256; STEPS timed
# steps, default 50, after WARMUP, default 10; torch_samples_per_s=na without torch).
# busbw = algbw * 2(N-1)/N as in nccl-tests. With one GPU (ranks=1) there are no peers: busbw is
# then reported equal to algbw, the rate at which the GPU's own memory moves the buffer through
# NCCL, a local figure and not a network one.
#
# Without a GPU (no nvidia-smi) it prints "SKIPPED: no GPU (nvidia-smi not found)" and exits 0.
# cudarc loads libcuda, libcublas, libnvrtc and libnccl at run time, by CUDA 12 names;
# scripts/cuda-libs.sh finds CUDA 12 or 13 ones (toolkit, linker cache, PyTorch's nvidia-*
# wheels) and links them where cudarc looks.
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
    echo "gpu train: not measured (no GPU)"
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

# The CUDA libraries where cudarc's dynamic loading finds them (scripts/cuda-libs.sh).
# shellcheck source=scripts/cuda-libs.sh
. scripts/cuda-libs.sh
cuda_libs_env "$tmp/libs"
if [[ ! -e "$tmp/libs/libnccl.so" ]]; then
    echo "SKIPPED: GPU present but libnccl not found (install NCCL or the nvidia-nccl wheel)"
    train_line
    exit 0
fi

bin=${COLLECTIVE_BENCH:-target/release/collective-bench}
worker=${TRAIN_WORKER:-target/release/train-worker}
if [[ $build -eq 1 ]]; then
    cargo build --release -p collective --features cuda --bin collective-bench >&2
    cargo build --release -p trainer --features cuda --bin train-worker >&2
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

# Training: one rank per GPU, each seeing only its own device, as the node runs them.
# shellcheck source=scripts/train-spec.sh
. scripts/train-spec.sh
batch=${BATCH:-256}
steps=${STEPS:-50}
warmup=${WARMUP:-10}
torch_ok=""
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then torch_ok=1; fi
for model in mlp cnn; do
    bench_spec "$model" "$tmp/$model.toml" none "" "$batch"
    base=$((25000 + RANDOM % 2000))
    addrs=$(seq 0 $((gpus - 1)) | awk -v b="$base" '{printf "%s127.0.0.1:%d", (NR>1?",":""), b+$1}')
    pids=()
    for r in $(seq 0 $((gpus - 1))); do
        CUDA_VISIBLE_DEVICES=$r RINGLEADER_GPUS=1 "$worker" --spec "$tmp/$model.toml" --rank "$r" \
            --addrs "$addrs" --bench-steps "$steps" --bench-warmup-steps "$warmup" \
            >"$tmp/train$r.out" 2>"$tmp/train$r.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || { cat "$tmp"/train*.err "$tmp"/train*.out >&2; echo "gpu train FAILED" >&2; exit 1; }
    done
    pids=()
    sps=$(sed -n 's/^bench .*samples_per_s=\([0-9.]*\).*/\1/p' "$tmp/train0.out")
    grads=tcp
    if grep -q 'gradients=nccl' "$tmp/train0.out"; then grads=nccl; fi
    tsps=na
    if [[ -n "$torch_ok" ]]; then
        tport=$((27000 + RANDOM % 2000))
        for r in $(seq 0 $((gpus - 1))); do
            RANK=$r LOCAL_RANK=$r WORLD_SIZE=$gpus MASTER_ADDR=127.0.0.1 MASTER_PORT=$tport \
                python3 scripts/baseline_train_ddp.py --device cuda --model "$model" \
                --batch "$batch" --steps "$steps" --warmup "$warmup" >"$tmp/torch$r.out" 2>"$tmp/torch$r.err" &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || cat "$tmp"/torch*.err >&2; done
        pids=()
        tsps=$(sed -n 's/^ddp .*samples_per_s=\([0-9.]*\).*/\1/p' "$tmp/torch0.out")
        tsps=${tsps:-failed}
    fi
    # Where the step's time goes (rank 0's compute, gradient, optimizer shares) and torch's.
    sed -n 's/^bench /# ringleader: /p' "$tmp/train0.out" >&2
    [[ -n "$torch_ok" ]] && sed -n 's/^ddp /# torch: /p' "$tmp/torch0.out" >&2
    echo "gpu train model=$model ranks=$gpus batch=$batch gradients=$grads samples_per_s=$sps torch_samples_per_s=$tsps"
done
