#!/bin/sh
# Prints `api healthz_under_flood_ms_p99=N`: the 99th-percentile /healthz latency, in ms,
# while 1,100 idle connections hold a node that runs with 1,024 descriptors (the flood test
# of node/tests/security_api.rs, debug build).
set -eu
cd "$(dirname "$0")/.."
cargo test --workspace --test security_api -- --nocapture \
    an_idle_connection_flood_leaves_healthz_answering 2>&1 |
    grep '^api healthz_under_flood_ms_p99='
