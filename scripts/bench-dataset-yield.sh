#!/usr/bin/env bash
# Dataset-yield benchmark: how much a dataset upload slows a running training job that shares
# the uploader's link, with and without the busy cap (`node --dataset-busy-mbps`).
#
# 3 hosts in network namespaces (scripts/netns.sh up 3 1gbit: every host 1 Gbit/s each way),
# one ringleader node each at 10.77.0.1..3 (p2p :7070, API :7071; h2 and h3 join h1):
#   h1  --cpus 2 --dataset-busy-mbps CAP   adds dataset "yield" (random bytes), its only holder
#   h2  --cpus 2
#   h3  --cpus 1                           fetches the dataset from h1
# A train job (digits MLP 64-1024-1024-10, 2 workers, cpus_per_worker = 2, batch 64 per
# worker, gradients sent dense: sufficient_factors = "never") can only be placed on h1 and h2
# (checked: its ring must be [h1, h2]). The ring's traffic h1 → h2 and the dataset upload
# h1 → h3 then share h1's 1 Gbit/s egress.
#
# Per run: once the job reports `samples_per_s` (and 2 s more), its latest value is read
# (`job --json`) every 0.5 s for YIELD_SAMPLE_S seconds and averaged (alone); then h3 runs
# `dataset get yield --json` and the metric is read the same way for as long as the fetch
# runs (during). Two runs, each on a fresh cluster: CAP = 0 (no cap) and CAP = YIELD_CAP_MBPS.
# One line each:
#
#   dataset yield cap_mb_per_s=0 job_samples_per_s_alone=… job_samples_per_s_during_fetch=… slowdown=… fetch_mb_per_s=…
#
# Units: job_samples_per_s_* are training samples per second over the whole ring (the
# trainer's `samples_per_s` metric: batch × workers / step time, rank 0's latest step when
# read); slowdown = during / alone (1.0: no effect, lower: slower); fetch_mb_per_s and
# cap_mb_per_s are MB/s of 10^6 bytes (as `dataset get --json` and --dataset-busy-mbps).
# The dataset is YIELD_DATASET_MB MiB (2^20 bytes). On stderr (`# …`): how many samples each
# average has, the ring's own rate from the step counter and its collective bytes per second
# (how much of the link the ring uses), and a warning when a fetch is too short to sample
# or the machine has fewer than 8 cpus (the job is then cpu-bound and a fetch's own cpu use
# slows it, whatever the link does).
#
# The nodes run with a private /dev/shm each (a tmpfs in a mount namespace of their own):
# the namespaces otherwise share /dev/shm and the collective would move the ring's gradients
# through shared memory, past the link this benchmark is about.
#
# Environment:
#   RINGLEADER        a prebuilt binary: skips `cargo build --release --workspace`
#                     (default binary: target/release/ringleader)
#   YIELD_DATASET_MB  dataset size in MiB (256); a fetch shorter than ~2 s gives few samples
#   YIELD_CAP_MBPS    h1's --dataset-busy-mbps in the second run (50)
#   YIELD_SAMPLE_S    seconds of sampling the job alone (8)
#   WAIT_S            deadline of each wait (cluster formed, holder seen, job reporting) and
#                     the limit of each fetch, in seconds (120)
#   KEEP=1            keep the work directory (node logs, job specs, data) under /tmp; without
#                     it the logs are kept only on failure (the data file is removed)
#
# Needs root (namespaces, tmpfs mounts), python3 (standard library), unshare (util-linux).
# Refuses to run while rl* namespaces have processes in them (someone else's cluster). Every
# process it starts is killed by PID on exit and the namespaces are removed (netns.sh down).
# Both runs together take about 40 s (2 cpus, debug binary, 256 MiB; 30 s with 64 MiB).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
NETNS="$here/netns.sh"

