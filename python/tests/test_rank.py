"""The rank side without a node: the native formatter against the protocol's golden lines,
params() and trial() from the environment, report()'s Stopped on SIGTERM, the distributions
and the TOML writer."""

import io
import json
import os
import subprocess
import sys


import pytest

import ringleader
from ringleader import _native, _toml

from conftest import PYTHON_DIR, binary


def golden():
    for line in _native.GOLDEN_LINES.splitlines():
        if line.strip() and not line.startswith("#"):
            tag, _, text = line.partition(" ")
            yield tag, text


def test_the_rank_environment_names_are_the_protocol_crates():
    """`_native`'s `<NAME>_ENV` are the node's names (the protocol crate's `env`), each one
    documented in docs/book/src/reference/protocol.md."""
    names = {k: v for k, v in vars(_native).items() if k.endswith("_ENV")}
    assert names["JOB_ID_ENV"] == "RINGLEADER_JOB_ID"
    assert names["PARAM_PREFIX_ENV"] == "RINGLEADER_PARAM_"
    assert names["PROTOCOL_VERSION_ENV"] == "RINGLEADER_PROTOCOL_VERSION"
    assert len(names) >= 20, names
    protocol_md = os.path.join(PYTHON_DIR, "..", "docs", "book", "src", "reference", "protocol.md")
    with open(protocol_md, encoding="utf-8") as f:
        doc = f.read()
    for constant, name in names.items():
        assert name.startswith("RINGLEADER_"), constant
        assert f"`{name}" in doc, f"{name} is not in docs/book/src/reference/protocol.md"


def test_golden_rank_lines_read_as_the_node_reads_them():
    seen = {"rank-ok": 0, "rank-bad": 0}
    for tag, text in golden():
        if tag == "rank-ok":
            assert _native.parse_rank_line(text) == text
        elif tag == "rank-bad":
            with pytest.raises(ValueError):
                _native.parse_rank_line(text)
        else:
            continue
        seen[tag] += 1
    assert all(seen.values()), seen


@pytest.fixture()
def no_handler(monkeypatch):
    """report() in this process leaves pytest's own SIGTERM handling alone."""
    monkeypatch.setattr(ringleader.rank, "_handler_installed", True)


def test_metric_and_report_lines(no_handler):
    out = io.StringIO()
    ringleader.metric("loss", 0.25, 10, file=out)
    ringleader.metric("val_accuracy", 1, file=out)
    ringleader.report(3, file=out, val_loss=0.2, val_accuracy=0.91)
    assert out.getvalue().splitlines() == [
        "ringleader-metric loss 0.25 10",
        "ringleader-metric val_accuracy 1",
        "ringleader-report 3 val_loss 0.2 val_accuracy 0.91",
    ]
    for line in out.getvalue().splitlines():
        assert _native.parse_rank_line(line) == line


@pytest.mark.parametrize("name,value", [("two words", 1.0), ("", 1.0), ("x" * 129, 1.0),
                                        ("loss", float("nan")), ("loss", float("inf"))])
def test_bad_metrics_are_refused(name, value):
    with pytest.raises(ValueError):
        ringleader.metric(name, value, file=io.StringIO())


def test_report_needs_a_value(no_handler):
    with pytest.raises(ValueError):
        ringleader.report(1, file=io.StringIO())


def test_params_from_the_node_variables_and_from_json():
    env = {"RINGLEADER_PARAM_LR": "0.01", "RINGLEADER_PARAM_LAYERS": "3",
           "RINGLEADER_PARAM_MODEL_HIDDEN": "[64, 32]", "RINGLEADER_PARAM_OPT": "adamw",
           "RINGLEADER_PARAM_NESTEROV": "true", "OTHER": "1"}
    assert ringleader.params(env) == {"lr": 0.01, "layers": 3, "model_hidden": [64, 32],
                                      "opt": "adamw", "nesterov": True}
    env["RINGLEADER_PARAMS"] = '{"train.lr": 0.5, "model.hidden": [8]}'
    assert ringleader.params(env) == {"train.lr": 0.5, "model.hidden": [8]}
    assert ringleader.params({}) == {}


