#!/usr/bin/env bash
# The same search of a Python objective through ringleader's `Client.launch`, Optuna and Ray
# Tune, on this machine (scripts/bench_python.py holds the objective and each driver): 9
# epochs of 0.1 s each a trial, TRIALS (32) trials, PARALLEL (4) at once, successive
# halving with rungs 1, 3, 9. One line each:
#
#   python search impl=ringleader trials=32 wall_s=S best=B overhead_ms_per_trial=O
#   python search impl=optuna trials=32 wall_s=S best=B overhead_ms_per_trial=O
#   python search impl=ray ...      (or `python search impl=ray: not installed`)
#
# ringleader: one local node (`ringleader node` on 127.0.0.1, its own data dir under a temp
# dir) offering PARALLEL cpus; `launch(objective, algorithm="asha", max_parallel=PARALLEL)`,
# trials under this python3, importing the package from python/. Optuna: TPESampler +
# SuccessiveHalvingPruner, PARALLEL worker processes on one SQLite study. Ray Tune:
# ASHAScheduler, max_concurrent_trials=PARALLEL on a local Ray of PARALLEL logical cpus,
# reusing its trial actors (Ray's own advice for short trials; without it each trial starts
# an actor process and the search takes about 5x as long here). Optuna and Ray are run when `python3 -c
# "import optuna"` (`import ray`) works (scripts/install-baselines.sh installs them).
# overhead_ms_per_trial: the slot time not spent in the objective's epochs, per trial.
#
# Environment: RINGLEADER (a prebuilt binary: skips the release build), TRIALS, PARALLEL,
# SEED (1), KEEP=1 keeps the temp dir (node log).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export TRIALS=${TRIALS:-32} PARALLEL=${PARALLEL:-4} SEED=${SEED:-1}
py=${PYTHON:-python3}

if [ -n "${RINGLEADER:-}" ]; then
    bin=$RINGLEADER
else
    cargo build --release --workspace >&2
    bin=${CARGO_TARGET_DIR:-$root/target}/release/ringleader
fi
# The package's extension, built as scripts/test.sh does, next to the package.
if [ ! -e python/ringleader/_native.abi3.so ]; then
    cargo build --quiet -p ringleader-python >&2
    cp "${CARGO_TARGET_DIR:-$root/target}/debug/lib_native.so" python/ringleader/_native.abi3.so
fi

tmp=$(mktemp -d /tmp/rl-bench-python.XXXXXX)
node_pid=
cleanup() {
    if [ -n "$node_pid" ]; then
        kill -TERM "$node_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$node_pid" 2>/dev/null || true
        wait "$node_pid" 2>/dev/null || true
    fi
    if [ "${KEEP:-0}" = 1 ]; then echo "# kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

# ---- ringleader ------------------------------------------------------------------------
if "$py" -c "import cloudpickle" 2>/dev/null; then
    env -u RINGLEADER_PEER -u RINGLEADER_TOKEN "$bin" node --name bench-py \
        --listen 127.0.0.1:0 --api 127.0.0.1:0 --data 127.0.0.1:0 --datasets 127.0.0.1:0 \
        --data-dir "$tmp/node" --cpus "$PARALLEL" </dev/null >/dev/null 2>"$tmp/node.log" &
    node_pid=$!
    peer=
    for _ in $(seq 300); do
        peer=$("$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['api_addr'] if d['pid']==int(sys.argv[2]) else '')" \
            "$tmp/node/node.json" "$node_pid" 2>/dev/null || true)
        [ -n "$peer" ] && break
        sleep 0.1
    done
    [ -n "$peer" ] || { echo "bench-python.sh: the node did not start: $(tail -5 "$tmp/node.log")" >&2; exit 1; }
    token=$(head -1 "$tmp/node/api.token")
    # Wait for the node to be its own chief.
    for _ in $(seq 300); do
        PYTHONPATH="$root/python" "$py" -c "import ringleader,sys; sys.exit(0 if ringleader.Client(sys.argv[1], sys.argv[2]).status().get('chief') else 1)" \
            "$peer" "$token" 2>/dev/null && break
        sleep 0.1
    done
    "$py" scripts/bench_python.py ringleader "$peer" "$token" "$root/python"
else
    echo "python search impl=ringleader: cloudpickle not installed ($py -m pip install cloudpickle)"
fi

# ---- Optuna ----------------------------------------------------------------------------
if "$py" -c "import optuna" 2>/dev/null; then
    "$py" scripts/bench_python.py optuna "$tmp"
else
    echo "python search impl=optuna: not installed ($py -m pip install optuna)"
fi

# ---- Ray Tune --------------------------------------------------------------------------
if "$py" -c "import ray.tune" 2>/dev/null; then
    # Ray prints its own tables and warnings: into a log (kept with KEEP=1), the line out.
    rc=0
    RAY_AIR_NEW_OUTPUT=0 "$py" scripts/bench_python.py ray >"$tmp/ray.log" 2>&1 || rc=$?
    grep '^python search impl=ray' "$tmp/ray.log" ||
        { echo "bench-python.sh: the Ray driver failed ($rc): $(tail -5 "$tmp/ray.log")" >&2; exit 1; }
else
    echo "python search impl=ray: not installed ($py -m pip install 'ray[tune]')"
fi
