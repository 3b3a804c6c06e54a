#!/usr/bin/env bash
# Control-plane benchmark: prints `control FIGURE=VALUE` lines.
#   failover_s        5 nodes (3 voters): kill -9 the chief → every survivor names the same
#                     new chief (median of 5; failover_s_all lists them)
#   submit_ms_p50/99  submit latency to a follower (forwarded to the chief, committed)
#   jobs_per_s        3 nodes: trivial command jobs (`true`, 1 worker) submitted from a few
#                     threads, first submit → all succeeded (jobs_submit_s: submits alone)
# Options are passed through (e.g. --failover-runs 3 --jobs 100 for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bin ringleader --bin ringleader-bench >&2
exec target/release/ringleader-bench control "$@"
