#!/usr/bin/env bash
# The chief at size, sans IO: prints `decide …` and `apply …` lines.
#   decide members=M jobs=J ms_p50/ms_p99   chief::decide over a settled state (every job
#                                           running), the target being ≤ 10 ms at 1000 × 10000
#   decide … pending=J ms                   the one decision that places all J pending jobs
#   apply … us_per_entry                    ControlState::apply of the submits and placements,
#                                           and of metric reports (kind=metric)
# Options are passed through (--members, --jobs, --runs). PROFILE=debug skips the release
# build and runs target/debug/ringleader.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${PROFILE:-release}"
if [ "$profile" = release ]; then
  cargo build --release --workspace --bin ringleader --bin ringleader-bench >&2
else
  cargo build --workspace --bin ringleader --bin ringleader-bench >&2
fi
exec "target/$profile/ringleader-bench" chief "$@"