size_mib=${YIELD_DATASET_MB:-256}
cap_mbps=${YIELD_CAP_MBPS:-50}
sample_s=${YIELD_SAMPLE_S:-8}
wait_s=${WAIT_S:-120}
readonly HOSTS=3 HOLDER=1 FETCHER=3 RATE=1gbit
readonly PREFIX=10.77.0 P2P_PORT=7070 API_PORT=7071
readonly POLL_S=0.2 SAMPLE_EVERY_S=0.5
readonly WORKERS=2 BATCH_PER_WORKER=64
# Seconds the job trains after its first report before the sampling starts (start-up).
readonly WARMUP_S=2
# Fewer samples than this during a fetch make its average a guess.
readonly MIN_DURING_SAMPLES=3
# Below this many cpus the two ranks, the three nodes and the fetch's hashing compete for
# cores, and a slowdown measures that as much as the shared link.
readonly CPUS_MIN=8
readonly DATASET=yield

prog=bench-dataset-yield
die() { echo "$prog: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
warn() { echo "# warning: $*" >&2; }

case "${1:-}" in
    "") ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
    *) die "no arguments (settings are environment variables; see --help)" ;;
esac
[[ $size_mib =~ ^[1-9][0-9]*$ ]] || die "YIELD_DATASET_MB must be a positive integer (got '$size_mib')"
[[ $cap_mbps =~ ^[1-9][0-9]*$ ]] || die "YIELD_CAP_MBPS must be a positive integer (got '$cap_mbps')"
[[ $sample_s =~ ^[1-9][0-9]*$ ]] || die "YIELD_SAMPLE_S must be a positive integer (got '$sample_s')"
[[ $wait_s =~ ^[1-9][0-9]*$ ]] || die "bad WAIT_S '$wait_s'"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
command -v python3 >/dev/null || die "needs python3"
command -v unshare >/dev/null || die "needs unshare (util-linux)"

# Someone else's emulated cluster: `netns.sh up` would reshape it and `down` would end it.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^rl[0-9]+$' || true); do
    if [ -n "$(ip netns pids "$ns" 2>/dev/null)" ]; then
        die "namespace $ns has processes in it (another benchmark or test?); not touching it"
    fi
done

if [ -n "${RINGLEADER:-}" ]; then
    bin=$RINGLEADER
else
    (cd "$root" && cargo build --release --workspace) >&2
    bin=${CARGO_TARGET_DIR:-$root/target}/release/ringleader
fi
[ -x "$bin" ] || die "no ringleader binary at $bin"
cpus=$(nproc)
if [ "$cpus" -lt "$CPUS_MIN" ]; then
    warn "$cpus cpus here (fewer than $CPUS_MIN): the job and the fetch also compete for cpus, so a slowdown is not the link's alone"
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

work=$(mktemp -d /tmp/rl-bench-dataset-yield.XXXXXX)
pids=()
netns_up=0
ok=0
kill_pids() { # PID... : TERM, up to 5 s, then KILL; reaps them
    local p i
    for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "$@"; do
        for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}
