"""Inside a rank or a trial: what the node told this process (params, the trial), and the
rank protocol's lines it prints back (docs/book/src/reference/protocol.md), made by the protocol
crate itself (`ringleader._native`). Standard library only.
"""

import json
import os
import signal
import sys
import threading
from collections.abc import Mapping
from types import FrameType
from typing import IO, Any

from . import _native
from ._errors import Stopped
from .documents import TrialContext

Environ = Mapping[str, str]
"""An environment: `os.environ` when None is given."""

# The node's names for what it tells a rank, from the protocol crate (`_native`).
PARAM_PREFIX = _native.PARAM_PREFIX_ENV
PARAMS_ENV = _native.PARAMS_ENV
# The rung this run must reach (epochs), and whether the run ends there (a `resumable = true`
# search's command trial: the node stops it there, and a promotion starts a new run).
RUNG_ENV = _native.TRIAL_RESOURCE_ENV
RESUMABLE_ENV = _native.TRIAL_RESUMABLE_ENV

_lock = threading.Lock()
_stop = threading.Event()
_handler_installed = False
# Set once `report` printed this run's rung in a resumable trial: the next report raises.
_rung_reported: int | None = None
# The largest resource each metric name was printed at by this process (`reported()`).
_reported: dict[str, int] = {}


def _typed(text: str) -> Any:
    """An environment value as the node wrote it: a number, bool or list (TOML's spelling of
    a scalar or a list of scalars reads as JSON) as such, anything else as the string."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def params(environ: Environ | None = None) -> dict[str, Any]:
    """This trial's hyperparameters, `{name: value}`, typed.

    From `RINGLEADER_PARAMS` (a JSON object, names as the search spec writes them) when the
    node sets it; else from the `RINGLEADER_PARAM_<NAME>` variables every node sets today,
    whose names are the spec's upper-cased with other characters than letters and digits as
    `_`: they come back lower-cased (`train.lr` → `train_lr`), numbers as int or float,
    `[64, 64]` as a list. Outside a trial: `{}`.
    """
    env = os.environ if environ is None else environ
    if env.get(PARAMS_ENV):
        parsed: dict[str, Any] = json.loads(env[PARAMS_ENV])
        return parsed
    return {k[len(PARAM_PREFIX):].lower(): _typed(v)
            for k, v in sorted(env.items()) if k.startswith(PARAM_PREFIX)}


def trial(environ: Environ | None = None) -> TrialContext | None:
    """Which trial this process is, or None outside a search's trial: a `TrialContext` (a
    dataclass read as the dict it was before) with `search`
    (the search's job id), `trial` (its number), `copy` (True in a speculative copy), `job`
    (this trial's own job id), `rung` (the resource, e.g. epochs, this run must reach:
    the node's `RINGLEADER_TRIAL_RESOURCE`; None when it gave none) and `resumable` (True
    when this run ends at `rung` and a promotion resumes the trial in a new run, from its
    checkpoint: `RINGLEADER_TRIAL_RESUMABLE=1`, a `resumable = true` search)."""
    env = os.environ if environ is None else environ
    if _native.TRIAL_ID_ENV not in env:
        return None
    rung = env.get(RUNG_ENV)
    return TrialContext.of(
        search=env.get(_native.SEARCH_ID_ENV),
        trial=int(env[_native.TRIAL_ID_ENV]),
        copy=env.get(_native.TRIAL_COPY_ENV, "0") == "1",
        job=env.get(_native.JOB_ID_ENV),
        rung=int(rung) if rung else None,
        resumable=env.get(RESUMABLE_ENV) == "1",
    )


def _run_rung(environ: Environ | None = None) -> int | None:
    """The rung this run ends at, or None: only a resumable trial's run ends at its rung
    (any other run goes on until the search stops it)."""
    t = trial(environ)
    if t is None or not t.resumable:
        return None
    return t.rung


def dataset_dir(environ: Environ | None = None) -> str | None:
    """The directory of the shared dataset the spec's `[data] dataset` names, fetched onto
    this rank's node before it started (`RINGLEADER_DATASET_DIR`), or None without one."""
    env = os.environ if environ is None else environ
    return env.get(_native.DATASET_DIR_ENV) or None


def _emit(line: str, file: IO[str] | None) -> None:
    out = sys.stdout if file is None else file
    with _lock:
        out.write(line + "\n")
        out.flush()


def metric(name: str, value: float, step: int | None = None, *,
           file: IO[str] | None = None) -> None:
    """Prints `ringleader-metric NAME VALUE [STEP]`: a job metric; in a search's command
    trial, the search's metric is also a report (STEP in epochs). ValueError for a name
    with whitespace or a value that is not finite."""
    line = _native.metric_line(str(name), float(value), None if step is None else int(step))
    _emit(line, file)
    with _lock:
        # Without a step the node counts the lines: the resource is their number.
        at = int(step) if step is not None else _reported.get(str(name), 0) + 1
        _reported[str(name)] = max(at, _reported.get(str(name), 0))


def reported() -> dict[str, int]:
    """`{name: resource}`: each metric this process printed through `metric` or `report`,
    with the largest resource (epochs; a step-less metric's count) it was printed at."""
    with _lock:
        return dict(_reported)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _stop.set()


def _install_handler() -> None:
    global _handler_installed
    if _handler_installed:
        return
    _handler_installed = True
    # Only the main thread may set handlers; elsewhere SIGTERM keeps its default (the node
    # ends the process, as it would without the package).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def stopped() -> bool:
    """Whether the node asked this process to stop (SIGTERM since the first `report`)."""
    return _stop.is_set()


def report(resource: int, *, file: IO[str] | None = None, **metrics: float) -> None:

    """Prints `ringleader-report RESOURCE NAME VALUE …`: this trial's values after
    `resource` epochs; the search decides on its metric among them.

    The first call installs a SIGTERM handler; once SIGTERM has arrived (the search stopped
    this trial: ASHA's cut, the median rule), the next `report` raises `ringleader.Stopped`
    instead of printing. The node sends SIGKILL 5 s after SIGTERM, so stop promptly.

    In a resumable trial's run (`trial()["resumable"]`), the run ends at its rung: once a
    report at `resource >= trial()["rung"]` has been printed, the next `report` raises
    `Stopped` too, so a loop over more epochs than the rung stops there by itself (save
    the checkpoint before the report: the promoted run resumes from it). The node stops a
    run still going a few seconds after its rung's report (SIGTERM), and counts it as
    having reached its rung.
    """
    global _rung_reported
    _install_handler()
    if _stop.is_set():
        raise Stopped("the node stopped this trial (SIGTERM)")
    if _rung_reported is not None:
        raise Stopped(f"this run of a resumable trial reached its rung ({_rung_reported}); "
                      "a promotion resumes it in a new run")
    if not metrics:
        raise ValueError("report: at least one NAME=VALUE")
    line = _native.report_line(int(resource), [(k, float(v)) for k, v in metrics.items()])
    _emit(line, file)
    with _lock:
        for k in metrics:
            _reported[k] = max(int(resource), _reported.get(k, 0))
    rung = _run_rung()
    if rung is not None and int(resource) >= rung:
        _rung_reported = rung
