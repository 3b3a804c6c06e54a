#!/usr/bin/env bash
# PyTorch DDP over the "ringleader" backend against Gloo: the same script
# (scripts/bench_torch_ddp.py: an MLP of 5.8 M parameters, 23 MB of gradients a step, batch 16
# per rank), only the backend differs, WORKERS (4) ranks, one line each:
#
#   torch ddp backend=ringleader net=loopback workers=4 model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C
#   torch ddp backend=gloo net=loopback workers=4 model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C
#   torch ddp no_sync net=loopback workers=4 model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C
#   torch ddp backend=ringleader net=1gbit workers=4 model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C
#   torch ddp backend=gloo net=1gbit workers=4 model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C
#   torch ddp no_sync net=1gbit workers=4 model=mlp-5.8M samples_per_s=X step_ms=Y cpu_ms=C
#
# cpu_ms: rank 0's CPU time a step (every thread). no_sync: the same DDP step with no
# collective at all (DDP's no_sync()), the bound no backend passes.
# Both backends run in the same processes, each with its own process group and DDP model,
# alternating ROUNDS (8) times STEPS (5) timed steps each, so that both see the same load on a
# shared machine (separate runs back to back varied by ×2 here while other builds ran); the
# figures are the median round's.
# loopback: every rank on this host (127.0.0.1); ringleader's ranks use shared memory between
# them, as on one real host. 1gbit: rank i on its own emulated host rl(i+1) of
# scripts/netns.sh (1 Gbit/s each way per host, 10.77.0.(i+1)); namespaces share /dev/shm,
# so ringleader's shared memory is turned off there (RINGLEADER_SHM=0) and Gloo is told the
# interface (GLOO_SOCKET_IFNAME=eth0). Targets (issue 25): ≥ Gloo at 1 Gbit/s, ≥ 1.5× Gloo on
# loopback.
#
# The extension is the release build (`cargo build --release`, or RINGLEADER_NATIVE=path of
# a built lib_native.so), put with a copy of the package in a temp dir, so the checkout's
# debug extension is left alone. Needs torch in $PYTHON (python3) and, for 1gbit, root.
#
# Elastic PyTorch (PARTS has `elastic`; scripts/bench_torch_elastic.py): the book's elastic
# script as a command job of 3 ranks on a local 3-node cluster, faults in turn, one line each,
# then torchrun on the same script with one worker killed, then the goodput:
#
#   torch elastic fault=worker-kill|join|hang|straggler|host-kill recover_s=X steps_lost=L
#   torch elastic impl=torchrun fault=worker-kill recover_s=X steps_lost=L
#   torch goodput faults=… steps=N ours_x=X torchrun_x=Y torchrun_faults=worker-kill
#
# It runs the checkout's package (python/, its ringleader/_native.abi3.so) and the node binary
# RINGLEADER_TEST_BINARY (default target/debug/ringleader). Targets (issue 25): kills ≤ 5 s,
# hang ≤ 10 s, ≤ 1 step lost, goodput ≤ 1.15×.
#
# Environment: PYTHON, PARTS ("ddp elastic"), WORKERS (4), ROUNDS (8), STEPS (5), WARMUP
# (3), BATCH (16), NETS ("loopback 1gbit"), RINGLEADER_NATIVE, KEEP=1 keeps the temp dir
# (every rank's output), ELASTIC_STEPS (3000: steps of each elastic run).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
NETNS="$here/netns.sh"
py=${PYTHON:-python3}
workers=${WORKERS:-4}
rounds=${ROUNDS:-8}
steps=${STEPS:-5}
warmup=${WARMUP:-3}
batch=${BATCH:-16}
nets=${NETS:-loopback 1gbit}
# How long one run (every rank) may take, seconds.
RUN_TIMEOUT_S=600
die() { echo "bench-torch.sh: $*" >&2; exit 1; }

parts=${PARTS:-ddp elastic}
elastic_steps=${ELASTIC_STEPS:-3000}
[[ $workers =~ ^[1-9][0-9]*$ ]] || die "WORKERS must be a positive integer (got '$workers')"
[[ $elastic_steps =~ ^[1-9][0-9]*$ ]] || die "ELASTIC_STEPS must be a positive integer (got '$elastic_steps')"
"$py" -c "import torch" 2>/dev/null || die "torch is not installed for $py ($py -m pip install torch)"
for part in $parts; do
    case $part in ddp | elastic) ;; *) die "unknown part '$part' in PARTS (ddp, elastic)" ;; esac