cleanup() {
    local rc=$?
    [ "${#pids[@]}" -eq 0 ] || kill_pids "${pids[@]}"
    pids=()
    if [ "$netns_up" = 1 ]; then "$NETNS" down >/dev/null 2>&1 || true; fi
    if [ "${KEEP:-0}" = 1 ]; then
        note "kept $work"
    elif [ "$ok" = 1 ]; then
        rm -rf "$work"
    else
        # Keep the logs, not the data.
        rm -rf "$work/data" "$work"/cap*/h?/
        echo "$prog: failed (exit $rc); logs: $work/cap*/*.log" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

addr() { echo "$PREFIX.$1"; }
api() { echo "$(addr "$1"):$API_PORT"; }
rl() { # HOST ARGS... : the CLI against node HOST's API
    local h=$1
    shift
    "$bin" --peer "$(api "$h")" "$@"
}

# ---- data (shared by both runs) ----
mkdir -p "$work/data"
size_bytes=$((size_mib * 1048576))
head -c "$size_bytes" /dev/urandom >"$work/data/$DATASET.bin"

cat >"$work/job.toml" <<EOF
# Communication-heavy on purpose: 1.1 M parameters, gradients dense (no factors).
name = "yield"
kind = "train"
workers = $WORKERS

[resources]
cpus_per_worker = 2

[model]
arch = "mlp"
hidden = [1024, 1024]

[data]
dataset = "digits"

[train]
epochs = 10000
batch_per_worker = $BATCH_PER_WORKER
optimizer = "sgd"
lr = 0.01
warmup_epochs = 0
sufficient_factors = "never"
EOF

# JSON helper, reading a document on stdin:
#   check formed N           status: N members alive
#   check holders NAME H,..  dataset ls: NAME held by (at least) these members
#   check running RING       job: running, ring = RING (comma-separated), samples_per_s known
#   fetch BYTES              dataset get: "<mb_per_s> <elapsed_s> <sources>" (10^6 B/s)
# Exit 0 when the condition holds, else 1 with the reason on stdout.
cat >"$work/check.py" <<'PYEOF'
import json, sys

def last_object(text):
    """The last JSON object of the text (progress lines may come before it)."""
    text = text.rstrip()
    dec = json.JSONDecoder()
    for i in reversed([i for i, c in enumerate(text) if c == "{"]):
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            continue
        if isinstance(obj, dict) and not text[end:].strip():
            return obj
    sys.exit("no JSON object at the end of the output")

what = sys.argv[1]
text = sys.stdin.read()
if what == "fetch":
    doc = last_object(text)
    nbytes, ms = int(doc["bytes"]), float(doc["elapsed_ms"])
    if nbytes != int(sys.argv[2]):
        print(f"# warning: fetched {nbytes} bytes, the dataset has {sys.argv[2]}", file=sys.stderr)
    if ms <= 0:
        sys.exit(f"elapsed_ms={ms}")
    sources = ",".join(s["name"] for s in doc.get("sources", [])) or "-"
    print(f"{nbytes / 1e6 / (ms / 1000):.2f} {ms / 1000:.3f} {sources}")
    sys.exit(0)
doc = json.loads(text)
if what == "formed":
    alive = sorted(m["name"] for m in doc["members"] if m.get("state", "alive") == "alive")
    if len(alive) != int(sys.argv[2]):
        print(f"alive={alive}")
        sys.exit(1)
elif what == "holders":
    name, want = sys.argv[2], set(sys.argv[3].split(","))
    ds = [d for d in doc if d["name"] == name]
    have = set(ds[0]["holders"]) if ds else set()
    if not want <= have:
        print(f"{name} holders={sorted(have)} want {sorted(want)}")
        sys.exit(1)
elif what == "running":
    want = sys.argv[2].split(",")
    state, ring, m = doc["state"], doc.get("ring", []), doc.get("metrics", {})
    if state != "running" or "samples_per_s" not in m:
        print(f"state={state} ring={ring} metrics={sorted(m)} pending={doc.get('pending_reason')}")
        sys.exit(1)
    if ring != want:
        print(f"ring={ring}, want {want}: the benchmark needs the ring on h1 and h2")
        sys.exit(2)
PYEOF

# summary.py SAMPLES_FILE : mean samples_per_s over the samples ("t state sps step bytes"
# lines), the sample count, and from the first and last samples the ring's rate by its step
# counter (samples/s) and its collective bytes per second (10^6 B/s); "-" where unknown.
cat >"$work/summary.py" <<'PYEOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r[1] == "running" and r[2] != "-"]
if not rows:
    print("- 0 - -")
    sys.exit(0)
sps = [float(r[2]) for r in rows]
mean = sum(sps) / len(sps)
by_step = by_bytes = "-"
(t0, s0, b0), (t1, s1, b1) = ((r[0], r[3], r[4]) for r in (rows[0], rows[-1]))
dt = float(t1) - float(t0)
if dt > 0 and s0 != "-" and s1 != "-" and float(s1) > float(s0):
    by_step = f"{(float(s1) - float(s0)) * float(sys.argv[2]) / dt:.1f}"
if dt > 0 and b0 != "-" and b1 != "-" and float(b1) > float(b0):
    by_bytes = f"{(float(b1) - float(b0)) / 1e6 / dt:.1f}"
print(f"{mean:.1f} {len(sps)} {by_step} {by_bytes}")
PYEOF

# sampler.py FILE SECONDS PID INTERVAL CMD... : runs CMD (a `job --json`) every INTERVAL s on
# a fixed clock and appends "t state samples_per_s step collective_bytes" (t: Unix seconds)
# to FILE; for SECONDS, or while PID (not 0) runs. One process for the whole window, so
# that the reads come every INTERVAL even on a loaded machine.
cat >"$work/sampler.py" <<'PYEOF'
import json, os, subprocess, sys, time
path, secs, pid, every = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cmd = sys.argv[5:]

def alive(p):
    try:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

start = time.monotonic()
n = 0
with open(path, "a") as out:
    while (alive(pid) if pid else time.monotonic() - start < secs):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0:
            try:
                doc = json.loads(r.stdout)
                m = doc.get("metrics", {})
                vals = [m.get(k) for k in ("samples_per_s", "step", "collective_bytes")]
                out.write(" ".join([f"{time.time():.3f}", doc["state"],
                                    *("-" if v is None else repr(float(v)) for v in vals)]) + "\n")
                out.flush()
            except (ValueError, KeyError):
                pass
        n += 1
        time.sleep(max(0.0, start + n * every - time.monotonic()))
PYEOF

node_pids=()
run_dir=""

# wait_for WHAT HOST ARGS... : polls node HOST until check.py WHAT ARGS holds, or WAIT_S.
wait_for() {
    local what=$1 host=$2 deadline=$((SECONDS + wait_s)) last="" out p rc
    local -a cmd
    shift 2
    case "$what" in
        formed) cmd=(status --json) ;;
        holders) cmd=(dataset ls --json) ;;
        running) cmd=(job "$job_id" --json) ;;
        *) die "wait_for: unknown condition $what" ;;
    esac
    while :; do
        if out=$(rl "$host" "${cmd[@]}" 2>&1); then
            rc=0
            last=$(python3 "$work/check.py" "$what" "$@" <<<"$out" 2>&1) || rc=$?
            [ "$rc" = 0 ] && return 0
            [ "$rc" = 2 ] && die "h$host: $last"
        else
            last=$out
        fi
        [ "$SECONDS" -lt "$deadline" ] || die "h$host: $what $* not reached within $wait_s s; last: $last"
        # A node that exited will never answer.
        for p in "${node_pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a node exited; see $run_dir/h*.log"; done
        sleep "$POLL_S"
    done
}

