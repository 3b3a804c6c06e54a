#!/usr/bin/env bash
# Allreduce benchmark: ringleader's ring allreduce (collective-bench) beside Gloo and Open MPI,
# on loopback and between network namespaces with 1 Gbit/s links (scripts/netns.sh).
#
#   scripts/bench-allreduce.sh [--sizes 4K,64K,1M,16M,64M] [--iters K] [--worlds 2,3,4]
#                              [--nets loopback,1gbit] [--no-baselines] [--no-build]
#                              [--mpi-ring] [--timeout SECONDS] [--logs DIR]
#
#   --sizes     message sizes (K/M/G are binary: 64M = 67108864 bytes)
#   --iters     timed iterations for every size; default per size: min(100, max(5, 128MiB/size))
#               (the same count is passed to every implementation, and the same warm-up count:
#               min(5, max(1, iters/5)))
#   --worlds    world sizes (number of ranks); at most 253
#   --nets      settings to run: loopback (127.0.0.1, distinct ports) and/or a rate such as 1gbit
#               (hosts rl1..rlN of scripts/netns.sh, rank i in rl(i+1) at 10.77.0.(i+1))
#   --no-baselines  only ringleader (else Gloo and MPI too, where torch / mpi4py are installed;
#               scripts/install-baselines.sh installs them)
#   --mpi-ring  also run Open MPI with its ring allreduce forced (impl=mpi-ring; the default
#               impl=mpi is Open MPI's own choice of algorithm by size)
#   --no-build  skip `cargo build --release --workspace` (binary: $COLLECTIVE_BENCH or
#               target/release/collective-bench)
#   --timeout   wall-clock limit of one run (one implementation, world and size); default 180
#   --logs      directory for per-run logs (default: a temporary directory, kept on failure)
# Environment: COLLECTIVE_BENCH (binary to use), PYTHON (interpreter for the baselines).
#
# Output, one line per result, prefixed by the setting:
#   net=1gbit iperf3_GBps=0.117 iperf3_Gbps=0.94 ring_hosts=4 ring_Gbps_per_host=0.94
#   net=loopback impl=ringleader allreduce world=4 size=67108864 time_ms=.. algbw_GBps=.. busbw_GBps=..
#   net=1gbit impl=gloo allreduce world=4 size=67108864 time_ms=.. algbw_GBps=.. busbw_GBps=..
#   net=1gbit impl=mpi allreduce world=4 size=67108864 time_ms=.. algbw_GBps=.. busbw_GBps=..
# algbw = size / median time (GB = 1e9 B); busbw = algbw * 2(N-1)/N. A run that fails prints
# `net=.. impl=.. world=.. size=.. FAILED ...` and the benchmark goes on.
#
# MPI runs over TCP in both settings (--mca btl tcp,self), so its loopback figures compare with
# ringleader's and Gloo's TCP, not with shared memory. Across namespaces mpirun (in the root
# namespace) starts its daemons through an rsh agent that runs `ip netns exec rlI` (with its own
# UTS namespace and hostname rlI, so Open MPI sees distinct nodes).
#
# Needs root for the namespaces. Every process started is waited for, or killed by PID on exit,
# and the namespaces are removed (scripts/netns.sh down) on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
NETNS="$here/netns.sh"
# shellcheck source=allreduce-bench-lib.sh
. "$here/allreduce-bench-lib.sh"

sizes="4K,64K,1M,16M,64M"
iters=""
worlds="2,3,4"
nets="loopback,1gbit"
baselines=1
mpi_ring=0
build=1
run_timeout=180
logdir=""

usage() { sed -n '2,29p' "$0" >&2; exit 2; }
die() { echo "bench-allreduce: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) [ $# -ge 2 ] || usage; sizes=$2; shift 2 ;;
        --iters) [ $# -ge 2 ] || usage; iters=$2; shift 2 ;;
        --worlds) [ $# -ge 2 ] || usage; worlds=$2; shift 2 ;;
        --nets) [ $# -ge 2 ] || usage; nets=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; run_timeout=$2; shift 2 ;;
        --logs) [ $# -ge 2 ] || usage; logdir=$2; shift 2 ;;
        --no-baselines) baselines=0; shift ;;
        --no-build) build=0; shift ;;
        --mpi-ring) mpi_ring=1; shift ;;
        -h|--help) usage ;;
        *) echo "bench-allreduce: unknown argument '$1'" >&2; usage ;;
    esac
