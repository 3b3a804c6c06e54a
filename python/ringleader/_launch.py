"""`Client.launch(fn, params)`: a Python function as the command trials of a search.

The function is pickled here with cloudpickle and rides inside the spec as `[[files]]`,
beside the runner (`ringleader/_runner.py`'s own source) and a small JSON description, so
the trials need no shared filesystem; each trial runs `[python, "_ringleader_runner.py"]`
in its working directory. The node's interpreter needs `cloudpickle` and `ringleader`
installed and the same Python minor version as this one (the runner checks, and fails the
trial with a message saying what is missing and how to install it).

Which interpreter (`python_for`): `launch(python=...)`; else the node's `--python` (the
status document's `python`, an operator's interpreter with the package); else this one,
`sys.executable`, which is right on a one-host cluster and on a lab cluster whose hosts
have the same environment at the same path. This package, when imported from a checkout
rather than installed, then rides along as the trials' `PYTHONPATH`.

A spec the node refuses is the spec `launch` wrote, not the user's: `launch_error` says
which of `launch`'s arguments the refused field came from, without the TOML's lines.
"""

import base64
import difflib
import io
import json
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import _runner
from ._errors import RingleaderError, SpecError

# The spec's limit on its `[[files]]`, decoded, in all (`FILES_BYTES_MAX` in
# node/domain/src/spec.rs).
FILES_BYTES_MAX = 128 * 1024
# The search metric a function's plain number is reported as, when `metric` is not given.
DEFAULT_METRIC = "objective"
# The algorithms that pause a trial at a rung and promote it later: their trials are
# resumable unless `launch(resumable=False)` says otherwise.
PROMOTING_ALGORITHMS = ("asha", "hyperband")
NAME_BYTES_MAX = 64


class PickleTooLarge(ValueError, RingleaderError):
    """The pickled function (with the runner) is larger than the spec may carry."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"launch: the pickled function is {size_bytes} bytes with its runner, above the "
            f"{limit_bytes} bytes a spec's [[files]] may carry (FILES_BYTES_MAX); do not "
            "capture large objects in the function: load them inside it (from a dataset, "
            "ringleader.dataset_dir(), or a file on the node)")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


def _cloudpickle() -> Any:
    try:
        import cloudpickle
    except ImportError as e:
        raise ImportError("launch pickles the function with cloudpickle, a dependency of "
                          "ringleader that is not installed here: pip install cloudpickle"
                          ) from e
    return cloudpickle


def _by_value(module: ModuleType | None) -> bool:
    """Whether `module`'s functions travel by value: one that is neither `__main__` (already
    by value), nor the standard library's or an installed package's (importable on the node
    as well, given the same installs), e.g. a test file or a script's own helpers."""
    if module is None or module.__name__ == "__main__" or module.__name__.split(".")[0] in (
            "ringleader", "cloudpickle"):
        return False
    path: str | None = getattr(module, "__file__", None)
    if not path:
        return False
    path = os.path.abspath(path)
    installed = [p for p in {sys.prefix, sys.base_prefix, sys.exec_prefix} if p]
    return not any(path.startswith(os.path.join(p, "lib")) for p in installed) \
        and "site-packages" not in path and "dist-packages" not in path


def pickle_function(fn: Callable[..., Any]) -> bytes:
    """`fn` as cloudpickle bytes; the functions of its own module go by value (see
    `_by_value`), so a function defined in a test or a helper file reaches nodes that
    cannot import that file."""
    cloudpickle = _cloudpickle()
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    register = _by_value(module) and hasattr(cloudpickle, "register_pickle_by_value")
    if register:
        cloudpickle.register_pickle_by_value(module)
    try:
        buf = io.BytesIO()
        cloudpickle.dump(fn, buf)
        return buf.getvalue()
    finally:
        if register:
            cloudpickle.unregister_pickle_by_value(module)


