#!/usr/bin/env bash
# Soak: node/tests/soak.rs (its header says what it does and checks) for MINUTES on a release
# build. 5 local nodes run a stream of mixed jobs (train, search, command) while faults hit
# them (kill -9 and restart, SIGTERM and restart, pauses with SIGSTOP of any node, the chief
# included); every node's resident memory and open descriptors are sampled every 10 s, and
# growth is judged on the two nodes that are never restarted.
#
#   scripts/soak.sh [MINUTES]        (or SOAK_MINUTES; default 30)
#   SOAK_SEED=N scripts/soak.sh      replays a run's choices (the seed is printed first)
#
# Bounded in time: the build, then the run under `timeout` (MINUTES plus 10 minutes for
# forming, recoveries and the drain). Prints the test's summary line last:
#   soak minutes=… jobs=… faults=… rss_growth_mb=… fd_growth=…
# and exits non-zero when a job was lost or failed, or growth passed its bound.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-${SOAK_MINUTES:-30}}"
case "$minutes" in
    '' | *[!0-9]* | 0) echo "usage: $0 [MINUTES]" >&2; exit 2 ;;
esac
bound=$((minutes * 60 + 600))

cargo test --release -p ringleader --test soak --no-run
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
SOAK_MINUTES="$minutes" timeout "$bound" \
    cargo test --release -p ringleader --test soak -- --ignored --nocapture 2>&1 | tee "$log" || rc=$?
summary=$(grep -E '^soak minutes=' "$log" | tail -n 1 || true)
echo
if [ -n "$summary" ]; then
    echo "$summary"
else
    echo "soak minutes=$minutes: no summary (the run did not reach its end; exit $rc)"
fi
exit "$rc"
