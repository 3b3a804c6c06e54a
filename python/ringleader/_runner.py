"""The trial side of `Client.launch`: runs a pickled function as a search's command trial.

`launch` carries this file's source in the spec's `[[files]]` (as `_ringleader_runner.py`),
beside the pickled function and a small JSON description, and the trial's command is
`[python, "_ringleader_runner.py"]` in the rank's working directory, where the node wrote
them. So it runs before `ringleader` is known to be importable: the module level uses the
standard library only, and the checks come first, each failing the trial (exit 2) with a
message that says what the node's interpreter lacks.

Then: the function is loaded with cloudpickle, called with `ringleader.params()` as its
keyword arguments, and its return value reported as the trial's metric (a number, or a dict
holding the metric), unless the function already reported the metric itself through
`ringleader.report`/`ringleader.metric`. A function that raises prints its traceback and
exits 1 (the trial fails); one stopped by the search (`ringleader.Stopped`) exits 0.
"""

import importlib.util
import json
import numbers
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeGuard

RUNNER_FILE = "_ringleader_runner.py"
FN_FILE = "_ringleader_fn.pkl"
META_FILE = "_ringleader_launch.json"
# Exit status of a trial whose interpreter cannot run the function (and of a bad return).
EXIT_CANNOT_RUN = 2
EXIT_RAISED = 1
PACKAGES = ("cloudpickle", "ringleader")
# Where the package's wheel comes from (docs/book/src/guide/python.md): nobody can install `ringleader`
# from PyPI, which holds another project of that name.
WHEEL_HINT = ("the wheel ./scripts/build-wheel.sh builds into target/wheels/, or a "
              "checkout's python/ directory")


def install_hint(executable: str, name: str, source: str | None = None) -> str:
    """How to install package `name` for `executable`: cloudpickle from PyPI; ringleader
    from `source` (the checkout's python/ directory the function was launched from, which
    is right on its host and where hosts share the path) or a wheel."""
    if name != "ringleader":
        return f"{executable} -m pip install {name}"
    if source:
        return (f"{executable} -m pip install {source} (the launching host's checkout; "
                f"elsewhere {WHEEL_HINT})")
    return f"{executable} -m pip install <{WHEEL_HINT}>"


def check_interpreter(version_info: Sequence[Any], pickled_python: Sequence[int], *,
                      executable: str | None = None,
                      find_spec: Callable[[str], object] = importlib.util.find_spec,
                      source: str | None = None) -> list[str]:
    """What keeps this interpreter from loading the function: a list of messages, empty when
    none. `version_info`: this interpreter's (`sys.version_info`); `pickled_python`:
    `[major, minor]` of the one that pickled it (cloudpickle's code objects need the same
    minor version); `source`: where the launching host's package came from, for the
    install hint (`install_hint`)."""
    exe = executable or sys.executable
    problems = []
    here = tuple(version_info[:2])
    there = tuple(pickled_python[:2])
    if here != there:
        problems.append(
            f"the trial's interpreter {exe} is Python {here[0]}.{here[1]}, but the function "
            f"was pickled by Python {there[0]}.{there[1]}: cloudpickle needs the same minor "
            f"version (launch(..., python=...) names the interpreter trials run under)")
    for name in PACKAGES:
        if find_spec(name) is None:
            problems.append(
                f"the trial's interpreter {exe} lacks the package {name} (install it on "
                f"this node: {install_hint(exe, name, source)}; or run the trials under "
                "another interpreter: launch(..., python=PATH), or the nodes' --python)")
    return problems


def _is_number(v: object) -> TypeGuard[numbers.Real]:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def report_result(result: object, metric: str, ringleader: ModuleType) -> str | None:
    """Reports `result` (fn's return value) as the trial's `metric`; returns an error
    message, or None. Nothing is reported when the function already reported `metric`."""
    reported: dict[str, int] = ringleader.rank.reported()
    if metric in reported:
        return None
    if result is None:
        return (f"the function returned None and reported no {metric}: return a number, a "
                f"dict holding {metric!r}, or call ringleader.report(epoch, {metric}=value)")
    if _is_number(result):
        values = {metric: float(result)}
    elif isinstance(result, dict):
        if not _is_number(result.get(metric)):
            return (f"the function returned a dict without a number under {metric!r} "
                    f"(keys: {sorted(map(str, result))})")
        values = {k: float(v) for k, v in result.items()
                  if isinstance(k, str) and k and not any(c.isspace() for c in k)
                  and _is_number(v)}
    else:
        return (f"the function returned {type(result).__name__}, not a number or a dict "
                f"holding {metric!r}")
    trial = ringleader.trial() or {}
    resource = max([trial.get("rung") or 1, *reported.values()])
    ringleader.report(resource, **values)
    return None


def main() -> int:
    with open(META_FILE, encoding="utf-8") as f:
        meta = json.load(f)
    problems = check_interpreter(sys.version_info, meta["python"], source=meta.get("source"))
    if problems:
        for p in problems:
            print(f"ringleader launch: {p}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_RUN
    import cloudpickle
    import ringleader

    with open(meta.get("fn", FN_FILE), "rb") as f:
        fn = cloudpickle.load(f)
    try:
        result = fn(**ringleader.params())
    except ringleader.Stopped:
        return 0
    except Exception:  # noqa: BLE001 (the trial's log is where the user looks)
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_RAISED
    try:
        error = report_result(result, meta["metric"], ringleader)
    except ringleader.Stopped:
        return 0
    if error:
        print(f"ringleader launch: {error}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_RUN
    return 0


if __name__ == "__main__":
    sys.exit(main())
