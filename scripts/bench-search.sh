#!/usr/bin/env bash
# Hyperparameter-search benchmark on fresh local 3-node clusters (release build). Prints:
#
# (a) scheduling overhead: one random search of TRIALS (500) trivial command trials
#     (`command = ["true"]`, no metric reported) on 3 nodes offering 16 cpus each (48 slots):
#       search trials=500 trials_per_s=X overhead_ms_p50=Y overhead_ms_p99=Z nodes=3 slots=48
#     trials_per_s = trials / (search finished_at_ms − submitted_at_ms); overhead_ms = per
#     trial job, finished_at_ms − started_at_ms (placed → its end committed).
#
# (b) quality per budget on digits: the same objective for every algorithm (the digits MLP of
#     examples/jobs/digits-asha.toml; model.hidden ∈ {[32], [64], [128, 64]}, train.lr log
#     0.001..1, train.batch_per_worker ∈ {16, 32, 64}; at most 9 epochs a trial, val_accuracy,
#     max, seed SEED), one search at a time on one 3-node cluster (default cpus), max_parallel
#     MAX_PARALLEL (3), all with about BUDGET (180) epochs: TPE and random train BUDGET/9 full
#     trials; ASHA and Hyperband (min_resource 1, reduction_factor 3, max_resource 9) get the
#     number of trials that comes closest to it (ASHA_TRIALS, HYPERBAND_TRIALS; measured for
#     BUDGET=180 on this project's 2-core machine, their actual use varies a little from run
#     to run with the asynchronous promotions). One line each:
#       search algorithm=asha budget_epochs=E trials=N best=B seconds=S
#     budget_epochs: epochs actually trained (Σ trials' resource; a speculative copy's epochs
#     are not in it); best: the search's best val_accuracy; seconds: search finished_at_ms −
#     submitted_at_ms. A digits epoch takes milliseconds, so these searches are dominated
#     by scheduling (process start-up, report and exit round trips through the Raft log).
#
# (c) where `python3 -c "import optuna"` works (scripts/install-baselines.sh installs it),
#     Optuna's TPESampler(seed) + SuccessiveHalvingPruner(1, 3) on the same objective and
#     budget, trials run one at a time as single `ringleader train-worker` processes
#     (scripts/baseline_search_optuna.py):
#       search impl=optuna algorithm=tpe+sha budget_epochs=E trials=N best=B seconds=S
#     else `search impl=optuna skipped (pip install optuna)`.
#
# With HOPS=1 the nodes trace each trial's hops (RUST_LOG's ringleader::hops=debug) and (a)
# adds where a trial's time goes, p50 and p90 of each hop in ms, on stderr:
#   # hops ms p50 (p90): decided→placed A (B) placed→seen … committed→next …
# decided: the chief's pass that starts it; placed: its start committed (the chief); seen:
# the node starts its rank; spawned: the process runs; exited: it and its pipes ended;
# committed: the node's report of the exit committed; next: the chief's next pass.
#
# Anything odd (a search that did not succeed, a trial or its job not in a final state after
# its search ended, trial processes still running 10 s after it, processes left after the
# nodes stopped, an ASHA/Hyperband budget more than 9 epochs off) is reported on stderr as
# `# warning: …`, with a `# …` summary line per search. About 40 s after the build on 2 cores.
#
# Environment: TRIALS (500), BUDGET (180), SEED (1), MAX_PARALLEL (3), ASHA_TRIALS,
# HYPERBAND_TRIALS, ALGORITHMS ("asha hyperband tpe random"), PARTS ("overhead quality
# optuna"), HOPS (0), WAIT_S (deadline of each wait and of the Optuna run, 900), RINGLEADER (a
# prebuilt binary: skips the build), KEEP=1 keeps the temp dir (node logs) under /tmp.
# Needs python3 (standard library) for the HTTP API.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The embedded python helpers import scripts/cluster_api.py.
export RINGLEADER_SCRIPTS="$root/scripts"
# shellcheck source=local-nodes-lib.sh
. "$root/scripts/local-nodes-lib.sh"
trials=${TRIALS:-500}
budget=${BUDGET:-180}
seed=${SEED:-1}
max_parallel=${MAX_PARALLEL:-3}
asha_trials=${ASHA_TRIALS:-}
hyperband_trials=${HYPERBAND_TRIALS:-}
algorithms=${ALGORITHMS:-asha hyperband tpe random}
parts=${PARTS:-overhead quality optuna}
wait_s=${WAIT_S:-900}
hops=${HOPS:-0}
max_epochs=9

