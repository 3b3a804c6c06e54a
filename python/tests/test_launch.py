"""`Client.launch`: Python functions as a search's command trials on a real node (grid of a
number, a dict, ASHA on per-epoch reports, a function that raises, the default interpreter,
a shared dataset, progress while waiting, refusals in launch's terms), ASHA promotions that
resume from `ringleader.checkpoint` on a cluster of two, and the parts that need no node:
the size limit, the runner's interpreter check and install hint, the spec it writes, the
package's dependencies."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import ringleader
from ringleader import _launch, _runner

from conftest import JOB_WAIT_S, PYTHON_DIR, Node

pytest.importorskip("cloudpickle")


def quadratic(x, y):
    return -(x - 2) ** 2 - y


def accuracy_and_loss(x, k):
    return {"acc": x * k, "loss": 1.0 - x}


def epochs(lr):
    for epoch in range(1, 10):
        time.sleep(0.02)
        ringleader.report(epoch, score=lr * epoch / 9)


def raises(x):
    raise ValueError(f"bad x {x}")


def reads_the_dataset(k):
    """A trial that reads the shared dataset its launch named."""
    with open(os.path.join(ringleader.dataset_dir(), "value.txt")) as f:
        return float(f.read()) * k


def resumes(lr):
    """The book's resumable trial: from what the last run saved to this run's rung."""
    state = ringleader.checkpoint.load()
    if state:
        print(f"resumed at epoch {state['epoch']}", flush=True)
    start = state["epoch"] if state else 0
    for epoch in range(start + 1, ringleader.trial()["rung"] + 1):
        time.sleep(0.05)
        ringleader.checkpoint.save({"epoch": epoch})
        ringleader.report(epoch, score=lr * epoch)


def launch(client, rank_env, fn, params, **kw):
    """A launch whose trials import the package from this checkout, under this interpreter
    (which has cloudpickle: scripts/test.sh installs it)."""
    return client.launch(fn, params, python=sys.executable, env=rank_env, **kw)


def test_a_grid_of_a_function_returning_a_number_finds_the_best(client, rank_env):
    search = launch(client, rank_env, quadratic, {"x": [1, 2, 3], "y": [0, 1]})
    doc = search.wait(timeout=JOB_WAIT_S)
    assert doc["state"] == "succeeded"
    assert len(search.trials()) == 6
    assert all(t["state"] == "succeeded" for t in search.trials()), search.trials()
    best = search.best
    assert best["params"] == {"x": 2, "y": 0}
    assert best["metric"] == 0


def test_a_dict_return_with_distributions(client, rank_env):
    search = launch(client, rank_env, accuracy_and_loss,
                    {"x": ringleader.uniform(0, 1), "k": ringleader.randint(1, 3)},
                    algorithm="random", trials=4, metric="acc", seed=7)
    search.wait(timeout=JOB_WAIT_S)
    trials = search.trials()
    assert len(trials) == 4
    for t in trials:
        assert 0 <= t["params"]["x"] <= 1 and t["params"]["k"] in (1, 2, 3)
        assert t["metric"] == pytest.approx(t["params"]["x"] * t["params"]["k"])
    assert search.best["metric"] == pytest.approx(max(t["metric"] for t in trials))
    job = client.job(trials[0]["job"])
    assert "loss" in job.metrics()


def test_asha_acts_on_a_functions_reports(client, rank_env):
    # Trials that are not resumable: each runs to `resource`, and ASHA only stops.
    search = launch(client, rank_env, epochs, {"lr": [0.1, 0.2, 0.3, 0.5, 0.8, 1.0]},
                    algorithm="asha", trials=6, metric="score", resource=9,
                    min_resource=1, reduction_factor=3, max_parallel=3, resumable=False)
    search.wait(timeout=JOB_WAIT_S)
    trials = search.trials()
    best = search.best
    # The largest lr leads at every rung, so ASHA never cuts it: it runs all 9 epochs.
    top_lr = max(t["params"]["lr"] for t in trials)
    assert best["params"] == {"lr": top_lr}
    assert best["metric"] == pytest.approx(top_lr)
    # Trials start 3 at a time, so a later small lr meets the leaders' rung-1 values and
    # is cut there: SIGTERM, then Stopped at its next report, and the runner exits 0.
    assert any(t["state"] == "stopped" for t in trials), trials
    top = next(t for t in trials if t["id"] == best["id"])
    assert top["resource"] == 9
    # Every metric is a report the function printed: lr · epoch / 9 at the last epoch.
    for t in trials:
        if t["metric"] is not None:
            assert t["metric"] == pytest.approx(t["params"]["lr"] * t["resource"] / 9)


def test_every_promoted_trial_of_an_asha_launch_resumes_from_its_checkpoint(tmp_path,
                                                                           rank_env):
    # Two nodes of two cpus, each with a store of its own (the default), four trials at
    # once: a paused trial's node is often full when it is promoted while the other has
    # room. Its next run waits for its own node, whose store holds its checkpoint. No
    # speculative copies: a copy runs on another node by design, where this store has none.
    first = Node(tmp_path / "r0", name="r0", cpus=2)
    nodes = [first]
    try:
        with open(os.path.join(first.data_dir, "node.json")) as f:
            seed = json.load(f)["p2p_addrs"][0]
        nodes.append(Node(tmp_path / "r1", name="r1", cpus=2,
                          extra=("--cluster-key", os.path.join(first.data_dir, "cluster.key"),
                                 "--join", seed)))
        client = first.client()
        deadline = time.monotonic() + JOB_WAIT_S
        while sum(m["state"] == "alive" for m in client.status()["members"]) < 2:
            assert time.monotonic() < deadline, "the second node did not join"
            time.sleep(0.1)
        # launch's default for ASHA: resumable trials.
        search = launch(client, rank_env, resumes, {"lr": ringleader.uniform(0.1, 1.0)},
                        algorithm="asha", trials=12, metric="score", resource=9,
                        min_resource=1, reduction_factor=3, max_parallel=4, seed=5,
                        speculate_factor=0)
        assert search.wait(timeout=2 * JOB_WAIT_S)["state"] == "succeeded"
        promoted = [t for t in search.trials() if t["promotions"]]
        assert promoted, search.trials()
        report = re.compile(r"^ringleader-report (\d+) ")
        for t in promoted:
            lines = list(client.job(t["job"]).logs())
            runs = sorted({line.run for line in lines})
            # A run per promotion after the first, each of its lines marked with it.
            assert runs == list(range(1, t["promotions"] + 2)), (t, lines)
            last_epoch = 0
            for run in runs:
                mine = [line for line in lines if line.run == run]
                epochs_run = [int(m.group(1)) for m in map(report.match, mine) if m]
                if run > 1:
                    # Each later run resumes where the run before it saved, no epoch twice.
                    assert f"resumed at epoch {last_epoch}" in mine, (t, run, lines)
                assert epochs_run and epochs_run[0] == last_epoch + 1, (t, run, lines)
                last_epoch = epochs_run[-1]
    finally:
        for n in nodes:
            n.stop()


def test_a_function_that_raises_fails_its_trial_with_the_traceback(client, rank_env):
    search = launch(client, rank_env, raises, {"x": [1]}, max_trial_failures=0)
    with pytest.raises(ringleader.JobFailed):
        search.wait(timeout=JOB_WAIT_S)
    (trial,) = search.trials()
    assert trial["state"] == "failed"
    logs = "\n".join(client.job(trial["job"]).logs())
    assert "Traceback (most recent call last)" in logs
    assert "ValueError: bad x 1" in logs
    assert "in raises" in logs


def test_a_trial_under_an_interpreter_without_cloudpickle_fails_saying_so(client, rank_env,
                                                                         tmp_path):
    # A bare virtualenv of this Python: the package comes from PYTHONPATH, cloudpickle not.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")],
                   check=True, timeout=60)
    bare = str(tmp_path / "bare" / "bin" / "python")
    search = client.launch(quadratic, {"x": [1], "y": [0]}, python=bare, env=rank_env,
                           max_trial_failures=0)
    with pytest.raises(ringleader.JobFailed):
        search.wait(timeout=JOB_WAIT_S)
    (trial,) = search.trials()
    assert trial["state"] == "failed"
    logs = "\n".join(client.job(trial["job"]).logs())
    assert f"the trial's interpreter {bare} lacks the package cloudpickle" in logs


def test_a_pickle_above_the_spec_limit_is_refused_before_submitting():
    blob = os.urandom(_launch.FILES_BYTES_MAX)

    def big():
        return len(blob)

    # No node at this address: the error comes before any request.
    with pytest.raises(ringleader.PickleTooLarge) as e:
        ringleader.Client("127.0.0.1:9").launch(big, {"x": [1]})
    assert e.value.size_bytes > _launch.FILES_BYTES_MAX
    assert f"is {e.value.size_bytes} bytes" in str(e.value)
    assert "131072" in str(e.value)


def test_the_runner_names_a_minor_version_mismatch_and_missing_packages():
    assert _runner.check_interpreter(sys.version_info, sys.version_info[:2]) == []
    (msg,) = _runner.check_interpreter((3, 99, 1), [3, 11], executable="/usr/bin/python3")
    assert "/usr/bin/python3 is Python 3.99" in msg and "pickled by Python 3.11" in msg
    missing = _runner.check_interpreter(
        sys.version_info, sys.version_info[:2],
        find_spec=lambda name: None if name == "cloudpickle" else object())
    assert len(missing) == 1 and "lacks the package cloudpickle" in missing[0]


def test_the_runner_fails_a_trial_of_another_python_saying_so(tmp_path):
    # What a node runs, with a pickler's version that is not this interpreter's.
    spec = _launch.launch_spec(quadratic, {"x": [1]})
    for f in spec["files"]:
        if f["path"] == _runner.META_FILE:
            meta = json.loads(f["text"])
            meta["python"] = [3, sys.version_info[1] + 1]
            (tmp_path / f["path"]).write_text(json.dumps(meta))
        elif "text" in f:
            (tmp_path / f["path"]).write_text(f["text"])
    out = subprocess.run([sys.executable, _runner.RUNNER_FILE], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": PYTHON_DIR})
    assert out.returncode == _runner.EXIT_CANNOT_RUN
    assert f"pickled by Python 3.{sys.version_info[1] + 1}" in out.stderr


def test_the_spec_launch_writes():
    spec = _launch.launch_spec(quadratic, {"x": [1, 2]}, python="python3.11", resource=9,
                               algorithm="asha", trials=4, seed=3)
    assert spec["kind"] == "search" and spec["name"] == "quadratic"
    assert spec["command"] == ["python3.11", _runner.RUNNER_FILE]
    assert [f["path"] for f in spec["files"]] == [_runner.RUNNER_FILE, _runner.META_FILE,
                                                  _runner.FN_FILE]
    # ASHA's trials are resumable by default: a promotion resumes from the checkpoint.
    assert spec["search"] == {"trial": "command", "algorithm": "asha", "metric": "objective",
                              "direction": "max", "trials": 4, "max_parallel": None,
                              "params": {"x": [1, 2]}, "max_resource": 9, "resumable": True,
                              "seed": 3}
    hyperband = _launch.launch_spec(quadratic, {"x": [1, 2]}, resource=9,
                                    algorithm="hyperband")
    assert hyperband["search"]["resumable"] is True
    # Asked not to; and the algorithms that never pause have no say.
    for spec in (_launch.launch_spec(quadratic, {"x": [1, 2]}, resource=9, algorithm="asha",
                                     resumable=False),
                 _launch.launch_spec(quadratic, {"x": [1, 2]}),
                 _launch.launch_spec(quadratic, {"x": [1, 2]}, algorithm="random", trials=2)):
        assert "resumable" not in spec["search"], spec["search"]
    # A priority goes to the spec (and so to every trial); none leaves the default.
    assert _launch.launch_spec(quadratic, {"x": [1]}, priority="high")["priority"] == "high"
    assert "priority" not in _launch.launch_spec(quadratic, {"x": [1]})
    with pytest.raises(TypeError):
        _launch.launch_spec(42, {})


def test_the_package_depends_on_what_launch_needs():
    # `pip install ./python` gives the README's tour, `launch` included: cloudpickle is a
    # dependency, not an extra.
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(PYTHON_DIR, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    names = [re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in project["dependencies"]]
    assert "cloudpickle" in names, project["dependencies"]


def test_a_launch_without_python_or_env_runs_under_this_interpreter(client):
    # No node --python: this interpreter, and the checkout this package came from on the
    # trials' PYTHONPATH (the node runs on this host), so it works the first time.
    search = client.launch(quadratic, {"x": [1, 2], "y": [0]}, quiet=True)
    assert search.wait(timeout=JOB_WAIT_S)["state"] == "succeeded"
    assert search.best["params"] == {"x": 2, "y": 0}


def test_the_nodes_python_is_the_default_interpreter(tmp_path):
    node = Node(tmp_path / "p0", name="p0", cpus=2, extra=("--python", sys.executable))
    try:
        client = node.client()
        assert client.status()["python"] == sys.executable
        search = client.launch(quadratic, {"x": [3], "y": [1]}, env={"PYTHONPATH": PYTHON_DIR},
                               quiet=True)
        assert search.wait(timeout=JOB_WAIT_S)["state"] == "succeeded"
        trial_job = client.job(search.trials()[0]["job"])
        assert trial_job.state == "succeeded"
    finally:
        node.stop()


def test_python_for_takes_the_argument_then_the_nodes_then_this_one():
    env = {"A": "1"}
    assert _launch.python_for("/x/python", "/node/python", env) == ("/x/python", env)
    assert _launch.python_for(None, "/node/python", env) == ("/node/python", env)
    python, got = _launch.python_for(None, None, env)
    assert python == sys.executable
    # Imported from this checkout (not installed): it rides along as PYTHONPATH.
    assert got == {"A": "1", "PYTHONPATH": PYTHON_DIR}
    assert _launch.python_for(None, None, {"PYTHONPATH": "/mine"})[1] == {"PYTHONPATH": "/mine"}


def test_the_install_hint_is_one_that_installs():
    (msg,) = _runner.check_interpreter(
        sys.version_info, sys.version_info[:2], executable="/venv/bin/python",
        find_spec=lambda name: None if name == "ringleader" else object(),
        source="/home/me/ringleader/python")
    assert "lacks the package ringleader" in msg
    assert "/venv/bin/python -m pip install /home/me/ringleader/python" in msg
    assert "build-wheel.sh" in msg
    assert "pip install ringleader" not in msg
    (msg,) = _runner.check_interpreter(
        sys.version_info, sys.version_info[:2], executable="/venv/bin/python",
        find_spec=lambda name: None if name == "ringleader" else object())
    assert "pip install <the wheel" in msg and "pip install ringleader" not in msg
    # The spec carries where this package came from, for the hint.
    spec = _launch.launch_spec(quadratic, {"x": [1]})
    meta = next(f for f in spec["files"] if f["path"] == _runner.META_FILE)
    assert json.loads(meta["text"])["source"] == PYTHON_DIR


def test_a_launch_names_a_shared_dataset(client, rank_env, tmp_path):
    src = tmp_path / "launch-data"
    src.mkdir()
    (src / "value.txt").write_text("2.5")
    client.add_dataset("launch-data", src)
    spec = _launch.launch_spec(reads_the_dataset, {"k": [1]}, dataset="launch-data")
    assert spec["data"] == {"dataset": "launch-data"}
    search = launch(client, rank_env, reads_the_dataset, {"k": [1, 2]},
                    dataset="launch-data", quiet=True)
    search.wait(timeout=JOB_WAIT_S)
    assert sorted(t["metric"] for t in search.trials()) == [2.5, 5.0]
    with pytest.raises(TypeError, match="dataset"):
        _launch.launch_spec(quadratic, {"x": [1]}, dataset="")


def test_wait_prints_progress_unless_quiet(client, rank_env, capfd, monkeypatch):
    monkeypatch.setattr(ringleader.client, "PROGRESS_EVERY_S", 0.0)
    search = launch(client, rank_env, quadratic, {"x": [1, 2, 3], "y": [0]})
    search.wait(timeout=JOB_WAIT_S)
    lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("ringleader: ")]
    assert lines, "no progress line"
    # The last line: every trial done, and the best so far.
    assert f"{search.id} quadratic [succeeded]: 3 trials: 3 done" in lines[-1], lines
    assert "; best objective 0 (trial " in lines[-1], lines
    assert len(lines) == len(set(lines)), "a line only when something changed"
    quiet = launch(client, rank_env, quadratic, {"x": [1], "y": [0]}, quiet=True)
    quiet.wait(timeout=JOB_WAIT_S)
    search.wait(timeout=JOB_WAIT_S, quiet=True)
    assert "ringleader: " not in capfd.readouterr().err


def test_a_refused_spec_names_launchs_argument_without_toml_lines(client, rank_env):
    with pytest.raises(ringleader.SpecError) as e:
        launch(client, rank_env, quadratic, {"x": [1]}, max_parallel=-1)
    assert str(e.value).startswith("launch(max_parallel=-1): "), str(e.value)
    assert e.value.argument == "max_parallel" and e.value.line is None
    assert "line" not in str(e.value), str(e.value)
    with pytest.raises(ringleader.SpecError) as e:
        launch(client, rank_env, quadratic, {"x": [1]}, algorithm="bogus")
    assert str(e.value).startswith("launch(algorithm='bogus'): "), str(e.value)
    assert "line" not in str(e.value), str(e.value)


def test_launch_error_rewrites_the_nodes_words():
    refused = ringleader.SpecError(
        400, "search.params.lr: min must be below max at line 14",
        {"error": "…", "field": "search.params.lr", "line": 14})
    e = _launch.launch_error(refused, {"params": {"lr": "…"}})
    assert str(e) == "launch(params={'lr': '…'}): min must be below max"
    assert (e.field, e.line, e.argument) == ("search.params.lr", None, "params")
    unknown = ringleader.SpecError(400, "search.stoping: unknown field at line 12",
                                   {"field": "search.stoping", "line": 12})
    e = _launch.launch_error(unknown, {"stoping": "median"})
    assert str(e).startswith("launch(stoping='median'): not an argument of launch, nor a "
                             "[search] setting ("), str(e)
    assert str(e).endswith("): did you mean stopping?"), str(e)
