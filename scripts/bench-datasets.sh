#!/usr/bin/env bash
# Dataset-transfer benchmark: a multi-source fetch beside iperf3 from the same holders.
#
# 4 hosts in network namespaces (scripts/netns.sh up 4, unlimited), one ringleader node each
# (h1..h4 in rl1..rl4 at 10.77.0.1..4). h1 adds dataset "bench" (one file of random bytes);
# h2 and h3 fetch it while the links are still unlimited, so h1, h2 and h3 hold it. h1 also
# adds "bench1" (another random file), which nobody else fetches: h1 is its only holder, and
# "bench2" (a third), which h2 and h3 fetch too. Then the holders' egress (upload) is capped
# at HOLDER_RATE (300mbit), the receiver h4 stays unlimited, and h4 fetches:
#
#   dataset sources=3 size_mb=512 mb_per_s=… iperf_mb_per_s=… ratio=…   (target ratio >= 0.90)
#   dataset sources=1 size_mb=512 mb_per_s=… iperf_mb_per_s=… ratio=…   (target ratio >= 0.95)
#   dataset sources=3 size_mb=512 to=dir mb_per_s=… iperf_mb_per_s=… ratio=…   (target >= 0.90)
#
# mb_per_s = bytes / elapsed of `ringleader dataset get NAME --json` on h4 (the figures its
# own JSON reports). The `to=dir` line is end to end, as a notebook sees it: bench2's size
# over the wall time of `ringleader dataset get bench2 --to DIR` on h4, from the command's
# start until it returns with the files in place under DIR (checked byte for byte with
# `cmp` afterwards, outside the time). iperf_mb_per_s: right after each fetch, in the same run and on the same
# capped links, one iperf3 client per holder (rl1..rl3, or rl1 alone) sends at once to its own
# iperf3 server on the receiver (rl4, port 520I for holder I) for about the fetch's duration
# (whole seconds, at least 2); the sum of their goodputs (end.sum_received). ratio = mb_per_s /
# iperf_mb_per_s. A ratio under its target is reported on stderr as `# warning: …`. After
# each fetch, the receiving node's CPU (utime + stime of its process over the fetch) on
# stderr: `# receiver cpu TAG: cpu_s=… cpu_ms_per_mb=…`.
#
# Disk space: each source file is deleted once added (bench2's is kept for the check), and
# each dataset is removed (`dataset rm`, so every holder deletes it) once measured; at
# 512 MiB a run needs about 5 GiB free under /tmp at its peak.
#
# Units: MB here is MiB = 2^20 bytes, everywhere (size_mb, mb_per_s, iperf_mb_per_s; iperf3's
# own "MBytes" are the same unit). The dataset files are exactly BENCH_DATASET_MB MiB.
#
# Environment:
#   BENCH_DATASET_MB   size of each dataset in MiB (512); e.g. 32 for a quick run
#   BENCH_CHUNK_MIB    chunk size of the datasets, 1..4 MiB (default: `dataset add`'s choice,
#                      1 MiB for datasets up to 64 GiB)
#   HOLDER_RATE        holders' egress cap, a tc rate (300mbit)
#   RINGLEADER         a prebuilt binary: skips `cargo build --release --workspace`
#                      (default binary: target/release/ringleader)
#   WAIT_S             deadline of each wait (cluster formed, holders seen) in seconds (120)
#   FETCH_TIMEOUT_S    limit of each `dataset get` (600)
#   BENCH_IPERF_ONLY=1 no ringleader at all: the namespaces, caps and iperf3 parts only, with
#                      durations estimated from the size and the caps; prints
#                      `dataset sources=N size_mb=… iperf_mb_per_s=…`
#   KEEP=1             keep the work directory (node logs, data) under /tmp; without it the
#                      logs are kept only on failure (the data files are removed)
#
# Needs root (namespaces), iperf3, python3 (standard library). Refuses to run while rl*
# namespaces have processes in them (someone else's cluster). Every process it starts is
# killed by PID on exit and the namespaces are removed (scripts/netns.sh down).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
NETNS="$here/netns.sh"

size_mib=${BENCH_DATASET_MB:-512}
chunk_args=()
if [ -n "${BENCH_CHUNK_MIB:-}" ]; then chunk_args=(--chunk-mib "$BENCH_CHUNK_MIB"); fi
holder_rate=${HOLDER_RATE:-300mbit}
wait_s=${WAIT_S:-120}
fetch_timeout_s=${FETCH_TIMEOUT_S:-600}
iperf_only=${BENCH_IPERF_ONLY:-0}
readonly HOSTS=4 RECEIVER=4 HOLDERS=3
readonly PREFIX=10.77.0 P2P_PORT=7070 API_PORT=7071 IPERF_PORT_BASE=5200
readonly POLL_S=0.2
readonly TARGET_RATIO_MULTI=0.90 TARGET_RATIO_SINGLE=0.95

