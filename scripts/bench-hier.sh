#!/usr/bin/env bash
# Hierarchical allreduce benchmark: emulated hosts with several ranks each, flat ring vs
# hierarchical (collective-bench --algo ring|hierarchical) and Gloo beside them, in one run.
#
#   scripts/bench-hier.sh [--hosts 8] [--per-host 2] [--rate 1gbit] [--sizes 4K,64M]
#                         [--iters K] [--timeout SECONDS] [--no-gloo] [--logs DIR]
#
#   --hosts     emulated hosts rl1..rlH of scripts/netns.sh, each limited to --rate both ways
#   --per-host  ranks per host: rank r runs in host r / per-host + 1 at 10.77.0.(that host),
#               so the ranks of a host are consecutive (the flat ring crosses each host's
#               NIC once each way, its best placement)
#   --sizes     message sizes (K/M/G binary); both algorithms run every size, also below the
#               recursive-doubling threshold (they are forced)
#   --iters     timed iterations; default per size min(100, max(5, 128MiB/size)), warm-up
#               min(5, max(1, iters/5)), the same for Gloo
#   --timeout   wall-clock limit of one run (one implementation and size); default 300
#   --no-gloo   skip Gloo (else it runs when $PYTHON has torch with Gloo)
# Environment: COLLECTIVE_BENCH (binary; default target-release/release/collective-bench if
# built, else target/debug/collective-bench: the script builds nothing), PYTHON (default
# /work/main/target/py-venv/bin/python if present, else python3).
#
# Output, one line per result (rank 0's), the bench-allreduce.sh line plus algo=:
#   net=1gbit hosts=8 impl=ringleader algo=ring allreduce world=16 size=4096 time_ms=.. algbw_GBps=.. busbw_GBps=.. shm_links=0
#   net=1gbit hosts=8 impl=ringleader algo=hierarchical allreduce world=16 size=67108864 ...
#   net=1gbit hosts=8 impl=gloo algo=gloo allreduce world=16 size=67108864 ...
# busbw = algbw * 2(N-1)/N for every line (N = ranks), so the lines compare directly.
#
# The data plane runs with --no-shm: emulated hosts share this machine's /dev/shm, which real
# hosts don't. Two ranks of one host then talk over TCP on the namespace's own loopback (not
# rate-limited), the hosts over their 1 Gbit/s veths. Needs root. Every process started is
# waited for or killed by PID on exit, and the namespaces are removed (netns.sh down).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
NETNS="$here/netns.sh"
# shellcheck source=allreduce-bench-lib.sh
. "$here/allreduce-bench-lib.sh"

hosts=8
per_host=2
rate=1gbit
sizes="4K,64M"
iters=""
run_timeout=300
gloo=1
logdir=""

usage() { sed -n '2,30p' "$0" >&2; exit 2; }
die() { echo "bench-hier: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --hosts) [ $# -ge 2 ] || usage; hosts=$2; shift 2 ;;
        --per-host) [ $# -ge 2 ] || usage; per_host=$2; shift 2 ;;
        --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
        --sizes) [ $# -ge 2 ] || usage; sizes=$2; shift 2 ;;
        --iters) [ $# -ge 2 ] || usage; iters=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; run_timeout=$2; shift 2 ;;
        --logs) [ $# -ge 2 ] || usage; logdir=$2; shift 2 ;;
        --no-gloo) gloo=0; shift ;;
        -h|--help) usage ;;
        *) echo "bench-hier: unknown argument '$1'" >&2; usage ;;
    esac
done