def _job_name(fn: Callable[..., Any]) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", getattr(fn, "__name__", "") or "").strip("-")
    return (name or "fn")[:NAME_BYTES_MAX]


def package_source() -> str | None:
    """The directory `pip install DIR` installs this package from (the checkout's
    `python/`, holding `pyproject.toml`), when it was imported from a checkout; None for
    an installed package."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(_runner.__file__)))
    return here if os.path.isfile(os.path.join(here, "pyproject.toml")) else None


def _installed() -> bool:
    """Whether this package is installed (in a site-packages), as opposed to imported
    from a checkout through `sys.path`."""
    here = os.path.abspath(_runner.__file__)
    return "site-packages" in here or "dist-packages" in here


def python_for(python: str | None, node_python: str | None,
               env: dict[str, str] | None) -> tuple[str, dict[str, str] | None]:
    """The interpreter trials run under, and their `[env]`: see the module doc. The
    checkout this package came from goes on `PYTHONPATH` only for `sys.executable` (the
    same host, or the same path on every host) and only when `env` sets none."""
    if python:
        return python, env
    if node_python:
        return node_python, env
    source = package_source()
    if source and not _installed() and "PYTHONPATH" not in (env or {}):
        env = {**(env or {}), "PYTHONPATH": source}
    return sys.executable, env


def runner_source() -> str:
    with open(_runner.__file__, encoding="utf-8") as f:
        return f.read()


def resumes(algorithm: str, resumable: bool | None = None) -> bool:
    """Whether `launch`'s trials are resumable: `resumable` when given, else (None) whether
    `algorithm` pauses and promotes trials (ASHA, Hyperband). The runner makes that safe for
    any function: `report` ends the run at its rung, and a function that saves nothing with
    `ringleader.checkpoint` starts over when promoted."""
    if resumable is None:
        return algorithm in PROMOTING_ALGORITHMS
    return bool(resumable)


def launch_spec(fn: Callable[..., Any], params: dict[str, Any], *, algorithm: str = "grid",
                metric: str | None = None, direction: str = "max", trials: int | None = None,
                max_parallel: int | None = None, workers: int = 1,
                resource: int | str | None = None, resumable: bool | None = None,
                python: str | None = None, name: str | None = None,
                env: dict[str, str] | None = None, priority: int | str | None = None,
                dataset: str | None = None,
                node_python: Callable[[], str | None] | None = None,
                **search: Any) -> dict[str, Any]:
    """The search spec (a dict) that `Client.launch` submits; the arguments are its.
    `python`: None is `python_for`'s rule, with `node_python()` (asked only then, after
    the function is pickled and its size checked) the node's default."""
    if not callable(fn):
        raise TypeError(f"launch: fn is a function, not {type(fn).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"launch: params is a dict of name → list or distribution, "
                        f"not {type(params).__name__}")
    if dataset is not None and (not isinstance(dataset, str) or not dataset):
        raise TypeError(f"launch: dataset is the name of a shared dataset (ringleader "
                        f"dataset ls), not {dataset!r}")
    metric = metric or DEFAULT_METRIC
    pickled = pickle_function(fn)
    runner = runner_source().encode()
    meta = json.dumps({"python": list(sys.version_info[:2]), "metric": metric,
                       "fn": _runner.FN_FILE, "source": package_source()}).encode()
    size = len(pickled) + len(runner) + len(meta)
    if size > FILES_BYTES_MAX:
        raise PickleTooLarge(size, FILES_BYTES_MAX)
    default = node_python() if node_python is not None and not python else None
    python, env = python_for(python, default, env)
    search_table: dict[str, Any] = {"trial": "command", "algorithm": algorithm, "metric": metric,
                    "direction": direction, "trials": trials, "max_parallel": max_parallel,
                    "params": params}
    if resource is not None:
        # An int: the epochs a trial runs to (the search's max_resource); a str: the unit.
        search_table["resource" if isinstance(resource, str) else "max_resource"] = resource
    if resumes(algorithm, resumable):
        # Each run goes to its rung and ends; ASHA and Hyperband pause and promote trials.
        search_table["resumable"] = True
    search_table.update(search)
    spec: dict[str, Any] = {
        "name": name or _job_name(fn),
        "kind": "search",
        "workers": workers,
        "command": [python, _runner.RUNNER_FILE],
        "env": env or None,
        "files": [
            {"path": _runner.RUNNER_FILE, "text": runner.decode()},
            {"path": _runner.META_FILE, "text": meta.decode()},
            {"path": _runner.FN_FILE, "base64": base64.b64encode(pickled).decode()},
        ],
        "search": search_table,
    }
    if priority is not None:
        spec["priority"] = priority
    if dataset is not None:
        # As any job names one: fetched to each trial's node before it starts, its
        # directory in RINGLEADER_DATASET_DIR (`ringleader.dataset_dir()`).
        spec["data"] = {"dataset": dataset}
    return spec


