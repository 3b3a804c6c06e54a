"""ringleader.checkpoint: clear errors outside a rank; and on a real node, ASHA searches of
command trials that save each epoch and load at start, asserted from every run's log on
the node (no epoch trained twice):

- `resumable = true`: each run trains to its rung and exits; a promoted trial's next run
  resumes from the epoch it saved at its rung (a command trial's script, and a `launch`ed
  function, which also runs on past its rung, stopped by `report`);
- a resumable run that goes on past its rung (reports beyond it, then sleeps) is stopped
  by its node, counts as having reached its rung, and its report beyond is no result;
- without it (every run targets max_resource, ASHA stops the laggards): each trial fails
  once after its second epoch, and its re-run (`max_trial_failures`) resumes from there."""

import collections
import glob
import os
import re
import sys
import textwrap
import time

import pytest

import ringleader
from ringleader import checkpoint

from conftest import JOB_WAIT_S


def test_outside_a_rank_save_and_load_say_where_they_work(monkeypatch):
    monkeypatch.delenv(checkpoint.URL_ENV, raising=False)
    monkeypatch.delenv(checkpoint.TOKEN_ENV, raising=False)
    with pytest.raises(ringleader.CheckpointError, match="command job or a command trial"):
        checkpoint.save({"epoch": 1})
    with pytest.raises(ringleader.CheckpointError, match="command job or a command trial"):
        checkpoint.load()


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "a b", "x" * 65, 3])
def test_bad_names_are_refused_before_any_request(monkeypatch, name):
    monkeypatch.setenv(checkpoint.URL_ENV, "http://127.0.0.1:9/v1/checkpoints/job/j-1")
    monkeypatch.setenv(checkpoint.TOKEN_ENV, "0" * 64)
    with pytest.raises(ringleader.CheckpointError, match="checkpoint name"):
        checkpoint.load(name)


TRIAL = textwrap.dedent("""
    import sys, ringleader
    from ringleader import checkpoint
    lr = ringleader.params()["lr"]
    state = checkpoint.load()
    start = state["epoch"] if state else 0
    if state:
        print(f"resumed from epoch {start}", flush=True)
    raw = checkpoint.load("raw")
    assert raw in (None, b"raw bytes"), raw
    checkpoint.save(b"raw bytes", name="raw")
    try:
        for epoch in range(start + 1, 4):
            print(f"trained epoch {epoch}", flush=True)
            checkpoint.save({"epoch": epoch})
            ringleader.report(epoch, acc=lr * epoch)
            if epoch == 2 and state is None:
                print("failing once after epoch 2", flush=True)
                sys.exit(3)
    except ringleader.Stopped:
        print("stopped", flush=True)
""")


def runs_ended(client, trials, timeout=JOB_WAIT_S):
    """Waits until every trial's job has ended (its last run's process exited, its log
    flushed): a search may end as its last trial reports, before that run exits."""
    deadline = time.monotonic() + timeout
    for t in trials:
        job = client.job(t["job"])
        while job.state not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, f"trial {t['id']}'s job {job.id}: {job.state}"
            time.sleep(0.1)
            job.refresh()


def runs_trained_once(client, node, search, n):
    """Waits for `search` (`n` trials, some promoted) and the end of every run; returns
    `(trial, its runs' logs, Counter of the epochs trained, promoted)` per trial, asserting
    from the logs that no epoch was trained twice (`trained epoch N` lines)."""
    doc = search.wait(timeout=JOB_WAIT_S * 2)
    assert doc["state"] == "succeeded", doc
    trials = search.trials()
    assert len(trials) == n, trials
    assert any(t["promotions"] >= 1 for t in trials), trials
    runs_ended(client, trials)
    out = []
    for t in trials:
        logs = run_logs(node, t["job"])
        trained = collections.Counter(int(n) for n in re.findall(r"trained epoch (\d+)", logs))
        assert all(n == 1 for n in trained.values()), (t, logs)  # no epoch trained twice
        out.append((t, logs, trained, t["promotions"] >= 1))
    return out


def run_logs(node, job_id):
    """Every run's log of job `job_id` on the node: all its generations and workers."""
    text = []
    for path in sorted(glob.glob(os.path.join(node.data_dir, "jobs", job_id, "**", "*.log"),
                                 recursive=True)):
        with open(path, errors="replace") as f:
            text.append(f.read())
    return "\n".join(text)


