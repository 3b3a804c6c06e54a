#!/usr/bin/env bash
# Fuzzes every decoder of bytes from outside (the targets in node/fuzz/fuzz_targets/, each one
# line around its body in node/fuzz/bodies/, which CI's hostile_bytes tests run) with
# cargo-fuzz (libFuzzer + AddressSanitizer, nightly), FUZZ_SECONDS each (default 60).
#
#   scripts/fuzz.sh                    # all targets
#   FUZZ_SECONDS=20 scripts/fuzz.sh rpc membership
#
# Installs the nightly toolchain and cargo-fuzz first, best effort: without network it goes
# on with what is installed. Prints one line per target:
#   fuzz target=rpc seconds=60 runs=123456 crashes=0
# Exits non-zero when a target crashes (panic, sanitizer report, out of memory past
# -rss_limit_mb, timeout) and names the input file under node/fuzz/artifacts/TARGET/;
# replay it with `cargo +nightly fuzz run --fuzz-dir node/fuzz TARGET FILE`.
# The corpus grows in node/fuzz/corpus/TARGET/ (ignored by git) and is reused next run.
set -uo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_DIR=node/fuzz
# libFuzzer's limits: memory per process, input size (frames and manifests are larger, but
# every decoder's length checks are reached well below it).
RSS_LIMIT_MB=512
INPUT_BYTES_MAX=65536

echo "fuzz: installing nightly and cargo-fuzz (best effort; failures are not fatal)" >&2
# An installed nightly is kept (an update would rebuild everything).
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal >&2 ||
        echo "fuzz: could not install nightly" >&2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked >&2 ||
        echo "fuzz: could not install cargo-fuzz" >&2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo +nightly fuzz is not available; nothing run" >&2
    exit 2
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir "$FUZZ_DIR")
fi

echo "fuzz: building the targets (the first build takes minutes)" >&2
cargo +nightly fuzz build --fuzz-dir "$FUZZ_DIR" >&2 || {
    echo "fuzz: build failed" >&2
    exit 2
}

failed=0
for t in "${targets[@]}"; do
    log="$(mktemp -t "fuzz-$t.XXXX.log")"
    mkdir -p "$FUZZ_DIR/corpus/$t"
    cargo +nightly fuzz run --fuzz-dir "$FUZZ_DIR" "$t" -- \
        -max_total_time="$FUZZ_SECONDS" -rss_limit_mb="$RSS_LIMIT_MB" \
        -max_len="$INPUT_BYTES_MAX" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    [ -n "$runs" ] || runs="$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')"
    crash="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
    if [ "$rc" -eq 0 ] && [ -z "$crash" ]; then
        echo "fuzz target=$t seconds=$FUZZ_SECONDS runs=${runs:-?} crashes=0"
        rm -f "$log"
    else
        failed=1
        echo "fuzz target=$t seconds=$FUZZ_SECONDS runs=${runs:-?} crashes=1 input=${crash:-none} exit=$rc log=$log"
        grep -m1 -A12 -E "panicked at|ERROR: (AddressSanitizer|libFuzzer)" "$log" | sed 's/^/    /'
    fi
done
exit "$failed"