# The spec's fields `launch` writes, by the argument each comes from (a field below one of
# these, `search.params.x`, is its argument's too); other `search.*` fields are keywords.
ARGUMENT_OF_FIELD = {
    "search.params": "params", "search.max_resource": "resource",
    "search.resource": "resource", "search.trials": "trials",
    "search.max_parallel": "max_parallel", "search.algorithm": "algorithm",
    "search.metric": "metric", "search.direction": "direction",
    "search.resumable": "resumable", "workers": "workers", "env": "env",
    "priority": "priority", "name": "name", "data.dataset": "dataset", "data": "dataset",
    "command": "python", "files": "fn",
}
# The `[search]` settings `launch` passes on from its other keywords.
SEARCH_KEYWORDS = ("seed", "min_resource", "reduction_factor", "stopping",
                   "max_trial_failures", "speculate_factor")
# ` at line 12`, ` at line 3 column 4`, ` (kind at line 2)`: places in a TOML text the user
# never saw.
_LINE_REFERENCE = re.compile(
    r"\s*\([^()]*\bat line \d+[^()]*\)|\s*\bat line \d+(?: column \d+)?")
# The longest value `launch_error` quotes back.
VALUE_CHARS_MAX = 60


def argument_of(field: str | None) -> str | None:
    """The argument of `launch` that the spec's `field` (a dotted path) was written from."""
    if not field:
        return None
    parts = field.split(".")
    for n in range(len(parts), 0, -1):
        argument = ARGUMENT_OF_FIELD.get(".".join(parts[:n]))
        if argument:
            return argument
    if parts[0] == "search" and len(parts) > 1:
        return parts[1]
    return None


def launch_error(e: SpecError, arguments: dict[str, Any]) -> SpecError:
    """The node's refusal of the spec `launch` wrote, in `launch`'s terms: `launch(
    max_parallel=-1): must be …`, naming the argument the refused field came from (its
    value quoted back when short), without the TOML's line numbers. `arguments`: those
    given to `launch`. The error keeps `field`; `argument` is the argument's name."""
    reason = _LINE_REFERENCE.sub("", e.reason).strip()
    argument = argument_of(e.field)
    if argument is None:
        message = f"launch: {reason}"
    else:
        for prefix in (f"{e.field}: ", f"{e.field} "):
            if e.field and reason.startswith(prefix):
                reason = reason[len(prefix):]
                break
        if reason == "unknown field":
            close = difflib.get_close_matches(argument, SEARCH_KEYWORDS, n=1)
            reason = ("not an argument of launch, nor a [search] setting ("
                      + ", ".join(SEARCH_KEYWORDS) + ")"
                      + (f": did you mean {close[0]}?" if close else ""))
        shown = "..."
        if argument in arguments:
            text = repr(arguments[argument])
            shown = text if len(text) <= VALUE_CHARS_MAX else "..."
        message = f"launch({argument}={shown}): {reason}"
    doc = {**e.doc, "error": message, "line": None, "argument": argument}
    return SpecError(e.status, message, doc)
