#!/usr/bin/env bash
# Data-parallel training throughput: MLP 784-1024-1024-10 and the small CNN on synthetic
# 28×28 images, batch 64 per worker, 1, 2 and 4 workers.
#
#   scripts/bench-train.sh [loopback|netns]     (default loopback; netns needs root)
#
# Prints per configuration:
#   train model=M workers=N net=NET samples_per_s=X efficiency=E comm_fraction=F step_ms=…
# with efficiency = samples/s(N) / (N · samples/s(1)) and comm_fraction the share of a step
# spent packing gradients and waiting for the allreduce (rank 0). `netns` runs worker i in
# host rl(i+1) of `scripts/netns.sh up N 1gbit` (10.77.0.(i+1)), rate limit RATE (default 1gbit).
#
# COMPRESSION=bf16 adds `grad_compression = "bf16"` to the spec (gradients allreduced as
# bf16) and a `grad=bf16` field to each line. FACTORS=auto|never|always sets
# `sufficient_factors` (default: the spec's default, auto: dense layers' gradients travel as
# gathered sufficient factors where that halves the bytes and some link is not shared
# memory) and adds a `factors=…` field.
#
# Where PyTorch is installed (`python3 -c "import torch"`), PyTorch DDP (gloo, one thread per
# rank, scripts/baseline_train_ddp.py) runs the same configurations beside ours:
#   train impl=ddp model=M workers=N net=NET samples_per_s=X efficiency=E
#
# Environment: STEPS (timed steps, default 30), WARMUP (default 5), WORKERS (default "1 2 4"),
# MODELS (default "mlp cnn"), THREADS (compute threads per worker, RAYON_NUM_THREADS for
# candle; default 1, as DDP's one thread per rank), RATE, BASE_PORT (default 29600), CARGO_TARGET_DIR, TRAIN_WORKER
# (a prebuilt train-worker binary: skips the build).
# All workers run on this machine's cores: with fewer cores than workers the compute is
# shared and the efficiency says so.
set -euo pipefail

net=${1:-loopback}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
steps=${STEPS:-30}
warmup=${WARMUP:-5}
workers=${WORKERS:-1 2 4}
models=${MODELS:-mlp cnn}
rate=${RATE:-1gbit}
base_port=${BASE_PORT:-29600}
# One compute thread per worker, as the DDP baseline (torch.set_num_threads(1)): the
# comparison is per core, and 4 workers on a small machine do not oversubscribe it.
export RAYON_NUM_THREADS=${THREADS:-1}
compression=${COMPRESSION:-none}
case $compression in none | bf16) ;; *) echo "COMPRESSION=$compression: none | bf16" >&2; exit 2 ;; esac
grad_field=""
if [ "$compression" != none ]; then grad_field=" grad=$compression"; fi
factors=${FACTORS:-}
case $factors in "" | auto | never | always) ;; *) echo "FACTORS=$factors: auto | never | always" >&2; exit 2 ;; esac
if [ -n "$factors" ]; then grad_field+=" factors=$factors"; fi

if [ -n "${TRAIN_WORKER:-}" ]; then
    bin=$TRAIN_WORKER
else
    cargo build --manifest-path "$root/Cargo.toml" -p trainer --bin train-worker --release >&2
    bin=$target/release/train-worker
fi
ddp=""
if python3 -c "import torch" 2>/dev/null; then ddp=1; else echo "no torch: skipping the DDP baseline" >&2; fi
ddp_port=$((base_port + 100))
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# shellcheck source=scripts/train-spec.sh
. "$root/scripts/train-spec.sh"
spec_for() {
    bench_spec "$1" "$tmp/$1.toml" "$compression" "$factors"
    echo "$tmp/$1.toml"
}

# PyTorch DDP on the same configuration; prints its samples/s.
run_ddp() {
    local model=$1 n=$2 i master=127.0.0.1
    if [ "$net" = netns ]; then master=10.77.0.1; fi
    pids=()
    for ((i = 0; i < n; i++)); do
        cmd=(env RANK="$i" WORLD_SIZE="$n" MASTER_ADDR="$master" MASTER_PORT="$ddp_port"
            python3 "$root/scripts/baseline_train_ddp.py" --model "$model" --steps "$steps"
            --warmup "$warmup" --compression "$compression")
        if [ "$net" = netns ]; then
            cmd=(ip netns exec "rl$((i + 1))" env GLOO_SOCKET_IFNAME=eth0 "${cmd[@]}")
        fi
        "${cmd[@]}" >"$tmp/ddp.$i" 2>"$tmp/ddperr.$i" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$tmp"/ddperr.* >&2; exit 1; }; done
    pids=()
    sed -n 's/^ddp .*samples_per_s=\([0-9.]*\).*/\1/p' "$tmp/ddp.0"
}

for model in $models; do
    spec=$(spec_for "$model")
    single=""
    ddp_single=""
    for n in $workers; do
        if [ "$net" = netns ]; then "$root/scripts/netns.sh" up "$n" "$rate" >&2; fi
        addrs=""
        for ((i = 0; i < n; i++)); do
            if [ "$net" = netns ]; then addrs+="${addrs:+,}10.77.0.$((i + 1)):$base_port";
            else addrs+="${addrs:+,}127.0.0.1:$((base_port + i))"; fi
        done
        pids=()
        for ((i = 0; i < n; i++)); do
            cmd=("$bin" --spec "$spec" --rank "$i" --addrs "$addrs" --bench-steps "$steps" --bench-warmup-steps "$warmup")
            # The namespaces share /dev/shm: without --no-shm the ranks would find each other
            # "on one host" and move gradients through shared memory, past the rate limit.
            if [ "$net" = netns ]; then cmd=(ip netns exec "rl$((i + 1))" "${cmd[@]}" --no-shm); fi
            "${cmd[@]}" >"$tmp/out.$i" 2>"$tmp/err.$i" &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || { cat "$tmp"/err.* >&2; exit 1; }; done
        pids=()
        line=$(grep '^bench ' "$tmp/out.0")
        sps=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
        cf=$(sed -n 's/.*comm_fraction=\([0-9.]*\).*/\1/p' <<<"$line")
        rest=$(sed -n 's/.*\(step_ms=.*\) comm_fraction.*/\1/p' <<<"$line")
        if [ -z "$single" ]; then
            if [ "$n" = 1 ]; then single=$sps; fi
        fi
        eff=$(awk -v s="$sps" -v one="${single:-0}" -v n="$n" 'BEGIN { if (one > 0) printf "%.3f", s / (n * one); else print "na" }')
        label=$net
        if [ "$net" = netns ]; then label="netns-$rate"; fi
        echo "train model=$model workers=$n net=$label$grad_field samples_per_s=$sps efficiency=$eff comm_fraction=$cf $rest"
        if [ -n "$ddp" ]; then
            dsps=$(run_ddp "$model" "$n")
            if [ -z "$ddp_single" ] && [ "$n" = 1 ]; then ddp_single=$dsps; fi
            deff=$(awk -v s="$dsps" -v one="${ddp_single:-0}" -v n="$n" 'BEGIN { if (one > 0) printf "%.3f", s / (n * one); else print "na" }')
            echo "train impl=ddp model=$model workers=$n net=$label$grad_field samples_per_s=$dsps efficiency=$deff"
        fi
    done
done
