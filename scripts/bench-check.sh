#!/usr/bin/env bash
# The guard of every ratio the project has promised: runs the benchmarks that measure against
# a physical limit or a peer, in one run, and compares each figure with its floor in
# docs/benchmarks-floors.toml (scripts/bench_check.py computes the figures). One line each:
#
#   bench-check FIGURE value=V floor=F ok
#   bench-check FIGURE value=V ceiling=C REGRESSION     (more than 10 % worse than its bound)
#   bench-check FIGURE MISSING (why)
#
# then `bench-check figures=N regressions=R missing=M`, and each part's wall time as
# `# part=NAME seconds=S` on stderr. The parts, in order (about 5 minutes in all on this
# project's 2-core machine, the release build excepted):
#
#   allreduce  bench-allreduce.sh --sizes 64M --worlds 4 --nets loopback,1gbit: the ring
#              against Gloo on loopback and at 1 Gbit/s, and against iperf3 on those links
#   datasets   bench-datasets.sh: fetches from 3 and 1 holders and `get --to DIR` against
#              iperf3 from the same holders (512 MiB, holders at 300 Mbit/s)
#   torch      bench-torch.sh PARTS=ddp: PyTorch DDP over ringleader against Gloo
#   elastic    ringleader-bench elastic --faults worker-kill,host-kill (the Rust trainer)
#   search     bench-search.sh PARTS=overhead: 500 trivial trials on 3 nodes
#   scale      ringleader-bench scale 8 32
#
# Not a test and not part of CI: timings on a shared host vary, so it is run by hand, on a
# quiet host, before an issue that touches the node, the collective, the trainer or the
# package is resolved, and its lines go into the note. Exit 1 when a figure regressed.
#
#   scripts/bench-check.sh [--parts allreduce,datasets,...] [--no-build] [--keep]
#
#   --parts     the parts to run (default: all); figures of the others say MISSING
#   --no-build  use the release binaries as they are (else `cargo build --release --workspace`)
#   --keep      keep the output directory (every part's lines and logs) under /tmp
#
# Needs root (network namespaces), iperf3, and torch for the Gloo and PyTorch figures (the
# interpreter: $PYTHON, else target/py-venv/bin/python where it imports torch, else python3;
# without torch those figures say MISSING). Each benchmark cleans up after itself (its own
# processes by PID, its namespaces).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

all_parts="allreduce datasets torch elastic search scale"
parts=$all_parts
build=1
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --parts) parts=${2//,/ }; shift 2 ;;
        --no-build) build=0; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
        *) echo "bench-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for p in $parts; do
    [[ " $all_parts " == *" $p "* ]] || { echo "bench-check: no part '$p' (parts: $all_parts)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "bench-check: needs root (network namespaces)" >&2; exit 2; }

if [ -z "${PYTHON:-}" ]; then
    if target/py-venv/bin/python -c "import torch" >/dev/null 2>&1; then
        PYTHON=$root/target/py-venv/bin/python
    else
        PYTHON=$(command -v python3)
    fi
fi
export PYTHON

out=$(mktemp -d /tmp/rl-bench-check.XXXXXX)
cleanup() {
    if [ "$keep" = 1 ]; then echo "# kept $out" >&2; else rm -rf "$out"; fi
}
trap cleanup EXIT

if [ "$build" = 1 ]; then
    echo "# building: cargo build --release --workspace" >&2
    cargo build --release --workspace >"$out/build.log" 2>&1 ||
        { tail -30 "$out/build.log" >&2; echo "bench-check: the release build failed" >&2; exit 1; }
fi
bin=$root/target/release/ringleader
bench=$root/target/release/ringleader-bench
for b in "$bin" "$bench"; do
    [ -x "$b" ] || { echo "bench-check: no $b (build first, or drop --no-build)" >&2; exit 1; }
done

# run PART COMMAND...: the part's standard output to PART.out (and here), its standard error to
# PART.log; a part that fails leaves its figures MISSING and the others run.
run() {
    local part=$1 t0=$SECONDS rc=0
    shift
    [[ " $parts " == *" $part "* ]] || return 0
    echo "# part=$part: $*" >&2
    "$@" >"$out/$part.out" 2>"$out/$part.log" || rc=$?
    grep -v '^#' "$out/$part.out" || true
    grep '^# warning' "$out/$part.log" >&2 || true
    [ "$rc" = 0 ] || { echo "# part=$part failed (exit $rc); its log's end:" >&2; tail -15 "$out/$part.log" >&2; }
    echo "# part=$part seconds=$((SECONDS - t0))" >&2
}

run allreduce "$here/bench-allreduce.sh" --sizes 64M --worlds 4 --nets loopback,1gbit --no-build \
    --logs "$out/allreduce-logs"
run datasets env RINGLEADER="$bin" "$here/bench-datasets.sh"
run torch env PARTS=ddp RINGLEADER_NATIVE="$root/target/release/lib_native.so" "$here/bench-torch.sh"
run elastic "$bench" elastic --faults worker-kill,host-kill
run search env PARTS=overhead RINGLEADER="$bin" "$here/bench-search.sh"
run scale bash -c 'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$0" scale 8 32' "$bench"

python3 "$here/bench_check.py" "$root/docs/benchmarks-floors.toml" "$out"