if [ -n "${RINGLEADER:-}" ]; then
    bin=$RINGLEADER
else
    cargo build --release --workspace >&2
    bin=${CARGO_TARGET_DIR:-$root/target}/release/ringleader
fi
command -v python3 >/dev/null || { echo "bench-search.sh: needs python3" >&2; exit 1; }

# Trial processes run in their own process groups: one a node left behind (it was killed,
# not stopped) is found by its paths under $tmp and killed by PID.
local_nodes_setup rl-bench-search

# The HTTP API helper: python3, standard library only.
cat >"$tmp/api.py" <<'PYEOF'
import bisect, json, math, os, re, statistics, sys, time, urllib.request
sys.path.insert(0, os.environ["RINGLEADER_SCRIPTS"])
import cluster_api
from cluster_api import get, procs_under

def warn(msg):
    print(f"# warning: {msg}", file=sys.stderr, flush=True)

ENDED = ("succeeded", "failed", "cancelled")

def formed(n, deadline_s, apis):
    cluster_api.formed(n, deadline_s, apis, sys.exit)

def wait(api, job, deadline_s, out):
    deadline, doc = time.time() + deadline_s, None
    while True:
        try:
            doc = get(api, f"/v1/jobs/{job}")
            if doc["state"] in ENDED:
                break
        except Exception as e:
            print(f"# {job}: {e}", file=sys.stderr)
        if time.time() > deadline:
            if doc:
                states = {}
                for t in doc.get("trials", []):
                    states[t["state"]] = states.get(t["state"], 0) + 1
                json.dump(doc, open(out, "w"))
                sys.exit(f"search {job} not ended within {deadline_s} s: state={doc['state']} "
                         f"trials by state {states}; document in {out} (KEEP=1 keeps it)")
            sys.exit(f"search {job}: no document within {deadline_s} s")
        time.sleep(0.25)
    json.dump(doc, open(out, "w"))

def trial_jobs(api, doc):
    """Every trial's job document; warns about trials or jobs not in a final state."""
    if doc["state"] != "succeeded":
        warn(f"search {doc['id']} ended {doc['state']}: events {doc['events'][-5:]}")
    jobs = []
    for t in doc["trials"]:
        if t["state"] not in ("succeeded", "stopped", "failed"):
            warn(f"search {doc['id']}: trial {t['id']} left {t['state']} ({t})")
        j = get(api, f"/v1/jobs/{t['job']}")
        if j["state"] not in ENDED:
            warn(f"search {doc['id']}: trial {t['id']}'s job {t['job']} still {j['state']} "
                 f"after the search ended (ring {j['ring']}, started_at_ms {j['started_at_ms']})")
        jobs.append(j)
    return jobs

def settled(tmp, deadline_s, what):
    """Waits until no trial process (train-worker under tmp) runs; warns if some still do."""
    deadline = time.time() + deadline_s
    while True:
        left = [p for p in procs_under(tmp) if " train-worker " in p[1]]
        if not left:
            return
        if time.time() > deadline:
            warn(f"{what}: {len(left)} trial processes still running {deadline_s} s after the "
                 f"search ended: {left[:3]}")
            return
        time.sleep(0.2)