def test_trial_from_the_environment():
    assert ringleader.trial({}) is None
    env = {"RINGLEADER_SEARCH_ID": "j-4", "RINGLEADER_TRIAL_ID": "7",
           "RINGLEADER_TRIAL_COPY": "1", "RINGLEADER_JOB_ID": "j-9"}
    assert ringleader.trial(env) == {"search": "j-4", "trial": 7, "copy": True, "job": "j-9",
                                     "rung": None, "resumable": False}
    env["RINGLEADER_TRIAL_RESOURCE"] = "3"
    env["RINGLEADER_TRIAL_RESUMABLE"] = "1"
    assert ringleader.trial(env)["rung"] == 3
    assert ringleader.trial(env)["resumable"] is True


def test_documents_are_typed_and_still_the_dicts_they_were():
    env = {"RINGLEADER_TRIAL_ID": "7", "RINGLEADER_TRIAL_COPY": "1",
           "RINGLEADER_TRIAL_RESOURCE": "3", "RINGLEADER_TRIAL_RESUMABLE": "1"}
    t = ringleader.trial(env)
    assert isinstance(t, ringleader.TrialContext)
    assert (t.trial, t.is_copy, t.rung, t.resumable, t.search) == (7, True, 3, True, None)
    assert t.get("rung") == 3 and "copy" in t and dict(t) == t
    assert json.loads(json.dumps(t)) == t and repr(t) == repr(dict(t))
    doc = {"id": 2, "job": "j-9", "params": {"lr": 0.1}, "state": "succeeded", "metric": 0.5,
           "resource": 3, "promotions": 1, "bracket": 0, "node": "n1", "later": "kept"}
    trial = ringleader.Trial.of(doc)
    assert (trial.id, trial.job, trial.metric, trial.note) == (2, "j-9", 0.5, "")
    assert trial.owner == "admin", "a node older than owners: the admin's"
    assert ringleader.Trial.of({**doc, "owner": "alice"}).owner == "alice"
    assert trial == doc and trial["later"] == "kept" and [trial] == [doc]
    best = ringleader.BestTrial.of({"id": 2, "params": {"lr": 0.1}, "metric": 0.5})
    assert best.metric == best["metric"] == 0.5
    with pytest.raises(AttributeError):
        best.metric = 1.0  # frozen


def test_every_error_is_a_ringleader_error_and_keeps_its_builtin_base():
    for cls, builtin in [(_native.RingError, RuntimeError), (_native.PeerLost, RuntimeError),
                         (_native.Aborted, RuntimeError), (_native.RingTimeout, RuntimeError),
                         (_native.HandshakeRefused, RuntimeError),
                         (ringleader.PickleTooLarge, ValueError),
                         (ringleader.WaitTimeout, TimeoutError),
                         (ringleader.CheckpointError, Exception),
                         (ringleader.SpecError, ringleader.ApiError),
                         (ringleader.JobCancelled, ringleader.JobFailed)]:
        assert issubclass(cls, ringleader.RingleaderError) and issubclass(cls, builtin), cls
    with pytest.raises(ringleader.RingleaderError):
        raise _native.PeerLost("peer 1 lost")


def test_dataset_dir_from_the_environment():
    assert ringleader.dataset_dir({}) is None
    assert ringleader.dataset_dir({"RINGLEADER_DATASET_DIR": "/d/x"}) == "/d/x"


