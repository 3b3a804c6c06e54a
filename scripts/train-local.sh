#!/usr/bin/env bash
# Runs a data-parallel job as N local processes (no control plane needed):
#
#   scripts/train-local.sh N SPEC.toml [train-worker args...]
#
# Starts N `train-worker` processes on 127.0.0.1 (ports BASE_PORT..BASE_PORT+N-1) connected by
# the collective's TCP ring, waits for all of them, and stops the others (by PID) if one fails
# or on Ctrl-C. Checkpoints go to --storage (default file://$DATA_DIR/store) under the job id
# (--job-id, default "local"); running again with the same job id resumes from the latest
# committed checkpoint.
#
# Environment: PROFILE (debug|release, default release), BASE_PORT (default 29500),
# DATA_DIR (default ./ringleader-data), CARGO_TARGET_DIR (default ./target).
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 N SPEC.toml [train-worker args...]" >&2
    exit 2
fi
n=$1; spec=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
profile=${PROFILE:-release}
base_port=${BASE_PORT:-29500}
data_dir=${DATA_DIR:-ringleader-data}
target=${CARGO_TARGET_DIR:-$root/target}

if [ "$profile" = release ]; then
    cargo build --manifest-path "$root/Cargo.toml" -p trainer --bin train-worker --release >&2
else
    cargo build --manifest-path "$root/Cargo.toml" -p trainer --bin train-worker >&2
fi
bin=$target/$profile/train-worker

addrs=""
for ((i = 0; i < n; i++)); do
    addrs+="${addrs:+,}127.0.0.1:$((base_port + i))"
done

pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
}
trap cleanup EXIT INT TERM

for ((i = 0; i < n; i++)); do
    "$bin" --spec "$spec" --rank "$i" --addrs "$addrs" --data-dir "$data_dir" "$@" &
    pids+=($!)
done

status=0
remaining=("${pids[@]}")
while [ ${#remaining[@]} -gt 0 ]; do
    # Wait for whichever worker ends first; a failure stops the rest.
    if wait -n "${remaining[@]}"; then :; else status=$?; echo "train-local: a worker failed (exit $status); stopping the others" >&2; break; fi
    still=()
    for p in "${remaining[@]}"; do
        if kill -0 "$p" 2>/dev/null; then still+=("$p"); fi
    done
    remaining=("${still[@]}")
done
exit $status
