#!/usr/bin/env bash
# Elastic-training benchmark: one line per fault,
#   elastic fault=worker-kill|host-kill|hang|straggler|join detect_s=… recover_s=… steps_lost=…
# on a fresh local 3-node cluster per fault training the digits MLP on 3 workers
# (min_workers = 2, in-memory commits every 10 steps); see node/bench/src/elastic.rs for
# what each fault does and what each figure measures. The straggler fault needs root and the
# cgroup v1 cpu controller (it says "skipped" otherwise).
# When torch is installed, the same worker kill against PyTorch's own elastic path (torchrun
# --nnodes 1:4 --max-restarts 3) is printed beside ours (scripts/baseline_elastic_torchrun.py).
# Options are passed through (e.g. --faults worker-kill,hang).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bin ringleader --bin ringleader-bench >&2
target/release/ringleader-bench elastic "$@"
if python3 -c "import torch" 2>/dev/null && [ -f scripts/baseline_elastic_torchrun.py ]; then
    # As the issue asks (torchrun's default rendezvous waits last_call_timeout = 30 s for
    # more nodes at every restart), then with that wait cut to 1 s.
    python3 scripts/baseline_elastic_torchrun.py
    python3 scripts/baseline_elastic_torchrun.py --rdzv-conf last_call_timeout=1 | sed 's/^elastic impl=torchrun /elastic impl=torchrun-last-call-1s /'
else
    echo "# torchrun baseline skipped: torch is not installed (scripts/install-baselines.sh)"
fi