def test_an_asha_search_of_command_trials_resumes_from_their_checkpoints(client, node,
                                                                         rank_env):
    search = client.submit({
        "name": "py-asha-ckpt", "kind": "search", "command": ["python3", "trial.py"],
        "files": [{"path": "trial.py", "text": TRIAL}],
        "env": rank_env,
        "search": {"trial": "command", "algorithm": "asha", "metric": "acc",
                   "direction": "max", "trials": 4, "max_parallel": 2, "seed": 3,
                   "min_resource": 1, "max_resource": 3, "reduction_factor": 3,
                   "max_trial_failures": 10,
                   "params": {"lr": ringleader.uniform(0.1, 1.0)}},
    })
    doc = search.wait(timeout=JOB_WAIT_S * 2)
    trials = search.trials()
    assert len(trials) == 4, trials
    resumed = 0
    for t in trials:
        logs = run_logs(node, t["job"])
        trained = collections.Counter(int(n) for n in re.findall(r"trained epoch (\d+)", logs))
        assert all(n == 1 for n in trained.values()), (t, logs)  # no epoch trained twice
        if "failing once after epoch 2" in logs and t["state"] != "stopped":
            # The re-run of this trial found what its first run saved. (A trial ASHA
            # stopped at rung 1 may still have failed after epoch 2: it is not re-run.)
            assert "resumed from epoch 2" in logs, (t, logs)
            assert trained == {1: 1, 2: 1, 3: 1}, (t, logs)
            assert t["state"] == "succeeded", (t, doc)
            resumed += 1
        else:
            assert "resumed from" not in logs, (t, logs)
    # The first trial at a rung always goes on, so at least one trial reached epoch 2.
    assert resumed >= 1, (trials, doc)
    assert doc["state"] == "succeeded", doc


RESUMABLE_TRIAL = textwrap.dedent("""
    import ringleader
    from ringleader import checkpoint
    lr = ringleader.params()["lr"]
    rung = ringleader.trial()["rung"]
    state = checkpoint.load()
    start = state["epoch"] if state else 0
    if state:
        print(f"resumed from epoch {start}", flush=True)
    try:
        for epoch in range(start + 1, rung + 1):
            print(f"trained epoch {epoch}", flush=True)
            checkpoint.save({"epoch": epoch})        # before the report that may promote it
            ringleader.report(epoch, acc=lr * epoch)
    except ringleader.Stopped:
        print("stopped", flush=True)
""")


def submit_resumable(client, name, script, env, *, trials, max_parallel):
    """An ASHA search (rungs 1 and 3) of `script`'s command trials with `resumable = true`,
    maximising `acc` over `lr`."""
    return client.submit({
        "name": name, "kind": "search", "command": ["python3", "trial.py"],
        "files": [{"path": "trial.py", "text": script}],
        "env": env,
        "search": {"trial": "command", "algorithm": "asha", "metric": "acc",
                   "direction": "max", "trials": trials, "max_parallel": max_parallel,
                   "seed": 5, "min_resource": 1, "max_resource": 3, "reduction_factor": 3,
                   "resumable": True,
                   "params": {"lr": ringleader.uniform(0.1, 1.0)}},
    })


def test_asha_promotes_resumable_command_trials_which_resume_from_their_rung(client, node,
                                                                              rank_env):
    search = submit_resumable(client, "py-asha-resume", RESUMABLE_TRIAL, rank_env, trials=6,
                              max_parallel=2)
    for t, logs, trained, promoted in runs_trained_once(client, node, search, 6):
        if promoted:
            # Each promotion re-ran the trial's job towards the next rung; it went on from
            # the epoch it had saved at its rung.
            assert "resumed from epoch 1" in logs, (t, logs)
            assert trained == {1: 1, 2: 1, 3: 1}, (t, logs)
            assert t["resource"] == 3 and t["state"] == "succeeded", t
        else:
            assert "resumed from" not in logs and trained == {1: 1}, (t, logs)