[[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 253 ] || die "bad --hosts '$hosts' (2..253)"
[[ $per_host =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] || die "bad --per-host '$per_host' (1 or more)"
[[ ${rate,,} =~ ^[0-9.]+[kmgt]?(bit|bps)$ ]] || die "bad --rate '$rate' (a rate like 1gbit)"
[ -z "$iters" ] || [[ $iters =~ ^[1-9][0-9]*$ ]] || die "bad --iters '$iters'"
[[ $run_timeout =~ ^[1-9][0-9]*$ ]] || die "bad --timeout '$run_timeout'"
[ "$(id -u)" = 0 ] || die "network namespaces need root"
world=$((hosts * per_host))

IFS=, read -r -a size_list <<<"$sizes"
for s in "${size_list[@]}"; do size_bytes "$s" >/dev/null || die "bad size '$s' (examples: 4K, 64M)"; done

BIN=${COLLECTIVE_BENCH:-}
if [ -z "$BIN" ]; then
    if [ -x "$root/target-release/release/collective-bench" ]; then
        BIN=$root/target-release/release/collective-bench
    else
        BIN=$root/target/debug/collective-bench
    fi
fi
[ -x "$BIN" ] || die "no $BIN (cargo build --workspace, or set COLLECTIVE_BENCH)"
note "binary: $BIN"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x /work/main/target/py-venv/bin/python ]; then PY=/work/main/target/py-venv/bin/python; else PY=$(command -v python3 || true); fi
fi
if [ "$gloo" = 1 ] && ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' >/dev/null 2>&1; then
    note "no torch with Gloo in ${PY:-python3}: no Gloo figures"
    gloo=0
fi

keep_logs=0
if [ -z "$logdir" ]; then logdir=$(mktemp -d /tmp/bench-hier.XXXXXX); else mkdir -p "$logdir"; keep_logs=1; fi
pids=()
netns_up=0
failures=0
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
    if [ "$netns_up" = 1 ]; then "$NETNS" down >/dev/null 2>&1 || true; fi
    if [ "$keep_logs" = 0 ] && [ "$failures" = 0 ]; then rm -rf "$logdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM


host_of() { echo $(($1 / per_host + 1)); } # rank -> host index
port_next=$((21000 + ($$ % 1000) * 20))
next_ports() {
    port_base=$port_next
    port_next=$((port_next + $1 + 1))
    if [ "$port_next" -gt 60000 ]; then port_next=21000; fi
}

emit() { # IMPL ALGO SIZE LOG RC
    local impl=$1 algo=$2 s=$3 log=$4 rc=$5 lines
    lines=$(grep -E '^(gloo )?allreduce world=' "$log" | sed -E 's/^gloo //' || true)
    if [ -n "$lines" ]; then
        while IFS= read -r l; do echo "net=$rate hosts=$hosts impl=$impl algo=$algo $l"; done <<<"$lines"
    fi
    if [ "$rc" != 0 ] || [ -z "$lines" ]; then
        failures=$((failures + 1))
        local why="rc=$rc"
        [ "$rc" = 124 ] && why="timed out after ${run_timeout}s"
        echo "net=$rate hosts=$hosts impl=$impl algo=$algo world=$world size=$(size_bytes "$s") FAILED $why (log: $log)"
        tail -5 "$log" | sed 's/^/#   /' >&2
    fi
}

run_ours() { # ALGO SIZE
    local algo=$1 s=$2 k r peers="" log rc=0 out
    k=$(iters_for "$(size_bytes "$s")")
    next_ports "$world"
    for r in $(seq 0 $((world - 1))); do
        peers+="${peers:+,}10.77.0.$(host_of "$r"):$((port_base + r))"
    done
    log="$logdir/ringleader.$algo.$s"
    for r in $(seq 0 $((world - 1))); do
        out=$log.r$r
        [ "$r" = 0 ] && out=$log
        ip netns exec "rl$(host_of "$r")" timeout "$run_timeout" "$BIN" --world "$world" --rank "$r" \
            --peers "$peers" --no-shm --algo "$algo" --sizes "$s" --iters "$k" \
            --warmup "$(warmup_for "$k")" >"$out" 2>&1 &
        pids+=($!)
    done
    wait_all || rc=$?
    emit ringleader "$algo" "$s" "$log" "$rc"
}

run_gloo() { # SIZE
    local s=$1 k r log rc=0 out
    k=$(iters_for "$(size_bytes "$s")")
    next_ports 1
    log="$logdir/gloo.$s"
    for r in $(seq 0 $((world - 1))); do
        out=$log.r$r
        [ "$r" = 0 ] && out=$log
        ip netns exec "rl$(host_of "$r")" timeout "$run_timeout" "$PY" "$here/baseline_allreduce_gloo.py" \
            --rank "$r" --world "$world" --master-addr 10.77.0.1 --master-port "$port_base" \
            --ifname eth0 --sizes "$s" --iters "$k" --warmup "$(warmup_for "$k")" \
            --timeout "$run_timeout" >"$out" 2>&1 &
        pids+=($!)
    done
    wait_all || rc=$?
    emit gloo gloo "$s" "$log" "$rc"
}

"$NETNS" up "$hosts" "$rate" >"$logdir/netns-up.log" 2>&1 ||
    { cat "$logdir/netns-up.log" >&2; die "netns.sh up $hosts $rate failed"; }
netns_up=1
note "$hosts hosts x $per_host ranks at $rate (world $world), logs in $logdir"
for s in "${size_list[@]}"; do
    run_ours ring "$s"
    run_ours hierarchical "$s"
    [ "$gloo" = 0 ] || run_gloo "$s"
done

if [ "$failures" != 0 ]; then
    note "$failures run(s) failed; logs kept in $logdir"
    exit 1
fi
