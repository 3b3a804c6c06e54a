#!/usr/bin/env bash
# Membership benchmark: prints `membership FIGURE=VALUE` lines.
#   join_converge_s   5 real nodes on 127.0.0.1: first joiner started → all see 5 alive
#   detect_s          kill -9 → dead on every survivor (median of 5; detect_s_all lists them)
#   false_suspicions  suspicions raised among the live nodes during 60 s with every core busy
#   sim_*_{100,1000}  the in-memory simulation at default settings (joins through one member)
#   sim members=N     a settled simulation at 1000 and 10000 members with 1 % loss:
#                     death_spread_s (kill → dead everywhere), false_suspicions and
#                     bytes/updates/pieces per member per second over 30 s of steady state
#                     (10000 simulated members hold 10^8 view entries: about 13 GB of memory
#                     and 2 min of CPU in a debug build; --sim-settled 1000 skips it)
# Options are passed through (e.g. --burn-s 10 --sim 100 for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bin ringleader --bin ringleader-bench >&2
exec target/release/ringleader-bench membership "$@"
