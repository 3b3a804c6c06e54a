#!/usr/bin/env bash
# The systemd unit's test (deploy/systemd/ringleader.service): `systemd-analyze verify` on the
# unit as installed (its ExecStart pointed at the binary the tests built, its EnvironmentFile
# at deploy/systemd/node.env) must pass and say nothing (an unknown or misspelt key is only a
# warning there, so any output fails), and `systemd-analyze security --offline` prints the
# unit's exposure score. This machine kind runs no systemd as PID 1, so the unit is not
# started here; without systemd-analyze the test prints SKIPPED.
#
#   scripts/test-systemd.sh [RINGLEADER_BINARY]   (default: target/debug/ringleader)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/debug/ringleader}")
command -v systemd-analyze >/dev/null || {
    echo "SKIPPED (systemd test): no systemd-analyze"
    exit 0
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|/usr/local/bin/ringleader|$bin|; s|/etc/ringleader/node.env|$PWD/deploy/systemd/node.env|" \
    deploy/systemd/ringleader.service > "$tmp/ringleader.service"
out=$(systemd-analyze verify --man=no "$tmp/ringleader.service" 2>&1) || {
    echo "systemd test: systemd-analyze verify failed: $out"
    exit 1
}
[ -z "$out" ] || {
    echo "systemd test: systemd-analyze verify warns: $out"
    exit 1
}
# The flags in node.env are the node's (a flag it does not know would stop the service).
# shellcheck disable=SC1091
. deploy/systemd/node.env
# shellcheck disable=SC2086 # the flags are words
"$bin" node --data-dir "$tmp/data" $RINGLEADER_NODE_ARGS --help >/dev/null
score=$(systemd-analyze security --offline=true "$tmp/ringleader.service" 2>/dev/null | tail -n1 || true)
echo "systemd test: ok (verify clean; ${score:-no exposure score})"