# sample_job FILE SECONDS [PID] : appends "t state samples_per_s step collective_bytes"
# lines to FILE, one read of `job --json` every SAMPLE_EVERY_S, for SECONDS, or (with PID)
# for as long as PID runs.
sample_job() {
    python3 "$work/sampler.py" "$1" "$2" "${3:-0}" "$SAMPLE_EVERY_S" \
        "$bin" --peer "$(api "$HOLDER")" job "$job_id" --json
}

# run_cap CAP : one fresh cluster with h1 --dataset-busy-mbps CAP; prints the result line.
job_id=""
run_cap() {
    local cap=$1 i t0 fetch_pid fetch_rc alone during
    local -a join extra
    run_dir="$work/cap$cap"
    # A keyed cluster (the default): one key for every run, h1's admin token for the CLI.
    [ -f "$work/cluster.key" ] || "$bin" keygen "$work/cluster.key" 2>/dev/null
    export RINGLEADER_TOKEN_FILE=$run_dir/h1/api.token
    mkdir -p "$run_dir"

    "$NETNS" up "$HOSTS" "$RATE" >"$run_dir/netns.log" 2>&1 ||
        { cat "$run_dir/netns.log" >&2; die "netns.sh up $HOSTS $RATE failed"; }
    netns_up=1

    node_pids=()
    for i in $(seq 1 "$HOSTS"); do
        join=()
        [ "$i" = 1 ] || join=(--join "$(addr 1):$P2P_PORT")
        case "$i" in
            1) extra=(--cpus 2 --dataset-busy-mbps "$cap") ;;
            2) extra=(--cpus 2) ;;
            *) extra=(--cpus 1) ;;
        esac
        # A private /dev/shm per host (see the header): unshare's mount namespace, a tmpfs on
        # /dev/shm in it, then exec the node, so $! is the node's own PID.
        ip netns exec "rl$i" unshare --mount --propagation private \
            sh -c 'mount -t tmpfs -o mode=1777,size=256m tmpfs /dev/shm && exec "$@"' sh \
            "$bin" node --name "h$i" --listen "$(addr "$i"):$P2P_PORT" --api "$(api "$i")" \
            --data-dir "$run_dir/h$i" --cluster-key "$work/cluster.key" "${join[@]}" "${extra[@]}" >"$run_dir/h$i.log" 2>&1 &
        pids+=($!)
        node_pids+=($!)
    done

    t0=$SECONDS
    for i in $(seq 1 "$HOSTS"); do wait_for formed "$i" "$HOSTS"; done
    note "cap=$cap: cluster of $HOSTS formed in $((SECONDS - t0)) s"

    rl "$HOLDER" dataset add "$DATASET" "$work/data" >"$run_dir/add.log" 2>&1 ||
        { cat "$run_dir/add.log" >&2; die "dataset add $DATASET failed"; }
    wait_for holders "$FETCHER" "$DATASET" "h$HOLDER"

    t0=$SECONDS
    job_id=$(rl "$HOLDER" submit "$work/job.toml" 2>"$run_dir/submit.log") ||
        { cat "$run_dir/submit.log" >&2; die "submit failed"; }
    job_id=$(echo "$job_id" | tail -1 | awk '{print $NF}')
    [ -n "$job_id" ] || die "submit printed no job id"
    wait_for running "$HOLDER" "h1,h2"
    note "cap=$cap: job $job_id running on h1,h2, reporting after $((SECONDS - t0)) s"

    sleep "$WARMUP_S"
    sample_job "$run_dir/alone.samples" "$sample_s"
    read -r alone n_alone step_alone bytes_alone < <(python3 "$work/summary.py" "$run_dir/alone.samples" $((WORKERS * BATCH_PER_WORKER)))
    [ "$alone" != - ] || die "no samples_per_s while sampling the job alone ($run_dir/alone.samples)"

    timeout "$wait_s" "$bin" --peer "$(api "$FETCHER")" dataset get "$DATASET" --json \
        >"$run_dir/get.out" 2>"$run_dir/get.log" &
    fetch_pid=$!
    pids+=("$fetch_pid")
    sample_job "$run_dir/during.samples" 0 "$fetch_pid"
    fetch_rc=0
    wait "$fetch_pid" || fetch_rc=$?
    [ "$fetch_rc" = 0 ] || { tail -20 "$run_dir/get.log" >&2; die "dataset get $DATASET on h$FETCHER failed (exit $fetch_rc)"; }
    read -r fetch_mbps fetch_s fetch_sources < <(python3 "$work/check.py" fetch "$size_bytes" <"$run_dir/get.out") ||
        die "could not read the result of dataset get ($run_dir/get.out)"
    read -r during n_during step_during bytes_during < <(python3 "$work/summary.py" "$run_dir/during.samples" $((WORKERS * BATCH_PER_WORKER)))
    [ "$during" != - ] || die "no samples_per_s during the fetch ($fetch_s s; raise YIELD_DATASET_MB)"

    note "cap=$cap: alone $n_alone samples (by step counter $step_alone samples/s, ring sends $bytes_alone MB/s); during $n_during samples over a ${fetch_s} s fetch from $fetch_sources (by step counter $step_during samples/s, ring sends $bytes_during MB/s)"
    if [ "$n_during" -lt "$MIN_DURING_SAMPLES" ]; then
        warn "cap=$cap: only $n_during sample(s) during the fetch; raise YIELD_DATASET_MB for a steadier figure"
    fi
    local slowdown
    slowdown=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.3f}")' "$during" "$alone")
    echo "dataset yield cap_mb_per_s=$cap job_samples_per_s_alone=$alone job_samples_per_s_during_fetch=$during slowdown=$slowdown fetch_mb_per_s=$fetch_mbps"

    rl "$HOLDER" cancel "$job_id" >"$run_dir/cancel.log" 2>&1 || warn "cancel $job_id failed (the nodes are stopped anyway)"
    kill_pids "${node_pids[@]}"
    local -a rest=()
    for p in "${pids[@]}"; do
        case " ${node_pids[*]} $fetch_pid " in *" $p "*) ;; *) rest+=("$p") ;; esac
    done
    pids=("${rest[@]}")
    node_pids=()
    "$NETNS" down >>"$run_dir/netns.log" 2>&1 || die "netns.sh down failed"
    netns_up=0
    rm -rf "$run_dir"/h?/
}

run_cap 0
run_cap "$cap_mbps"
ok=1