done


IFS=, read -r -a size_list <<<"$sizes"
IFS=, read -r -a world_list <<<"$worlds"
IFS=, read -r -a net_list <<<"$nets"
[ "${#size_list[@]}" -gt 0 ] || die "no sizes"
for s in "${size_list[@]}"; do size_bytes "$s" >/dev/null || die "bad size '$s' (examples: 4K, 1M, 64M)"; done
maxw=2
for w in "${world_list[@]}"; do
    if ! [[ $w =~ ^[0-9]+$ ]] || [ "$w" -lt 2 ] || [ "$w" -gt 253 ]; then
        die "bad world size '$w' (2..253)"
    fi
    [ "$w" -gt "$maxw" ] && maxw=$w
done
[ -z "$iters" ] || [[ $iters =~ ^[1-9][0-9]*$ ]] || die "bad --iters '$iters'"
[[ $run_timeout =~ ^[1-9][0-9]*$ ]] || die "bad --timeout '$run_timeout'"
for n in "${net_list[@]}"; do
    [ "$n" = loopback ] || [[ ${n,,} =~ ^[0-9.]+[kmgt]?(bit|bps)$ ]] || die "bad net '$n' (loopback or a rate like 1gbit)"
done

keep_logs=0
if [ -z "$logdir" ]; then
    logdir=$(mktemp -d /tmp/bench-allreduce.XXXXXX)
else
    mkdir -p "$logdir"
    keep_logs=1
fi
agentdir=$(mktemp -d /tmp/bench-allreduce-agent.XXXXXX)

# ---- cleanup: kill what we started (by PID), remove namespaces ----
pids=()
netns_up=0
failures=0
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    pids=()
    if [ "$netns_up" = 1 ]; then "$NETNS" down >/dev/null 2>&1 || true; fi
    rm -rf "$agentdir"
    if [ "$keep_logs" = 0 ] && [ "$failures" = 0 ]; then rm -rf "$logdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- tools ----
PY=${PYTHON:-$(command -v python3 || true)}
if [ -n "$PY" ]; then PY=$("$PY" -c 'import sys; print(sys.executable)'); fi
have_gloo=0
have_mpi=0
if [ "$baselines" = 1 ] && [ -n "$PY" ]; then
    if "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' >/dev/null 2>&1; then
        have_gloo=1
    else
        note "torch with Gloo not installed: no Gloo figures (scripts/install-baselines.sh)"
    fi
    if command -v mpirun >/dev/null && "$PY" -c 'import mpi4py, numpy' >/dev/null 2>&1; then
        have_mpi=1
    else
        note "mpirun / mpi4py not installed: no MPI figures (scripts/install-baselines.sh)"
    fi
fi

BIN=${COLLECTIVE_BENCH:-${CARGO_TARGET_DIR:-$root/target}/release/collective-bench}
have_ours=1
built_ok=1
if [ "$build" = 1 ]; then
    note "building: cargo build --release --workspace (log: $logdir/build.log)"
    if ! (cd "$root" && cargo build --release --workspace) >"$logdir/build.log" 2>&1; then
        failures=$((failures + 1))
        tail -20 "$logdir/build.log" >&2
        note "cargo build failed: no ringleader figures (a stale binary is not used)"
        built_ok=0
        have_ours=0
    fi
fi
if [ "$built_ok" = 1 ] && [ ! -x "$BIN" ]; then
    note "no $BIN: no ringleader figures"
    have_ours=0
fi

needs_root() { [ "$(id -u)" = 0 ] || die "network-namespace runs need root"; }

# Distinct ports for every run (no clash with TIME_WAIT sockets of earlier runs).
port_next=$((20000 + ($$ % 2000) * 10))
next_ports() { # N -> sets port_base, advances
    port_base=$port_next
    port_next=$((port_next + $1 + 1))
    if [ "$port_next" -gt 60000 ]; then port_next=20000; fi
}

# ns_prefix NET RANK -> command prefix words in ns_cmd (empty on loopback)
ns_cmd=()
set_ns_cmd() {
    if [ "$1" = loopback ]; then ns_cmd=(); else ns_cmd=(ip netns exec "rl$(($2 + 1))"); fi
}
host_of() { # NET RANK
    if [ "$1" = loopback ]; then echo 127.0.0.1; else echo "10.77.0.$(($2 + 1))"; fi
}


