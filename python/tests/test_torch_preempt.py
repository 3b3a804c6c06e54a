"""Preemption of an elastic PyTorch job (issue 49, points 4 and 8): a cluster of 4 nodes
runs a command job of 4 ranks (`[elastic] protocol = "ringleader"`, the book's script,
`torch_elastic_rank.py`); the admin shrinks it to 2 (`POST /v1/jobs/{id}/preempt`, what
`ringleader job preempt --shrink-to 2` sends) and grows it back to 4.

At the shrink the survivors keep their processes, lose no step, and keep the global batch:
`ElasticOptimizer` accumulates 2 micro-batches per step, so `samples_per_step` stays 4 × 32.
The grow brings a standby joiner in at each generation until the ring has 4 ranks again.

Waits poll with deadlines; nodes are stopped by PID (their ranks die with them). Without
torch: SKIPPED.
"""

import sys
import time

import pytest

try:
    import torch  # noqa: F401
except ImportError:
    pytest.skip("torch not installed", allow_module_level=True)

from conftest import PYTHON_DIR  # noqa: E402
from test_torch_elastic import (  # noqa: E402
    POLL_S, RANK_SCRIPT, RESUMED, WAIT_S, Cluster, alive, hashes, pids_of)


@pytest.fixture()
def cluster(tmp_path):
    c = Cluster(tmp_path / "cluster", n=4)
    yield c
    c.stop()


def test_a_torch_job_shrinks_for_a_preemption_keeps_its_batch_and_grows_back(cluster):
    client = cluster.client()
    job = client.submit({
        "name": "torch-preempt", "kind": "command", "workers": 4, "min_workers": 1,
        "max_restarts": 0, "command": [sys.executable, RANK_SCRIPT],
        "env": {"PYTHONPATH": PYTHON_DIR, "OMP_NUM_THREADS": "1", "STEP_SLEEP_S": "0.03"},
        # The grow may take a member back 1 s after it left (the default is 10 s).
        "elastic": {"protocol": "ringleader", "rejoin_after_s": 1},
    })
    job_id = job.id

    def wait(what, cond):
        deadline = time.monotonic() + WAIT_S
        while True:
            d = client.job(job_id).doc
            lines = cluster.logs(job_id)
            if cond(d, lines):
                return d, lines
            assert d["state"] in ("pending", "running"), (what, d["state"], lines[-40:])
            assert time.monotonic() < deadline, (what, d["history"], lines[-40:])
            time.sleep(POLL_S)

    def stepping(gen, world, steps=5):
        def cond(d, lines):
            seen = {}
            for s, g, r, w, _, _ in hashes(lines):
                if g == gen and w == world:
                    seen.setdefault(r, set()).add(s)
            return len(seen) == world and min(len(v) for v in seen.values()) >= steps
        return cond

    def samples_after(step):
        doc = client.request("GET", f"/v1/jobs/{job_id}/metrics")
        return [v for s, v in doc["metrics"].get("samples_per_step", []) if s > step]

    # Phase 1: 4 ranks step, 4 × 32 samples a step.
    _, lines = wait("4 ranks stepping", stepping(1, 4))
    before = pids_of(lines, 1)
    assert len(before) == 4

    # Phase 2: shrunk to 2 in one generation; the survivors keep their processes and state.
    client.request("POST", f"/v1/jobs/{job_id}/preempt",
                   {"action": {"shrink": {"to_workers": 2}}, "reason": "make room"})
    d, lines = wait("2 ranks stepping in generation 2", stepping(2, 2))
    assert d["history"][1]["reason"] == \
        "preempted (make room): shrunk 4 → 2 (global batch kept)", d["history"]
    after = pids_of(lines, 2)
    assert after == {0: before[0], 1: before[1]}, (before, after)
    assert all(alive(p) for p in after.values())
    lost = [int(m.group(2)) for m in map(RESUMED.match, lines) if m]
    assert lost and lost[-1] == 0, lost
    shrink_step = max(s for s, g, *_ in hashes(lines) if g == 1)
    deadline = time.monotonic() + WAIT_S
    while len(samples_after(shrink_step + 1)) < 2:
        assert time.monotonic() < deadline, "no samples_per_step after the shrink"
        time.sleep(POLL_S)
    kept = samples_after(shrink_step + 1)
    assert set(kept) == {128.0}, ("2 ranks × 2 micro-batches × 32", kept)

    # Phase 3: grown back to 4, a standby joiner at a time.
    client.request("POST", f"/v1/jobs/{job_id}/grow", {"to_workers": 4})
    d, lines = wait("4 ranks again", lambda d, _: len(d["ring"]) == 4)
    grown = [h["reason"] for h in d["history"] if h["reason"].startswith("grown")]
    assert [r.split(":")[0] for r in grown] == ["grown 2 → 3", "grown 3 → 4"], d["history"]
    assert all(r.split(": ")[1].startswith("capacity returned") for r in grown), grown
    gen = d["generation"]
    _, lines = wait("4 ranks stepping again", stepping(gen, 4))
    assert {r: p for r, p in pids_of(lines, gen).items() if r < 2} == after
    client.job(job_id).cancel()
