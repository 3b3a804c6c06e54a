#!/usr/bin/env python3
"""Tests of scripts/bench_sharing.py: the figures of the sharing benchmark computed from a
fabricated record (two nodes' worth of job documents and metric histories whose answers are
worked out by hand below), the entitlement's water-filling, the timeline's idle samples and
the trace's determinism.
Run by scripts/test.sh."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sharing as bs  # noqa: E402

S = 1000  # ms in a second: every time below is in seconds from 0


def ev(at_s, what, reason="", ring=()):
    return {"at_ms": int(at_s * S), "what": what, "generation": 0, "reason": reason,
            "ring": list(ring)}


def doc(jid, owner, kind, workers, submitted_s, events, step=None, trial_of=None):
    d = {"id": jid, "owner": owner, "kind": kind, "workers": workers,
         "submitted_at_ms": int(submitted_s * S), "events": events, "step": step,
         "ring": []}
    if trial_of:
        d["trial_of"] = {"search": trial_of, "trial": 0, "copy": False}
    return d


def record():
    """A cluster of 4 slots, alice (weight 1) and bob (weight 1), over 100 s:

    - j-1 alice, elastic train of 4, placed at 0 on 4 ranks, shrunk to 2 at 50 for j-3,
      succeeded at 80 (step 1000, no step lost).
    - j-2 alice, rigid command of 2, submitted at 10, waits to 80 (the cluster is full),
      runs to 100.
    - j-3 bob, high command of 2, submitted at 48, placed at 50 (after the shrink), ends
      at 80.
    - j-4 bob, search; its trial j-5 (1 worker) is submitted at 90 and never starts (ended
      as cancelled at 100).
    """
    jobs = {
        "j-1": doc("j-1", "alice", "train", 4, 0, [
            ev(0, "submitted"), ev(0, "placed", "start", "abcd"),
            ev(50, "reformed", "preempted for j-3 (bob, priority high): shrunk 4 → 2 "
               "(global batch kept)", "ab"),
            ev(80, "succeeded")], step=1000),
        "j-2": doc("j-2", "alice", "command", 2, 10, [
            ev(10, "submitted"), ev(80, "placed", "start", "ab"), ev(100, "succeeded")]),
        "j-3": doc("j-3", "bob", "command", 2, 48, [
            ev(48, "submitted"), ev(50, "placed", "start", "cd"), ev(80, "succeeded")]),
        "j-4": doc("j-4", "bob", "search", 1, 90, [ev(90, "submitted"), ev(100, "cancelled")]),
        "j-5": doc("j-5", "bob", "train", 1, 90, [ev(90, "submitted"), ev(100, "cancelled")],
                   trial_of="j-4"),
    }
    metrics = {
        "j-1": {"steps_lost": [[0, 0.0]], "step": [[10, 10.0], [500, 500.0], [1000, 1000.0]]},
        "j-2": {"lost_steps": [[0, 0.0]]},
        "j-3": {"lost_steps": [[0, 0.0]]},
    }
    trace = [
        {"name": "t", "priority": "normal"}, {"name": "r", "priority": "low"},
        {"name": "h", "priority": "high"}, {"name": "s", "priority": "low"},
    ]
    return {"policy": "fair", "capacity": 4, "step_s": 0.5,
            "users": {"alice": {"cpus": 2, "weight": 1}, "bob": {"cpus": 2, "weight": 1}},
            "trace": trace, "logical": {"t": ["j-1"], "r": ["j-2"], "h": ["j-3"], "s": ["j-4"]},
            "cancels": [], "collected_at_ms": 100 * S, "jobs": jobs, "metrics": metrics}


class Figures(unittest.TestCase):
    def test_utilization_counts_held_ranks_against_what_the_demand_could_use(self):
        f = bs.figures(record())
        # Held: j-1 4×50 + 2×30 = 260, j-2 2×20 = 40, j-3 2×30 = 60: 360 rank-s.
        # Offered: min(4, demand): 4 until 80 (j-1 alone asks 4), then j-2's 2, and 3 from
        # 90 with the trial that never starts: 320 + 20 + 30 = 370.
        self.assertAlmostEqual(f["utilization"], 360 / 370)

    def test_waits_are_per_trace_job_and_a_search_waits_for_its_first_trial(self):
        f = bs.figures(record())
        # t 0, r 70, h 2, s 10 (no trial started: to the end of the record).
        self.assertEqual(f["jobs"], 4)
        self.assertAlmostEqual(f["wait_p50_s"], 2.0)
        self.assertAlmostEqual(f["wait_p95_s"], 70.0)
        self.assertAlmostEqual(f["high_wait_p95_s"], 2.0)

    def test_shrink_s_is_the_requesters_start_after_the_decision_to_shrink(self):
        rec = record()
        # j-3 waits from its submit at 48; the shrink is decided at 49 (its reason).
        rec["jobs"]["j-3"]["events"].insert(
            1, ev(49, "unplaceable", "gang of 2: at most 0 fit now; preempting j-1 (shrink to 2)"))
        f = bs.figures(rec)
        self.assertAlmostEqual(f["shrink_s_p50"], 1.0)
        self.assertAlmostEqual(f["shrink_s_max"], 1.0)
        self.assertEqual(f["steps_lost"], 0)
        self.assertEqual(f["lost_work_s"], 0.0)
        # No reason named it: from the shrink's re-form (50), the placement at once.
        self.assertAlmostEqual(bs.figures(record())["shrink_s_max"], 0.0)

    def test_jain_is_one_when_each_user_gets_its_entitlement(self):
        # Busy 0..100. alice's demand: 4 (0..10), 6 (10..48), then 6 to 100; bob's 2 from 48
        # (3 from 90 with the trial). Entitled: alice 4×48 + 2×42 + 1.5×10 = 291 (what is
        # left when bob's demand is below the half), bob 2×42 + 2.5×10 = 109... but held:
        # alice 340 + 40 = 380, bob 60.
        rec = record()
        f = bs.figures(rec)
        self.assertLess(f["jain"], 1.0)
        # Give bob his share: j-3 runs on 2 ranks from 48 to 100 and j-1 on 2 (alice 2):
        # each user holds what water-filling entitles it to once bob asks.
        jobs = rec["jobs"]
        jobs["j-1"]["events"] = [ev(0, "submitted"), ev(0, "placed", "start", "abcd"),
                                 ev(48, "reformed", "preempted for j-3 (bob, priority high): "
                                    "shrunk 4 → 2 (global batch kept)", "ab"),
                                 ev(100, "succeeded")]
        jobs["j-3"]["events"] = [ev(48, "submitted"), ev(48, "placed", "start", "cd"),
                                 ev(100, "succeeded")]
        jobs["j-2"]["events"] = [ev(10, "submitted"), ev(100, "cancelled")]
        del jobs["j-5"], jobs["j-4"]
        rec["logical"] = {"t": ["j-1"], "r": ["j-2"], "h": ["j-3"]}
        self.assertAlmostEqual(bs.figures(rec)["jain"], 1.0)

    def test_a_requeue_counts_its_reported_lost_steps_and_its_wait_again(self):
        rec = record()
        rec["jobs"]["j-2"]["events"] = [
            ev(10, "submitted"), ev(80, "placed", "start", "ab"),
            ev(90, "preempted", "preempted for j-9 (bob, priority high): asked to checkpoint "
               "and stop (SIGTERM, SIGKILL after 10 s)"),
            ev(92, "preempted", "preempted for j-9 (bob, priority high): checkpointed and "
               "requeued"),
            ev(95, "placed", "start", "ab"), ev(100, "succeeded")]
        rec["metrics"]["j-2"] = {"lost_steps": [[0, 0.0], [1, 6.0]]}
        f = bs.figures(rec)
        # 6 steps of 0.5 s on 2 ranks; waits 70 + 3 s; j-9 was served by a stop, but j-3
        # by its shrink alone.
        self.assertAlmostEqual(f["lost_work_s"], 6.0)
        self.assertAlmostEqual(f["wait_p95_s"], 73.0)
        self.assertEqual(f["shrinks"], 1)

    def test_a_shrunk_rings_step_going_back_counts_as_steps_lost(self):
        rec = record()
        rec["metrics"]["j-1"] = {"steps_lost": [[0, 0.0], [1, 3.0]],
                                 "step": [[10, 10.0], [500, 500.0], [495, 495.0], [1000, 1000.0]]}
        f = bs.figures(rec)
        self.assertEqual(f["steps_lost"], 8)
        # 8 steps of a job that held 260 rank-s over 1000 steps.
        self.assertAlmostEqual(f["lost_work_s"], 8 * 260 / 1000)

    def test_a_train_jobs_step_going_back_is_read_from_the_values(self):
        rec = record()
        # The trainer's `step` reports carry no step: x is the report's sequence number.
        # Back from 500 to 120 once (380 steps), then on: the steps after count no more.
        rec["metrics"]["j-1"] = {"step": [[0, 10.0], [1, 500.0], [2, 120.0], [3, 300.0],
                                          [4, 1000.0]]}
        self.assertEqual(bs.figures(rec)["steps_lost"], 380)

    def test_a_reform_loss_that_several_survivors_report_counts_once(self):
        rec = record()
        # j-1 starts fresh on 4 ranks (each reports step 0 restored, 0 lost), then its
        # shrink to 2 at step 500 goes back to the commit at 495: both survivors report it.
        rec["metrics"]["j-1"] = {
            "restored_step": [[k, 0.0] for k in range(4)] + [[4, 495.0], [5, 495.0]],
            "steps_lost": [[k, 0.0] for k in range(4)] + [[4, 5.0], [5, 5.0]],
            "step": [[10, 10.0], [500, 500.0], [1000, 1000.0]]}
        f = bs.figures(rec)
        self.assertEqual(f["steps_lost"], 5)
        self.assertAlmostEqual(f["lost_work_s"], 5 * 260 / 1000)
        # Two re-forms at different steps are two losses.
        rec["metrics"]["j-1"]["restored_step"][5] = [5, 700.0]
        self.assertEqual(bs.figures(rec)["steps_lost"], 10)

    def test_the_line_names_every_figure(self):
        text = bs.line(bs.figures(record()))
        keys = [kv.split("=")[0] for kv in text.split()[1:]]
        self.assertEqual(keys, ["policy", "jobs", "utilization", "wait_p50_s", "wait_p95_s",
                                "high_wait_p95_s", "jain", "lost_work_s", "shrink_s_p50",
                                "shrink_s_max", "steps_lost"])


class Entitlement(unittest.TestCase):
    def test_water_filling_gives_what_one_cannot_use_to_the_others(self):
        ent = bs.water_fill(12, {"a": 10, "b": 1, "c": 10}, {"a": 2, "b": 1, "c": 1})
        self.assertAlmostEqual(ent["b"], 1)
        self.assertAlmostEqual(ent["a"], 11 * 2 / 3)
        self.assertAlmostEqual(ent["c"], 11 / 3)
        self.assertEqual(bs.water_fill(12, {"a": 0, "b": 0}, {"a": 1, "b": 1}),
                         {"a": 0.0, "b": 0.0})


class Timeline(unittest.TestCase):
    def test_idle_lists_the_samples_where_a_waiting_job_fit_the_free_slots(self):
        rec = {"capacity": 4, "timeline": [
            {"at_ms": 1000, "held": {"j-1": 4}, "queue": [
                {"id": "j-2", "workers": 1, "reason": "waiting for 1 cpu: 0 free"}]},
            {"at_ms": 2000, "held": {"j-1": 2}, "queue": [
                {"id": "j-2", "workers": 2, "reason": "waiting for 2 cpus: 0 free"},
                {"id": "j-3", "workers": 3, "reason": "gang of 3: at most 2 fit now"}]},
            {"at_ms": 3000, "held": {}, "queue": []}]}
        self.assertEqual(bs.idle(rec), [(1.0, 2, [("j-2", 2, "waiting for 2 cpus: 0 free")])])
        self.assertEqual(bs.idle({"capacity": 4}), [])


class Trace(unittest.TestCase):
    def test_the_trace_is_seeded_and_spreads_its_arrivals(self):
        a, b = bs.trace(1, 1.0), bs.trace(1, 1.0)
        self.assertEqual(a, b)
        self.assertNotEqual(a, bs.trace(2, 1.0))
        self.assertLessEqual(max(j["at_s"] for j in a), bs.ARRIVALS_S)
        kinds = {j["kind"] for j in a}
        self.assertEqual(kinds, {"train", "command", "search"})
        self.assertEqual(sum(j["priority"] == "high" for j in a), 2)
        # The elastic train jobs are low like the rigid ones, so a high job's victims are
        # shrunk before any rigid job is requeued (the least lost work at equal priority).
        self.assertEqual({j["priority"] for j in a if j["kind"] == "train"}, {"low"})
        cal = {"steps_per_s": 1000.0, "trial_steps_per_s": 2000.0,
               "trial_steps_per_epoch": 40.0}
        for j in a:
            s = bs.spec(j, "/tmp/x", cal)
            self.assertEqual(s["name"], j["name"])
            if j["kind"] == "train":
                self.assertLess(s["min_workers"], s["workers"])
                # Sized in seconds: its steps at the calibrated rate, a checkpoint every 2 s.
                self.assertEqual(s["train"]["max_steps"], round(j["seconds"] * 1000))
                self.assertEqual(s["checkpoint"]["every_steps"], 2000)
            if j["kind"] == "search":
                self.assertEqual(s["train"]["epochs"], round(j["seconds"] * 2000 / 40))


if __name__ == "__main__":
    unittest.main()