def resuming(run_past_the_rung):
    """A function for `launch(..., resumable=True)`: loads its checkpoint, trains from the
    saved epoch to its rung (or on towards 100 epochs, which `report` ends after the rung),
    saving before each report."""

    def train(lr):
        state = checkpoint.load()
        start = state["epoch"] if state else 0
        if state:
            print(f"resumed from epoch {start}", flush=True)
        end = 100 if run_past_the_rung else ringleader.trial()["rung"]
        try:
            for epoch in range(start + 1, end + 1):
                print(f"trained epoch {epoch}", flush=True)
                checkpoint.save({"epoch": epoch})
                ringleader.report(epoch, acc=lr * epoch)
        except ringleader.Stopped:
            print("stopped past the rung", flush=True)
            raise                                   # the runner ends the run with exit 0
        return None

    return train


@pytest.mark.parametrize("run_past_the_rung", [False, True], ids=["to-the-rung", "past-it"])
def test_asha_promotes_a_launched_function_which_resumes_from_its_checkpoint(
        client, node, rank_env, run_past_the_rung):
    pytest.importorskip("cloudpickle")
    search = client.launch(resuming(run_past_the_rung), {"lr": ringleader.uniform(0.1, 1.0)},
                           algorithm="asha", resumable=True, metric="acc", trials=6,
                           max_parallel=2, resource=3, min_resource=1, reduction_factor=3,
                           seed=5, python=sys.executable, env=rank_env)
    for t, logs, trained, promoted in runs_trained_once(client, node, search, 6):
        assert "Traceback" not in logs, (t, logs)
        # Every run ended by itself, at its rung or at the report after it.
        assert "reached its rung" not in logs, (t, logs)
        if promoted:
            assert t["resource"] == 3 and t["state"] == "succeeded", t
            saved = 2 if run_past_the_rung else 1
            assert f"resumed from epoch {saved}" in logs, (t, logs)
            assert set(trained) == set(range(1, 5 if run_past_the_rung else 4)), (t, logs)
        else:
            assert "resumed from" not in logs, (t, logs)
            assert set(trained) == ({1, 2} if run_past_the_rung else {1}), (t, logs)
        assert ("stopped past the rung" in logs) == run_past_the_rung, (t, logs)


PAST_THE_RUNG = textwrap.dedent("""
    import os, signal, time
    rung = int(os.environ["RINGLEADER_TRIAL_RESOURCE"])
    trial = int(os.environ["RINGLEADER_TRIAL_ID"])
    lr = float(os.environ["RINGLEADER_PARAM_LR"])
    assert os.environ["RINGLEADER_TRIAL_RESUMABLE"] == "1"
    with open(os.path.join(os.environ["PID_DIR"], f"{trial}-{rung}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if trial % 2:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)    # only SIGKILL ends this one
    print(f"ringleader-report {rung} acc {lr * rung}", flush=True)
    print(f"ringleader-report {rung + 1} acc 1000", flush=True)   # past the rung: no result
    time.sleep(600)
""")


def test_a_resumable_run_still_going_past_its_rung_is_stopped_and_reached_it(
        client, node, rank_env, tmp_path):
    search = submit_resumable(client, "py-past-rung", PAST_THE_RUNG,
                              {**rank_env, "PID_DIR": str(tmp_path)}, trials=3, max_parallel=3)
    doc = search.wait(timeout=JOB_WAIT_S * 2)
    assert doc["state"] == "succeeded", doc
    trials = search.trials()
    assert len(trials) == 3, trials
    # The first at rung 1 goes on; the top third of three is promoted to 3.
    promoted = [t for t in trials if t["promotions"] >= 1]
    assert len(promoted) >= 1, trials
    for t in trials:
        assert t["state"] in ("succeeded", "stopped"), t      # paused ones end stopped
        assert t["metric"] is not None and t["metric"] < 1000, t
        assert t["resource"] == (3 if t in promoted else 1), t
    assert search.best["metric"] < 1000, search.best
    pids = sorted(glob.glob(os.path.join(tmp_path, "*.pid")))
    assert len(pids) == len(trials) + sum(t["promotions"] for t in trials), pids
    deadline = time.monotonic() + JOB_WAIT_S
    for path in pids:
        with open(path) as f:
            pid = int(f.read())
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pid}"), f"{path}: process {pid} still runs"
    runs_ended(client, trials)
    for t in trials:
        job = client.job(t["job"])
        assert job.state == "succeeded", (t, job.doc)
        logs = run_logs(node, t["job"])
        assert "reached its rung" in logs, (t, logs)