prog=bench-datasets
die() { echo "$prog: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
warn() { echo "# warning: $*" >&2; }

case "${1:-}" in
    "") ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
    *) die "no arguments (settings are environment variables; see --help)" ;;
esac
[[ $size_mib =~ ^[1-9][0-9]*$ ]] || die "BENCH_DATASET_MB must be a positive integer (got '$size_mib')"
[[ $wait_s =~ ^[1-9][0-9]*$ ]] || die "bad WAIT_S '$wait_s'"
[[ $fetch_timeout_s =~ ^[1-9][0-9]*$ ]] || die "bad FETCH_TIMEOUT_S '$fetch_timeout_s'"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
command -v iperf3 >/dev/null || die "needs iperf3 (apt-get install -y iperf3)"
command -v python3 >/dev/null || die "needs python3"
command -v ss >/dev/null || die "needs ss (iproute2)"

# Someone else's emulated cluster: `netns.sh up` would reshape it and `down` would end it.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^rl[0-9]+$' || true); do
    if [ -n "$(ip netns pids "$ns" 2>/dev/null)" ]; then
        die "namespace $ns has processes in it (another benchmark or test?); not touching it"
    fi
done

size_bytes=$((size_mib * 1048576))
holder_bps=$(python3 - "$holder_rate" <<'PYEOF'
import re, sys
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmgt]?i?)(bit|bps)", sys.argv[1].lower())
if not m:
    sys.exit(1)
mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
        "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}[m[2]]
print(int(float(m[1]) * mult * (8 if m[3] == "bps" else 1)))
PYEOF
) || die "bad HOLDER_RATE '$holder_rate' (examples: 300mbit, 1gbit)"

if [ "$iperf_only" != 1 ]; then
    if [ -n "${RINGLEADER:-}" ]; then
        bin=$RINGLEADER
    else
        (cd "$root" && cargo build --release --workspace) >&2
        bin=${CARGO_TARGET_DIR:-$root/target}/release/ringleader
    fi
    [ -x "$bin" ] || die "no ringleader binary at $bin"
fi

work=$(mktemp -d /tmp/rl-bench-datasets.XXXXXX)
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
        # Keep the logs, not the hundreds of MiB of data.
        rm -rf "$work/data" "$work/data1" "$work/data2" "$work"/to-* "$work"/h?/
        echo "$prog: failed (exit $rc); node and iperf3 logs: $work/*.log" >&2
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

# Polls `ss` in host $1 until TCP port $2 listens, or the deadline.
wait_listen() {
    local host=$1 port=$2 deadline=$((SECONDS + 10))
    until ip netns exec "rl$host" ss -Hltn "sport = :$port" | grep -q .; do
        [ "$SECONDS" -lt "$deadline" ] || die "nothing listening on rl$host:$port after 10 s"
        sleep "$POLL_S"
    done
}

# Whole seconds of iperf3 for a transfer that took $1 seconds (at least 2).
iperf_seconds() { python3 -c 'import math, sys; print(max(2, math.ceil(float(sys.argv[1]))))' "$1"; }

