"""`Client.launch(fn, params)`: a Python function as the command trials of a search.

The function is pickled here with cloudpickle and rides inside the spec as `[[files]]`,
beside the runner (`ringleader/_runner.py`'s own source) and a small JSON description, so
the trials need no shared filesystem; each trial runs `[python, "_ringleader_runner.py"]`
in its working directory. The node's interpreter needs `cloudpickle` and `ringleader`
installed and the same Python minor version as this one (the runner checks, and fails the
trial with a message saying what is missing).
"""

import base64
import io
import json
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import _runner
from ._errors import RingleaderError

# The spec's limit on its `[[files]]`, decoded, in all (node/src/jobs/spec.rs).
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
                python: str = "python3", name: str | None = None,
                env: dict[str, str] | None = None, priority: int | str | None = None,
                **search: Any) -> dict[str, Any]:
    """The search spec (a dict) that `Client.launch` submits; the arguments are its."""
    if not callable(fn):
        raise TypeError(f"launch: fn is a function, not {type(fn).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"launch: params is a dict of name → list or distribution, "
                        f"not {type(params).__name__}")
    metric = metric or DEFAULT_METRIC
    pickled = pickle_function(fn)
    runner = runner_source().encode()
    meta = json.dumps({"python": list(sys.version_info[:2]), "metric": metric,
                       "fn": _runner.FN_FILE}).encode()
    size = len(pickled) + len(runner) + len(meta)
    if size > FILES_BYTES_MAX:
        raise PickleTooLarge(size, FILES_BYTES_MAX)
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
    return spec
