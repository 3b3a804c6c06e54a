#!/bin/sh
# Prints two kinds of lines.
#
# Prints `api healthz_under_flood_ms_p99=N`: the 99th-percentile /healthz latency, in ms,
# while 1,100 idle connections hold a node that runs with 1,024 descriptors (the flood test
# of node/tests/security_api.rs, debug build).
set -eu
cd "$(dirname "$0")/.."
cargo test --workspace --test security_api -- --nocapture \
    an_idle_connection_flood_leaves_healthz_answering 2>&1 |
    grep '^api healthz_under_flood_ms_p99='

# Prints `api status members=1000 jobs=10000 query=Q ms=N bytes=N` for the default page, a
# filtered one and the unbounded lists: building and serializing GET /v1/status's document
# of a synthetic cluster, without I/O (node/api/src/status/listing/tests.rs, debug build).
cargo test --workspace --lib -- --nocapture status::listing::tests::bench_status_at_size 2>&1 |
    grep '^api status '
