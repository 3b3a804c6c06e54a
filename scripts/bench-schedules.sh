#!/usr/bin/env bash
# Allreduce schedules at many ranks, from the sans-IO schedules (counts, not measurements):
# prints `schedule algo=ring|hierarchical|recursive_doubling ranks=N hosts=H … rounds=…
# rank_mib=… host_nic_mib=… local_mib=…` for N = 64, 256, 1024 ranks, 8 a host, 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bin schedule-counts >&2
exec target/debug/schedule-counts