# emit NET IMPL WORLD SIZE LOG RC: print rank 0's result lines with the setting prefix.
emit() {
    local net=$1 impl=$2 w=$3 s=$4 log=$5 rc=$6 lines
    lines=$(grep -E '^((gloo|mpi) )?allreduce world=' "$log" | sed -E 's/^(gloo|mpi) //' || true)
    if [ -n "$lines" ]; then
        while IFS= read -r l; do echo "net=$net impl=$impl $l"; done <<<"$lines"
    fi
    if [ "$rc" != 0 ] || [ -z "$lines" ]; then
        failures=$((failures + 1))
        local why="rc=$rc"
        [ "$rc" = 124 ] && why="timed out after ${run_timeout}s"
        [ -z "$lines" ] && [ "$rc" = 0 ] && why="no result line"
        echo "net=$net impl=$impl world=$w size=$(size_bytes "$s") FAILED $why (log: $log)"
        tail -5 "$log" | sed 's/^/#   /' >&2
    fi
}

run_ours() { # NET WORLD SIZE
    local net=$1 w=$2 s=$3 k r peers="" log rc=0
    k=$(iters_for "$(size_bytes "$s")")
    next_ports "$w"
    for r in $(seq 0 $((w - 1))); do
        peers+="${peers:+,}$(host_of "$net" "$r"):$((port_base + r))"
    done
    log="$logdir/$net.ringleader.w$w.$s"
    # Emulated hosts share this machine's /dev/shm, which real hosts don't: keep their links
    # on TCP so the rate-limited veths are what is measured.
    local shm=()
    [ "$net" = loopback ] || shm=(--no-shm)
    for r in $(seq 0 $((w - 1))); do
        set_ns_cmd "$net" "$r"
        if [ "$r" = 0 ]; then
            "${ns_cmd[@]}" timeout "$run_timeout" "$BIN" --world "$w" --rank "$r" --peers "$peers" "${shm[@]}" \
                --sizes "$s" --iters "$k" --warmup "$(warmup_for "$k")" >"$log" 2>"$log.r0.err" &
        else
            "${ns_cmd[@]}" timeout "$run_timeout" "$BIN" --world "$w" --rank "$r" --peers "$peers" "${shm[@]}" \
                --sizes "$s" --iters "$k" --warmup "$(warmup_for "$k")" >"$log.r$r" 2>&1 &
        fi
        pids+=($!)
    done
    wait_all || rc=$?
    cat "$log.r0.err" >>"$log"
    emit "$net" ringleader "$w" "$s" "$log" "$rc"
}

run_gloo() { # NET WORLD SIZE
    local net=$1 w=$2 s=$3 k r log rc=0 ifname=lo master
    k=$(iters_for "$(size_bytes "$s")")
    next_ports 1
    master=$(host_of "$net" 0)
    [ "$net" = loopback ] || ifname=eth0
    log="$logdir/$net.gloo.w$w.$s"
    for r in $(seq 0 $((w - 1))); do
        set_ns_cmd "$net" "$r"
        "${ns_cmd[@]}" timeout "$run_timeout" "$PY" "$here/baseline_allreduce_gloo.py" \
            --rank "$r" --world "$w" --master-addr "$master" --master-port "$port_base" \
            --ifname "$ifname" --sizes "$s" --iters "$k" --warmup "$(warmup_for "$k")" --timeout "$run_timeout" \
            >"$log$([ "$r" = 0 ] || echo ".r$r")" 2>&1 &
        pids+=($!)
    done
    wait_all || rc=$?
    emit "$net" gloo "$w" "$s" "$log" "$rc"
}

