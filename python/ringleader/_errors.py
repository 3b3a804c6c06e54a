"""The package's exceptions: every failure the node reports arrives as one of these, with
the node's own words in `reason`. Every one is a `RingleaderError`; those that are also a
built-in error (`TimeoutError`, `ValueError`, the ring's `RuntimeError`s) stay one."""

from typing import Any

from ._base import RingFailure as RingFailure
from ._base import RingleaderError as RingleaderError

Doc = dict[str, Any]
"""A JSON document of the node's, as `json.loads` reads it."""


class ApiError(RingleaderError):
    """The node answered with an error: `status` (HTTP), `reason` (the node's `error`)."""

    def __init__(self, status: int, reason: str, doc: Doc | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.doc: Doc = doc or {}


class BadRequest(ApiError):
    """400: the request was refused (a bad name, a path the node cannot share, …)."""


class SpecError(BadRequest):
    """400 on submit: the spec was refused; `field` (a dotted path) and `line` (1-based),
    each None where the node does not know it. From `Client.launch`, `argument` names the
    argument of `launch` the refused field came from (and `line` is None: the TOML was
    `launch`'s, not the user's)."""

    def __init__(self, status: int, reason: str, doc: Doc | None = None) -> None:
        super().__init__(status, reason, doc)
        self.field: str | None = self.doc.get("field")
        self.line: int | None = self.doc.get("line")
        self.argument: str | None = self.doc.get("argument")


class Unauthorized(ApiError):
    """401: the token is missing or refused."""


class Forbidden(ApiError):
    """403: a foreign Host or Origin, or an action the token may not take."""


class NotFound(ApiError):
    """404: no such job, dataset or fetch."""


class Conflict(ApiError):
    """409: the name exists."""


class Unavailable(ApiError):
    """503 (no chief yet, or it is unreachable: retry) or 429 (too many requests)."""


class Unreachable(RingleaderError):
    """No HTTP answer from the node (down, wrong address, TLS pin mismatch)."""


class JobFailed(RingleaderError):
    """`Job.wait()` on a job that ended `failed`: `reason` says why (its last event),
    `cause` is its failed attempt's cause in one line (`rank 0 on m1: exit 1:
    ModuleNotFoundError: No module named 'foo'`, or why its program could not start;
    `reason` when the document has none), `stderr_tail` the failing rank's last stderr
    lines (a list, maybe empty), `doc` its final document. The message holds the cause and
    the tail."""

    def __init__(self, job_id: str, reason: str, doc: Doc) -> None:
        failure = doc.get("failure") if isinstance(doc, dict) else None
        failure = failure if isinstance(failure, dict) else {}
        self.cause: str = str(failure.get("cause") or reason)
        tail = failure.get("stderr_tail") or []
        self.stderr_tail: list[str] = [str(line) for line in tail if isinstance(line, str)]
        message = f"job {job_id} failed: {self.cause}"
        if self.stderr_tail:
            message += "\n  stderr (last lines):\n" + "\n".join(
                f"    {line}" for line in self.stderr_tail)
        super().__init__(message)
        self.job_id = job_id
        self.reason = reason
        self.doc = doc


class JobCancelled(JobFailed):
    """`Job.wait()` on a job that was cancelled."""

    def __init__(self, job_id: str, reason: str, doc: Doc) -> None:
        super().__init__(job_id, reason, doc)
        self.args = (f"job {job_id} was cancelled",)


class WaitTimeout(TimeoutError, RingleaderError):
    """`Job.wait(timeout)` or `Client.get_dataset(timeout=…)` ran out of time (a
    `TimeoutError` as well)."""


class Stopped(RingleaderError):
    """Raised by `ringleader.report()` once the node stopped this trial (SIGTERM): the
    search decided it goes no further; and in a resumable trial's run, at the report after
    the one at its rung: this run is done (a promotion resumes the trial in a new one).
    Let it end the program, or catch it to clean up first (the node sends SIGKILL 5 s
    after SIGTERM). `launch`'s runner ends the trial with exit 0 on it."""


BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: Unavailable,
    503: Unavailable,
}