done
if [[ " $parts " != *" ddp "* ]]; then
    rc=0
    "$py" "$here/bench_torch_elastic.py" --steps "$elastic_steps" || rc=1
    exit "$rc"
fi

if [ -n "${RINGLEADER_NATIVE:-}" ]; then
    native=$RINGLEADER_NATIVE
else
    (cd "$root" && cargo build --release --workspace --lib) >&2
    native=${CARGO_TARGET_DIR:-$root/target}/release/lib_native.so
fi
[ -e "$native" ] || die "no extension at $native"

tmp=$(mktemp -d /tmp/rl-bench-torch.XXXXXX)
pids=()
netns_up=0
cleanup() {
    # Ranks still running (an interrupted run): each is `timeout` around python; TERM ends it.
    if [ "${#pids[@]}" -gt 0 ]; then kill -TERM "${pids[@]}" 2>/dev/null || true; wait || true; fi
    if [ "$netns_up" = 1 ]; then "$NETNS" down >/dev/null 2>&1 || true; fi
    if [ "${KEEP:-0}" = 1 ]; then echo "# kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

mkdir -p "$tmp/pkg"
cp -r "$root/python/ringleader" "$tmp/pkg/"
rm -f "$tmp/pkg/ringleader/_native"*.so
cp "$native" "$tmp/pkg/ringleader/_native.abi3.so"

# run NET: one DDP run of every rank, both backends; prints rank 0's lines.
port=29600
run() {
    local net=$1 r master=127.0.0.1 out
    port=$((port + 1))
    [ "$net" = loopback ] || master=10.77.0.1
    pids=()
    for ((r = 0; r < workers; r++)); do
        local ns=() extra=()
        if [ "$net" != loopback ]; then
            ns=(ip netns exec "rl$((r + 1))")
            extra=(RINGLEADER_SHM=0 GLOO_SOCKET_IFNAME=eth0)
        fi
        "${ns[@]}" env -u RINGLEADER_SECRET PYTHONPATH="$tmp/pkg" OMP_NUM_THREADS=1 \
            RANK=$r WORLD_SIZE="$workers" LOCAL_RANK=$r MASTER_ADDR=$master MASTER_PORT=$port \
            "${extra[@]}" timeout "$RUN_TIMEOUT_S" "$py" "$here/bench_torch_ddp.py" \
            --backends ringleader,gloo --net "$net" --rounds "$rounds" --steps "$steps" \
            --warmup "$warmup" --batch "$batch" >"$tmp/$net-$r.log" 2>&1 &
        pids+=($!)
    done
    local failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    pids=()
    out=$(grep -h "^torch ddp " "$tmp/$net-0.log" || true)
    if [ "$failed" = 1 ] || [ -z "$out" ]; then
        echo "torch ddp net=$net workers=$workers: failed ($(tail -3 "$tmp/$net-0.log" | tr '\n' ' '))"
        return 1
    fi
    echo "$out"
}

rc=0
for net in $nets; do
    case $net in
        loopback) ;;
        1gbit)
            [ "$(id -u)" = 0 ] || die "1gbit needs root (network namespaces)"
            # Someone else's emulated cluster: `up` would reshape it and `down` end it.
            for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^rl[0-9]+$' || true); do
                [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] ||
                    die "namespace $ns has processes in it (another benchmark or test?); not touching it"
            done
            "$NETNS" up "$workers" 1gbit >"$tmp/netns.log" 2>&1 ||
                { cat "$tmp/netns.log" >&2; die "netns.sh up $workers 1gbit failed"; }
            netns_up=1
            ;;
        *) die "unknown net '$net' (loopback, 1gbit)" ;;
    esac
    run "$net" || rc=1
    if [ "$netns_up" = 1 ]; then "$NETNS" down >/dev/null 2>&1 || true; netns_up=0; fi
done
if [[ " $parts " == *" elastic "* ]]; then
    "$py" "$here/bench_torch_elastic.py" --steps "$elastic_steps" || rc=1
fi
exit "$rc"