write_agent() {
    cat >"$agentdir/rsh-agent" <<'EOF'
#!/bin/sh
# Open MPI rsh agent for scripts/netns.sh hosts: "rsh-agent 10.77.0.I CMD..." runs CMD in rlI,
# in a UTS namespace of its own named rlI (so that every host has a distinct node name).
host=$1
shift
i=${host##*.}
exec ip netns exec "rl$i" unshare --uts /bin/sh -c "hostname rl$i; $*"
EOF
    chmod +x "$agentdir/rsh-agent"
}

run_mpi() { # NET WORLD SIZE [ring]
    local net=$1 w=$2 s=$3 k r log rc=0 hosts="" impl=mpi
    k=$(iters_for "$(size_bytes "$s")")
    local -a mpi=(mpirun --allow-run-as-root -np "$w" --mca mpi_yield_when_idle 1
        --mca btl "tcp,self")
    if [ "${4:-}" = ring ]; then
        impl="mpi-ring"
        mpi+=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
    fi
    log="$logdir/$net.$impl.w$w.$s"
    if [ "$net" = loopback ]; then
        mpi+=(--oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
    else
        for r in $(seq 0 $((w - 1))); do hosts+="${hosts:+,}$(host_of "$net" "$r")"; done
        mpi+=(--host "$hosts" --mca plm_rsh_agent "$agentdir/rsh-agent"
            --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
    fi
    timeout "$run_timeout" "${mpi[@]}" "$PY" "$here/baseline_allreduce_mpi.py" \
        --sizes "$s" --iters "$k" --warmup "$(warmup_for "$k")" >"$log" 2>&1 </dev/null &
    pids+=($!)
    wait_all || rc=$?
    emit "$net" "$impl" "$w" "$s" "$log" "$rc"
}

iperf_ref() { # NET: single-stream goodput rl1 -> rl2, then all hosts sending in a ring at once
    local net=$1 gbps ring r j sum=0 n
    command -v iperf3 >/dev/null || { note "iperf3 not installed: no reference line"; return 0; }
    "$NETNS" exec 2 iperf3 -s -1 -p 5201 >"$logdir/iperf-s.log" 2>&1 &
    pids+=($!)
    sleep 0.5
    "$NETNS" exec 1 timeout 30 iperf3 -c 10.77.0.2 -p 5201 -t 5 -J >"$logdir/iperf-c.json" 2>&1 || true
    wait_all || true
    gbps=$("$PY" -c 'import json,sys; print("%.4f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' \
        "$logdir/iperf-c.json" 2>/dev/null || echo "")
    if [ -z "$gbps" ]; then
        echo "net=$net iperf3 FAILED (log: $logdir/iperf-c.json)"
        failures=$((failures + 1))
        return 0
    fi
    n=$maxw
    for r in $(seq 1 "$n"); do
        "$NETNS" exec "$r" iperf3 -s -1 -p 5202 >"$logdir/iperf-rs$r.log" 2>&1 &
        pids+=($!)
    done
    sleep 0.5
    for r in $(seq 1 "$n"); do
        j=$((r % n + 1))
        "$NETNS" exec "$r" timeout 30 iperf3 -c "10.77.0.$j" -p 5202 -t 5 -J >"$logdir/iperf-rc$r.json" 2>&1 &
        pids+=($!)
    done
    wait_all || true
    for r in $(seq 1 "$n"); do
        sum=$("$PY" -c 'import json,sys; print(float(sys.argv[2]) + json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9)' \
            "$logdir/iperf-rc$r.json" "$sum" 2>/dev/null || echo "$sum")
    done
    ring=$(awk -v s="$sum" -v n="$n" 'BEGIN { printf "%.4f", s / n }')
    echo "net=$net iperf3_GBps=$(awk -v g="$gbps" 'BEGIN { printf "%.4f", g / 8 }') iperf3_Gbps=$gbps ring_hosts=$n ring_Gbps_per_host=$ring"
}

# ---- run ----
for net in "${net_list[@]}"; do
    if [ "$net" != loopback ]; then
        needs_root
        "$NETNS" up "$maxw" "$net" >"$logdir/netns-up.log" 2>&1 ||
            { cat "$logdir/netns-up.log" >&2; die "netns.sh up $maxw $net failed"; }
        netns_up=1
        [ "$have_mpi" = 0 ] || write_agent
        iperf_ref "$net"
    fi
    for w in "${world_list[@]}"; do
        for s in "${size_list[@]}"; do
            [ "$have_ours" = 0 ] || run_ours "$net" "$w" "$s"
            [ "$have_gloo" = 0 ] || run_gloo "$net" "$w" "$s"
            [ "$have_mpi" = 0 ] || run_mpi "$net" "$w" "$s"
            [ "$have_mpi" = 0 ] || [ "$mpi_ring" = 0 ] || run_mpi "$net" "$w" "$s" ring
        done
    done
    if [ "$net" != loopback ]; then
        "$NETNS" down >/dev/null 2>&1 || true
        netns_up=0
    fi
done

if [ "$failures" != 0 ]; then
    note "$failures run(s) failed; logs kept in $logdir"
    exit 1
fi
