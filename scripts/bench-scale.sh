#!/usr/bin/env bash
# Scale benchmark: N real nodes on 127.0.0.1 per size given (default 8 32 128), one line each:
#   scale nodes=N converge_s=… detect_s=… failover_s=… submit_ms_p50=… submit_ms_p99=…
#         wide_job_s=… status_ms=… chief_cpu_pct=… node_rss_mb=… idle_cpu_pct=… chief_kib_per_entry=…
# (node/bench/src/scale.rs says how each figure is taken). Every node shares this host's
# cores: at large N the figures are those of an oversubscribed host. Raises the open-files
# limit (each node holds a connection to many others).
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo build --release --workspace --bin ringleader --bin ringleader-bench >&2
[ $# -gt 0 ] || set -- 8 32 128
exec target/release/ringleader-bench scale "$@"