def test_report_raises_stopped_after_sigterm():
    # In a process of its own: the handler report() installs is process-wide.
    script = """
import os, signal, ringleader
ringleader.report(1, acc=0.5)
os.kill(os.getpid(), signal.SIGTERM)
assert ringleader.stopped()
try:
    ringleader.report(2, acc=0.6)
except ringleader.Stopped as e:
    print("stopped:", e, flush=True)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": PYTHON_DIR}, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["ringleader-report 1 acc 0.5",
                                       "stopped: the node stopped this trial (SIGTERM)"]


def test_distributions_write_search_params():
    params = ringleader.search_params({
        "lr": ringleader.loguniform(1e-4, 1.0),
        "momentum": ringleader.uniform(0, 0.99),
        "layers": ringleader.randint(1, 4),
        "act": ringleader.choice(["relu", "gelu"]),
        "batch": [16, 32],
        "hidden": [[64], [128, 64]],
    })
    assert params == [
        {"name": "lr", "type": "double", "min": 1e-4, "max": 1.0, "scale": "log"},
        {"name": "momentum", "type": "double", "min": 0.0, "max": 0.99, "scale": "linear"},
        {"name": "layers", "type": "integer", "min": 1, "max": 4, "scale": "linear"},
        {"name": "act", "type": "categorical", "values": ["relu", "gelu"]},
        {"name": "batch", "type": "discrete", "values": [16, 32]},
        {"name": "hidden", "type": "categorical", "values": [[64], [128, 64]]},
    ]
    with pytest.raises(ValueError):
        ringleader.loguniform(0, 1)
    with pytest.raises(ValueError):
        ringleader.uniform(2, 1)
    with pytest.raises(TypeError):
        ringleader.randint(0.5, 2)


def test_toml_writer_round_trips():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    spec = {
        "name": "x y", "kind": "search", "workers": 2, "command": ["python3", "-c", 'print("a\\nb")'],
        "env": {"PYTHONPATH": "/p", "odd key": "ü"},
        "search": {"trial": "command", "algorithm": "grid", "metric": "m", "direction": "max",
                   "seed": 0, "speculate_factor": 0.0, "params": [
                       {"name": "x", "type": "discrete", "values": [1, 2.5]},
                       {"name": "h", "type": "categorical", "values": [[1], [2, 3]]}]},
        "resources": {"cpus_per_worker": 1},
        "flag": True, "skip": None,
    }
    back = tomllib.loads(_toml.dumps(spec))
    del spec["skip"]
    assert back == spec
    with pytest.raises(TypeError):
        _toml.dumps({"x": object()})


def test_the_console_command_execs_the_binary():
    out = subprocess.run([sys.executable, "-m", "ringleader", "--help"], capture_output=True,
                         text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": PYTHON_DIR, "RINGLEADER_BIN": binary()})
    assert out.returncode == 0, out.stderr
    assert "Usage: ringleader" in out.stdout
    out = subprocess.run([sys.executable, "-m", "ringleader", "--help"], capture_output=True,
                         text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": PYTHON_DIR,
                              "RINGLEADER_BIN": "/nonexistent/ringleader"})
    assert out.returncode != 0 and "no node binary" in out.stderr


def test_version():
    assert ringleader.__version__ == _native.VERSION
    assert ringleader.PROTOCOL_VERSION == 1


RUN_PAST_THE_RUNG = """
import ringleader
try:
    for epoch in range(1, 100):
        ringleader.report(epoch, acc=epoch / 100)
    print("ran to the end", flush=True)
except ringleader.Stopped as e:
    print(f"stopped before {epoch}:", e, flush=True)
"""


def run_trial_script(script, **env):
    trial = {"RINGLEADER_SEARCH_ID": "j-4", "RINGLEADER_TRIAL_ID": "7", "RINGLEADER_JOB_ID": "j-9",
             "PYTHONPATH": PYTHON_DIR}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, **trial, **env}, timeout=30)


def test_a_resumable_run_stops_at_the_report_after_its_rung():
    out = run_trial_script(RUN_PAST_THE_RUNG, RINGLEADER_TRIAL_RESOURCE="3",
                           RINGLEADER_TRIAL_RESUMABLE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "ringleader-report 1 acc 0.01", "ringleader-report 2 acc 0.02",
        "ringleader-report 3 acc 0.03",
        "stopped before 4: this run of a resumable trial reached its rung (3); a promotion "
        "resumes it in a new run"]
    # A run resumed past its rung (it saved beyond it) stops after its first report.
    script = RUN_PAST_THE_RUNG.replace("range(1, 100)", "range(5, 100)")
    out = run_trial_script(script, RINGLEADER_TRIAL_RESOURCE="3", RINGLEADER_TRIAL_RESUMABLE="1")
    assert out.stdout.splitlines()[0] == "ringleader-report 5 acc 0.05", out.stdout
    assert out.stdout.splitlines()[1].startswith("stopped before 6:"), out.stdout


def test_a_run_that_is_not_resumable_goes_past_its_target():
    # A non-resumable command trial's target is max_resource; the search stops it (SIGTERM),
    # not the package.
    out = run_trial_script(RUN_PAST_THE_RUNG, RINGLEADER_TRIAL_RESOURCE="3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "ran to the end"
    assert len(out.stdout.splitlines()) == 100
