#!/usr/bin/env bash
# Churn with a checker, the long run: node/tests/chaos.rs (its header says what it checks)
# for SECONDS of chaos on a release build. 5 local nodes; one at a time is kill -9'd (the
# chief 40% of the time) and restarted while command jobs are submitted to random nodes; a
# checker then asserts that every acknowledged submit exists on every node and succeeds, that
# no term had two chiefs, and that no job ran two attempts at once.
#
#   scripts/chaos.sh [SECONDS]        (or CHAOS_SECONDS; default 300)
#   CHAOS_SEED=N scripts/chaos.sh     replays a run's choices (the seed is printed first)
#
# Bounded in time: the build, then the run under `timeout` (SECONDS plus 6 minutes for
# forming, recoveries and the wait for every job). Prints the test's summary line last:
#   chaos seconds=… submits=… acked=… kills=… chiefs_per_term_max=… overlapping_attempts=…
#   lost_acked=… (then details)
# and exits non-zero when the checker found a violation.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-${CHAOS_SECONDS:-300}}"
case "$seconds" in
    '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
bound=$((seconds + 360))

cargo test --release --workspace --test chaos --no-run
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
CHAOS_SECONDS="$seconds" timeout "$bound" \
    cargo test --release --workspace --test chaos -- --nocapture 2>&1 | tee "$log" || rc=$?
summary=$(grep -E '^chaos seconds=' "$log" | tail -n 1 || true)
echo
if [ -n "$summary" ]; then
    echo "$summary"
else
    echo "chaos seconds=$seconds: no summary (the run did not reach its checker; exit $rc)"
fi
exit "$rc"