# iperf_run TAG SECONDS HOLDER... : one iperf3 client per holder, all at once, to the
# receiver; sets iperf_mibps to the sum of their goodputs in MiB/s (per-holder figures on
# stderr). Not called in a subshell, so that every PID lands in pids for the teardown.
iperf_mibps=""
iperf_run() {
    local tag=$1 secs=$2 h p
    shift 2
    local -a servers=() clients=()
    for h in "$@"; do
        p=$((IPERF_PORT_BASE + h))
        ip netns exec "rl$RECEIVER" iperf3 -s -1 -B "$(addr "$RECEIVER")" -p "$p" \
            >"$work/iperf-$tag-s$h.log" 2>&1 &
        servers+=($!)
        pids+=($!)
    done
    for h in "$@"; do wait_listen "$RECEIVER" $((IPERF_PORT_BASE + h)); done
    for h in "$@"; do
        p=$((IPERF_PORT_BASE + h))
        ip netns exec "rl$h" timeout $((secs + 30)) iperf3 -c "$(addr "$RECEIVER")" -p "$p" \
            -t "$secs" -J >"$work/iperf-$tag-c$h.json" 2>"$work/iperf-$tag-c$h.log" &
        clients+=($!)
        pids+=($!)
    done
    local failed=0
    for p in "${clients[@]}"; do wait "$p" || failed=1; done
    kill_pids "${servers[@]}"
    [ "$failed" = 0 ] || die "an iperf3 client failed ($work/iperf-$tag-c*.json)"
    iperf_mibps=$(python3 - "$work/iperf-$tag-c" "$@" <<'PYEOF'
import json, sys
prefix, hosts = sys.argv[1], sys.argv[2:]
total, parts = 0.0, []
for h in hosts:
    with open(f"{prefix}{h}.json") as f:
        doc = json.load(f)
    bps = doc["end"]["sum_received"]["bits_per_second"]
    total += bps
    parts.append(f"rl{h}={bps / 8 / 2**20:.2f}")
print(f"# iperf3 {len(hosts)} stream(s), MiB/s: {' '.join(parts)}", file=sys.stderr)
print(f"{total / 8 / 2**20:.2f}")
PYEOF
    ) || die "could not read the iperf3 results ($work/iperf-$tag-c*.json)"
}

# ---- namespaces ----
"$NETNS" up "$HOSTS" >"$work/netns.log" 2>&1 || { cat "$work/netns.log" >&2; die "netns.sh up $HOSTS failed"; }
netns_up=1

cap_holders() {
    local h
    for h in $(seq 1 "$HOLDERS"); do
        "$NETNS" rate "$h" "$holder_rate" --egress >>"$work/netns.log" 2>&1 ||
            { cat "$work/netns.log" >&2; die "netns.sh rate $h $holder_rate --egress failed"; }
    done
    note "holders rl1..rl$HOLDERS egress capped at $holder_rate; receiver rl$RECEIVER unlimited"
}

# ---- iperf3 only ----
if [ "$iperf_only" = 1 ]; then
    cap_holders
    for n in "$HOLDERS" 1; do
        est=$(python3 -c 'import sys; print(int(sys.argv[1]) * 8 / (int(sys.argv[2]) * int(sys.argv[3])))' \
            "$size_bytes" "$n" "$holder_bps")
        secs=$(iperf_seconds "$est")
        # shellcheck disable=SC2046 # the holder list is split on purpose
        iperf_run "only$n" "$secs" $(seq 1 "$n")
        note "sources=$n iperf3 for $secs s (a fetch at the caps' rate would take about ${est%.*} s)"
        echo "dataset sources=$n size_mb=$size_mib iperf_mb_per_s=$iperf_mibps"
    done
    ok=1
    exit 0
fi

# ---- data ----
mkdir -p "$work/data" "$work/data1"
head -c "$size_bytes" /dev/urandom >"$work/data/bench.bin"
head -c "$size_bytes" /dev/urandom >"$work/data1/bench1.bin"
mkdir -p "$work/data2"
head -c "$size_bytes" /dev/urandom >"$work/data2/bench2.bin"

# ---- nodes ----
# A keyed cluster (the default): one key for every host, h1's admin token for the CLI.
"$bin" keygen "$work/cluster.key" 2>/dev/null
export RINGLEADER_TOKEN_FILE=$work/h1/api.token
node_pids=()
for i in $(seq 1 "$HOSTS"); do
    join=()
    [ "$i" = 1 ] || join=(--join "$(addr 1):$P2P_PORT")
    # Not the CLI's RINGLEADER_TOKEN_FILE: a node reads it as its own --token-file (the
    # flag is global), and h1's token does not exist until h1 has started.
    ip netns exec "rl$i" env -u RINGLEADER_TOKEN_FILE "$bin" node --name "h$i" --listen "$(addr "$i"):$P2P_PORT" \
        --api "$(api "$i")" --data-dir "$work/h$i" --cluster-key "$work/cluster.key" "${join[@]}" >"$work/h$i.log" 2>&1 &
    pids+=($!)
    node_pids+=($!)
done

# JSON helper: `check formed N` reads a status document, `check holders NAME H1,H2` a
# `dataset ls --json` array; exit 0 when the condition holds, else 1 with the reason on stdout.
cat >"$work/check.py" <<'PYEOF'
import json, sys
what, doc = sys.argv[1], json.load(sys.stdin)
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
PYEOF

