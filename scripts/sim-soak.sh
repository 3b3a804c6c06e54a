#!/usr/bin/env bash
# The control plane and chief's simulation (node/src/control/sim) over many seeds: a longer
# soak than the few seeds `cargo test` runs. A failing seed is printed with the line that
# replays it (SIM_SEED=<seed> cargo test -p ringleader --lib control::sim).
#
# Usage: scripts/sim-soak.sh [SEEDS] [FIRST]
#   SEEDS  how many seeds (default 200); FIRST the first (default: drawn at random, printed)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-200}"
first="${2:-$(( (RANDOM << 15 | RANDOM) + 1000 ))}"
for n in "$seeds" "$first"; do
    case "$n" in
        '' | *[!0-9]*) echo "usage: $0 [SEEDS] [FIRST] (whole numbers)" >&2; exit 2 ;;
    esac
done
echo "sim-soak: seeds $first..$((first + seeds - 1))"
SIM_SEEDS="$seeds" SIM_SEED_FROM="$first" \
    cargo test -p ringleader --lib control::sim -- --nocapture --test-threads 1
