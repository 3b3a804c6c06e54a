#!/usr/bin/env bash
# The control plane and chief's simulation (node/services/src/sim) over many seeds: a longer
# soak than the 16 seeds `cargo test` runs. The simulation runs on a virtual clock, so a seed
# costs only its work: about half a second of one core in a debug build (200 seeds, the
# default, in about 2 minutes on an idle core). A failing seed is printed with its last steps
# and the line that replays it exactly (SIM_SEED=<seed> cargo test -p ringleader-services --lib
# sim::); the first seed is also run twice and its two traces compared.
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
    cargo test -p ringleader-services --lib sim:: -- --nocapture --test-threads 1