# wait_for WHAT HOST ARGS... : polls node HOST until check.py WHAT ARGS holds, or WAIT_S.
wait_for() {
    local what=$1 host=$2 deadline=$((SECONDS + wait_s)) last="" out p
    local -a cmd
    shift 2
    if [ "$what" = formed ]; then cmd=(status --json); else cmd=(dataset ls --json); fi
    while :; do
        if out=$(rl "$host" "${cmd[@]}" 2>&1); then
            last=$(python3 "$work/check.py" "$what" "$@" <<<"$out" 2>&1) && return 0
        else
            last=$out
        fi
        [ "$SECONDS" -lt "$deadline" ] || die "h$host: $what $* not reached within $wait_s s; last: $last"
        # A node that exited will never answer.
        for p in "${node_pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a node exited; see $work/h*.log"; done
        sleep "$POLL_S"
    done
}

t0=$SECONDS
for i in $(seq 1 "$HOSTS"); do wait_for formed "$i" "$HOSTS"; done
note "cluster of $HOSTS formed in $((SECONDS - t0)) s"

# ---- seeding (links unlimited) ----
rl 1 dataset add "${chunk_args[@]}" bench "$work/data" >"$work/add-bench.log" 2>&1 || { cat "$work/add-bench.log" >&2; die "dataset add bench failed"; }
rl 1 dataset add "${chunk_args[@]}" bench1 "$work/data1" >"$work/add-bench1.log" 2>&1 || { cat "$work/add-bench1.log" >&2; die "dataset add bench1 failed"; }
rl 1 dataset add "${chunk_args[@]}" bench2 "$work/data2" >"$work/add-bench2.log" 2>&1 || { cat "$work/add-bench2.log" >&2; die "dataset add bench2 failed"; }
# The store holds what was added: the sources of the first two go (disk space; bench2's stays
# for the `--to` check).
rm -f "$work/data/bench.bin" "$work/data1/bench1.bin"
for name in bench bench2; do
    for i in 2 3; do
        wait_for holders "$i" "$name" h1
        timeout "$fetch_timeout_s" "$bin" --peer "$(api "$i")" dataset get "$name" >"$work/seed-$name-h$i.log" 2>&1 ||
            { tail -20 "$work/seed-$name-h$i.log" >&2; die "seeding: dataset get $name on h$i failed"; }
    done
    wait_for holders "$RECEIVER" "$name" h1,h2,h3
done
wait_for holders "$RECEIVER" bench1 h1
note "bench and bench2 held by h1,h2,h3 and bench1 by h1, as seen from h$RECEIVER"

cap_holders

# cpu_ticks PID : the process's user + system CPU time so far, in clock ticks.
cpu_ticks() {
    # The fields after the command's ")" (which may hold spaces): utime and stime are the
    # 12th and 13th of them.
    local stat rest
    local -a f
    stat=$(<"/proc/$1/stat")
    rest=${stat##*) }
    read -r -a f <<<"$rest"
    echo $((f[11] + f[12]))
}
# receiver_cpu TICKS_BEFORE TAG : the receiving node's CPU over the transfer, per MiB, on
# stderr (`# receiver cpu …`): the work of taking the bytes in and writing them, which the
# link's rate does not show on an idle host but does on a busy one.
receiver_cpu() {
    local used=$(($(cpu_ticks "${node_pids[$((RECEIVER - 1))]}") - $1))
    note "receiver cpu $2: $(python3 -c 'import sys; t, hz, mib = map(float, sys.argv[1:]); print(f"cpu_s={t / hz:.2f} cpu_ms_per_mb={1000 * t / hz / mib:.2f}")' "$used" "$(getconf CLK_TCK)" "$size_mib")"
}

# fetch NAME TAG : the measured fetch on the receiver; sets fetch_result to
# "bytes elapsed_s mib_per_s".
fetch_result=""
fetch() {
    local name=$1 tag=$2 ticks
    ticks=$(cpu_ticks "${node_pids[$((RECEIVER - 1))]}")
    timeout "$fetch_timeout_s" "$bin" --peer "$(api "$RECEIVER")" dataset get "$name" --json \
        >"$work/get-$tag.out" 2>"$work/get-$tag.log" ||
        { tail -20 "$work/get-$tag.log" >&2; die "dataset get $name on h$RECEIVER failed"; }
    fetch_result=$(python3 - "$work/get-$tag.out" "$size_bytes" <<'PYEOF'
import json, sys
text = open(sys.argv[1]).read().rstrip()
dec, doc = json.JSONDecoder(), None
# The result is the last JSON object of the output (progress lines may come before it).
for i in reversed([i for i, c in enumerate(text) if c == "{"]):
    try:
        obj, end = dec.raw_decode(text, i)
    except ValueError:
        continue
    if isinstance(obj, dict) and not text[end:].strip():
        doc = obj
        break
if doc is None:
    sys.exit(f"no JSON object at the end of {sys.argv[1]}")
nbytes, ms = int(doc["bytes"]), float(doc["elapsed_ms"])
if nbytes != int(sys.argv[2]):
    print(f"# warning: fetched {nbytes} bytes, the dataset has {sys.argv[2]}", file=sys.stderr)
if ms <= 0:
    sys.exit(f"elapsed_ms={ms} in {sys.argv[1]}")
parts = " ".join(f"{s['name']}={s['bytes'] / 2**20:.1f}" for s in doc.get("sources", []))
print(f"# fetched {nbytes / 2**20:.1f} MiB in {ms / 1000:.2f} s; MiB per source: {parts}",
      file=sys.stderr)
print(nbytes, ms / 1000, f"{nbytes / 2**20 / (ms / 1000):.2f}")
PYEOF
    ) || die "could not read the result of dataset get $name ($work/get-$tag.out)"
    receiver_cpu "$ticks" "$tag"
}

# report N TARGET MBPS SECS TAG EXTRA HOLDER... : iperf3 from the holders for about SECS
# (the transfer's time), then the line (EXTRA: "to=dir " or "") and a warning under TARGET.
report() {
    local n=$1 target=$2 mbps=$3 secs=$4 tag=$5 extra=$6 iperf ratio
    shift 6
    iperf_run "$tag" "$(iperf_seconds "$secs")" "$@"
    iperf=$iperf_mibps
    ratio=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.3f}")' "$mbps" "$iperf")
    echo "dataset sources=$n size_mb=$size_mib ${extra}mb_per_s=$mbps iperf_mb_per_s=$iperf ratio=$ratio"
    if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$ratio" "$target"; then
        warn "sources=$n ${extra}ratio $ratio is below the target $target"
    fi
}