def pct(sorted_xs, p):
    return sorted_xs[max(0, math.ceil(p * len(sorted_xs)) - 1)]

def overhead(api, path, nodes, slots):
    doc = json.load(open(path))
    jobs = trial_jobs(api, doc)
    json.dump(jobs, open(path + ".jobs", "w"))  # the trial jobs' documents (KEEP=1 keeps them)
    n = len(doc["trials"])
    span_s = (doc["finished_at_ms"] - doc["submitted_at_ms"]) / 1000.0
    ms = sorted(j["finished_at_ms"] - j["started_at_ms"] for j in jobs
                if j.get("started_at_ms") is not None and j.get("finished_at_ms") is not None)
    if len(ms) != n:
        warn(f"{n - len(ms)} trial jobs without started_at_ms or finished_at_ms")
    by_state = {}
    for t in doc["trials"]:
        by_state[t["state"]] = by_state.get(t["state"], 0) + 1
    print(f"# overhead search {doc['id']}: state={doc['state']} trials by state {by_state}; "
          f"placed→first start {(min(j['started_at_ms'] for j in jobs) - doc['submitted_at_ms'])} ms, "
          f"trial jobs {len(jobs)}, max overhead {ms[-1]} ms", file=sys.stderr)
    print(f"search trials={n} trials_per_s={n / span_s:.1f} "
          f"overhead_ms_p50={statistics.median(ms):.0f} overhead_ms_p99={pct(ms, 0.99):.0f} "
          f"nodes={nodes} slots={slots}")

HOPS = ("decided", "placed", "seen", "spawned", "exited", "committed", "next")

def hops(path, logs):
    """Where a trial's time goes, from the trial jobs' records and the nodes' hop traces
    (RUST_LOG's ringleader::hops=debug): decided (the chief's pass, the job's placed event),
    placed (its start committed, the chief), seen (the node starts its rank), spawned,
    exited (the process and its pipes), committed (the node's report of the exit), next
    (the chief's first pass decided at or after that commit). One stderr line of each hop's
    p50 and p90 in ms."""
    jobs = json.load(open(path + ".jobs"))
    trial_job = {(j["trial_of"]["search"], j["trial_of"]["trial"]): j["id"] for j in jobs}
    at = {j["id"]: {} for j in jobs}
    for j in jobs:
        placed = [e["at_ms"] for e in j["events"] if e["what"] == "placed"]
        if placed:
            at[j["id"]]["decided"] = placed[0]
    pair = re.compile(r'(\w+)=("[^"]*"|\S+)')
    for log in logs:
        for line in open(log, errors="replace"):
            if "ringleader::hops" not in line:
                continue
            f = {k: v.strip('"') for k, v in pair.findall(line)}
            job = f.get("job") or trial_job.get((f.get("search"), int(f.get("trial", -1))))
            if job in at and "hop" in f:
                at[job].setdefault(f["hop"], int(f["at_ms"]))
    decided = sorted(t["decided"] for t in at.values() if "decided" in t)
    for t in at.values():
        if "committed" in t:
            i = bisect.bisect_left(decided, t["committed"])
            if i < len(decided):
                t["next"] = decided[i]
    parts = []
    for a, b in zip(HOPS, HOPS[1:]):
        xs = sorted(t[b] - t[a] for t in at.values() if a in t and b in t)
        if xs:
            parts.append(f"{a}→{b} {statistics.median(xs):.0f} ({pct(xs, 0.9)})")
        else:
            parts.append(f"{a}→{b} none")
    print(f"# hops ms p50 (p90): {' '.join(parts)}", file=sys.stderr)

def quality(api, path, algorithm, budget, max_epochs):
    doc = json.load(open(path))
    trial_jobs(api, doc)
    used = sum(t["resource"] for t in doc["trials"])
    if used > budget + max_epochs or used < budget - max_epochs:
        warn(f"{algorithm} trained {used} epochs, budget {budget}: set "
             f"{algorithm.upper()}_TRIALS (now {len(doc['trials'])})")
    best = doc.get("best")
    best_s = f"{best['metric']:.4f}" if best else "none"
    seconds = (doc["finished_at_ms"] - doc["submitted_at_ms"]) / 1000.0
    by_state = {}
    for t in doc["trials"]:
        by_state[t["state"]] = by_state.get(t["state"], 0) + 1
    print(f"# {algorithm} search {doc['id']}: state={doc['state']} trials by state {by_state}; "
          f"best {best}", file=sys.stderr)
    print(f"search algorithm={algorithm} budget_epochs={used} trials={len(doc['trials'])} "
          f"best={best_s} seconds={seconds:.1f}")

if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "formed":
        formed(int(args[0]), float(args[1]), args[2:])
    elif cmd == "wait":
        wait(args[0], args[1], float(args[2]), args[3])
    elif cmd == "overhead":
        overhead(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "hops":
        hops(args[0], args[1:])
    elif cmd == "quality":
        quality(args[0], args[1], args[2], int(args[3]), int(args[4]))
    elif cmd == "settled":
        settled(args[0], float(args[1]), args[2])
    elif cmd == "field":
        print(json.load(open(args[0]))[args[1]] if len(args) == 2 else
              json.load(open(args[0]))[args[1]][int(args[2])])
    else:
        sys.exit(f"unknown {cmd}")
PYEOF
api_py() { python3 "$tmp/api.py" "$@"; }

apis=()
# start_cluster NAME [node args…]: 3 nodes on 127.0.0.1 (ports the OS picks), formed with a
# chief; sets apis.
start_cluster() {
    local name=$1 i dir seed="" deadline
    shift
    apis=()
    # A keyed cluster (the default): one key for the three nodes, the first node's admin
    # token for the CLI and the API helper.
    mkdir -p "$tmp/$name"
    "$bin" keygen "$tmp/$name/cluster.key" 2>/dev/null
    export RINGLEADER_TOKEN_FILE=$tmp/$name/n0/api.token
    for i in 0 1 2; do
        dir=$tmp/$name/n$i
        mkdir -p "$dir"
        local join=()
        if [ -n "$seed" ]; then join=(--join "$seed"); fi
        "$bin" node --name "n$i" --listen 127.0.0.1:0 --api 127.0.0.1:0 --data 127.0.0.1:0 \
            --data-dir "$dir" --cluster-key "$tmp/$name/cluster.key" "${join[@]}" "$@" </dev/null >/dev/null 2>"$dir/node.log" &
        local pid=$!
        pids+=("$pid")
        deadline=$((SECONDS + 30))
        until [ -f "$dir/node.json" ] && [ "$(api_py field "$dir/node.json" pid 2>/dev/null)" = "$pid" ]; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "node n$i exited at start:" >&2; tail -5 "$dir/node.log" >&2; exit 1
            fi
            if [ "$SECONDS" -gt "$deadline" ]; then echo "node n$i did not start within 30 s" >&2; exit 1; fi
            sleep 0.1
        done
        apis+=("$(api_py field "$dir/node.json" api_addr)")
        if [ -z "$seed" ]; then seed=$(api_py field "$dir/node.json" p2p_addrs 0); fi
    done
    api_py formed 3 60 "${apis[@]}"
}

# submit FILE: prints the job id.
submit() {
    "$bin" --peer "${apis[0]}" submit "$1"
}

# ---- (a) scheduling overhead ----
if [[ " $parts " == *" overhead "* ]]; then
    cat >"$tmp/overhead.toml" <<EOF
name = "bench-overhead"
kind = "search"
# A trivial trial that reports its metric: without a report the search ends failed ("no
# trial reported accuracy"). Through sh -c, so the trial's arguments (--x VALUE) are sh's,
# not the line's.
command = ["sh", "-c", "echo ringleader-metric accuracy 0.5", "sh"]

[search]
trial = "command"
algorithm = "random"
trials = $trials
metric = "accuracy"
direction = "max"
seed = $seed

[[search.params]]
name = "x"
type = "double"
min = 0.0
max = 1.0
EOF
    if [ "$hops" = 1 ]; then
        export RUST_LOG=${RUST_LOG:-info,openraft=warn,openraft::replication=off,libp2p=warn},ringleader::hops=debug
    fi
    start_cluster overhead --cpus 16
    id=$(submit "$tmp/overhead.toml")
    api_py wait "${apis[1]}" "$id" "$wait_s" "$tmp/overhead.json"
    api_py overhead "${apis[1]}" "$tmp/overhead.json" 3 48
    stop_nodes
    if [ "$hops" = 1 ]; then
        api_py hops "$tmp/overhead.json" "$tmp"/overhead/n*/node.log
        unset RUST_LOG
    fi
fi

# ---- (b) quality per budget ----
# search_spec ALGORITHM TRIALS: the digits search (the template of examples/jobs/digits-asha.toml).
search_spec() {
    local alg=$1 n=$2
    cat <<EOF
name = "bench-$alg"
kind = "search"
workers = 1

[model]
arch = "mlp"
hidden = [64]

[data]
dataset = "digits"

[train]
epochs = $max_epochs
batch_per_worker = 32
optimizer = "sgd"
lr = 0.05
seed = 7

[checkpoint]
every_steps = 1000

[search]
algorithm = "$alg"
trials = $n
max_parallel = $max_parallel
metric = "val_accuracy"
direction = "max"
seed = $seed
resource = "epochs"
min_resource = 1
max_resource = $max_epochs
reduction_factor = 3

[[search.params]]
name = "train.lr"
type = "double"
min = 0.001
max = 1.0
scale = "log"

[[search.params]]
name = "model.hidden"
type = "categorical"
values = [[32], [64], [128, 64]]

[[search.params]]
name = "train.batch_per_worker"
type = "discrete"
values = [16, 32, 64]
EOF
}

full=$((budget / max_epochs))
# Trials that come closest to BUDGET=180 epochs (measured, see the header); scaled for others.
# ASHA: 76 trials trained 180 epochs (75: 179, 77: 183..189); Hyperband: 41 trained 181
# (40: 172, 42: 184, 44: 196).
if [ -z "$asha_trials" ]; then asha_trials=$(((budget * 76 + 90) / 180)); fi
if [ -z "$hyperband_trials" ]; then hyperband_trials=$(((budget * 41 + 90) / 180)); fi

if [[ " $parts " == *" quality "* ]]; then
    start_cluster quality
    for alg in $algorithms; do
        case $alg in
            asha) n=$asha_trials ;;
            hyperband) n=$hyperband_trials ;;
            tpe | random | grid) n=$full ;;
            *) echo "unknown algorithm $alg" >&2; exit 2 ;;
        esac
        search_spec "$alg" "$n" >"$tmp/$alg.toml"
        id=$(submit "$tmp/$alg.toml")
        api_py wait "${apis[1]}" "$id" "$wait_s" "$tmp/$alg.json"
        api_py quality "${apis[1]}" "$tmp/$alg.json" "$alg" "$budget" "$max_epochs"
        api_py settled "$tmp" 10 "$alg search $id"
    done
    stop_nodes
fi

# ---- (c) Optuna beside ours ----
if [[ " $parts " == *" optuna "* ]]; then
    if python3 -c "import optuna" 2>/dev/null; then
        search_spec tpe "$full" >"$tmp/optuna.toml"
        timeout "$wait_s" python3 scripts/baseline_search_optuna.py --spec "$tmp/optuna.toml" \
            --bin "$bin" --budget "$budget" --seed "$seed" --work-dir "$tmp/optuna"
    else
        echo "search impl=optuna skipped (pip install optuna)"
    fi
fi