# measure NAME SOURCES TARGET HOLDER...
measure() {
    local name=$1 n=$2 target=$3 secs mbps
    shift 3
    fetch "$name" "s$n"
    read -r _ secs mbps <<<"$fetch_result"
    report "$n" "$target" "$mbps" "$secs" "s$n" "" "$@"
}

# measure_to NAME SRC SOURCES TARGET HOLDER... : `get NAME --to DIR` on the receiver, end
# to end (wall time of the command until it returns with the files in place); SRC is the
# file added, which DIR/NAME.bin must equal.
measure_to() {
    local name=$1 src=$2 n=$3 target=$4 to=$work/to-$1 t0 t1 secs mbps ticks
    shift 4
    ticks=$(cpu_ticks "${node_pids[$((RECEIVER - 1))]}")
    t0=$(date +%s%N)
    timeout "$fetch_timeout_s" "$bin" --peer "$(api "$RECEIVER")" dataset get "$name" --to "$to" --json \
        >"$work/get-to-$name.out" 2>"$work/get-to-$name.log" ||
        { tail -20 "$work/get-to-$name.log" >&2; die "dataset get $name --to $to on h$RECEIVER failed"; }
    t1=$(date +%s%N)
    receiver_cpu "$ticks" "to$n"
    cmp "$src" "$to/$name.bin" || die "$to/$name.bin differs from what was added"
    read -r secs mbps <<<"$(python3 -c 'import sys; s = (int(sys.argv[2]) - int(sys.argv[1])) / 1e9; print(f"{s:.3f}", f"{int(sys.argv[3]) / 2**20 / s:.2f}")' "$t0" "$t1" "$size_bytes")"
    note "get $name --to: $secs s end to end; the fetch's own elapsed_ms: $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["elapsed_ms"])' "$work/get-to-$name.out")"
    report "$n" "$target" "$mbps" "$secs" "to$n" "to=dir " "$@"
}

# Each dataset is removed once measured: the holders delete their copies (disk space).
# shellcheck disable=SC2046 # the holder list is split on purpose
measure bench "$HOLDERS" "$TARGET_RATIO_MULTI" $(seq 1 "$HOLDERS")
rl "$RECEIVER" dataset rm bench >/dev/null
measure bench1 1 "$TARGET_RATIO_SINGLE" 1
rl "$RECEIVER" dataset rm bench1 >/dev/null
# shellcheck disable=SC2046
measure_to bench2 "$work/data2/bench2.bin" "$HOLDERS" "$TARGET_RATIO_MULTI" $(seq 1 "$HOLDERS")
ok=1
