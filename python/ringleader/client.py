"""A client of a ringleader node's HTTP API (docs/book/src/reference/http-api.md), standard
library only.

    c = ringleader.Client()                 # RINGLEADER_PEER, RINGLEADER_TOKEN, … as the CLI
    job = c.submit({"name": "hello", "kind": "command", "command": ["true"]})
    job.wait()                              # the final document, or raises JobFailed

How it reaches the node is the CLI's rule (node/api/src/client.rs): plain http to a
loopback address; https beyond loopback, trusting the node by the pinned SHA-256 of its TLS
key's SubjectPublicKeyInfo alone (from `RINGLEADER_TLS_SHA256` or the token file's `tls`
line), checked before any byte is sent; a token is never sent in clear beyond loopback
unless the peer is written `http://HOST:PORT`.
"""

import hashlib
import http.client
import ipaddress
import json
import os
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from . import _errors, _launch, _toml
from ._errors import Doc
from .distributions import search_params
from .documents import BestTrial, DatasetFetch, Trial

#: Rows of a page of `GET /v1/jobs` this client asks for (the API's `LIST_ROWS_MAX`).
JOBS_PAGE_ROWS = 10_000

DEFAULT_PEER = "127.0.0.1:7071"
# The CLI's default token file: the admin token of a node started in this directory with
# the default --data-dir (node/src/cli/mod.rs, DEFAULT_DATA_DIR).
DEFAULT_TOKEN_FILE = os.path.join("ringleader-data", "api.token")
TOKEN_FILE_BYTES_MAX = 4096
# How long a request waits for the node, seconds (the CLI's REQUEST_TIMEOUT_MS).
REQUEST_TIMEOUT_S = 10.0
# Pause between polls of `wait`, `logs(follow=True)` and `get_dataset`, seconds.
POLL_S = 0.2
# Most often `Search.wait` prints a progress line (when something changed), seconds.
PROGRESS_EVERY_S = 10.0
# `stopped`: a trial's job its search stopped (ASHA, the median rule).
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "stopped")

_J = TypeVar("_J", bound="Job")


def _read_token_file(path: str) -> tuple[str | None, str | None]:
    """(token, tls pin) from a token file: the token on its first line, then optionally
    `tls sha256:HEX` (node/api/src/auth.rs, TokenFileText)."""
    with open(path, "rb") as f:
        data = f.read(TOKEN_FILE_BYTES_MAX + 1)
    if len(data) > TOKEN_FILE_BYTES_MAX:
        raise ValueError(f"token file {path}: larger than a token")
    lines = data.decode().splitlines()
    if not lines or not lines[0].strip():
        return None, None
    pin = None
    for i, line in enumerate(lines[1:], start=2):
        line = line.strip()
        if not line:
            continue
        if line.startswith("tls ") and pin is None:
            pin = line[4:].strip()
        else:
            raise ValueError(f"token file {path}: line {i} is not `tls sha256:HEX`")
    return lines[0].strip(), pin


def _checked_token(token: str, source: str) -> str:
    """`token` trimmed; ValueError when it is more than one line (a token
    file's whole text, whose second line is the TLS pin: `RINGLEADER_TOKEN=$(cat
    api.token)`) or holds other control characters, which no HTTP header carries. `source`
    names where it came from, for the message."""
    token = token.strip()
    if "\n" in token or "\r" in token:
        raise ValueError(
            f"{source} holds more than one line (a token file's whole text? its `tls "
            "sha256:…` line is the API's TLS pin, not part of the token): set "
            "RINGLEADER_TOKEN_FILE to the file instead, which reads both, or take the "
            "token alone: RINGLEADER_TOKEN=$(head -n1 FILE)")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in token):
        raise ValueError(f"{source} holds control characters: a token is one line of text")
    return token


def _der(buf: bytes, at: int) -> tuple[int, int, int]:
    """One DER element at `at`: (tag, start of its content, end of its content)."""
    tag, n = buf[at], buf[at + 1]
    at += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(buf[at:at + k], "big")
        at += k
    if at + n > len(buf):
        raise ValueError("truncated DER")
    return tag, at, at + n


def spki_fingerprint(cert_der: bytes) -> str:
    """`sha256:HEX` of a DER certificate's SubjectPublicKeyInfo: what the CLI pins."""
    _, c, _ = _der(cert_der, 0)                  # Certificate
    _, t, _ = _der(cert_der, c)                  # tbsCertificate
    tag, _, end = _der(cert_der, t)
    if tag == 0xA0:                              # [0] version
        t = end
    for _ in range(5):                           # serial, signature, issuer, validity, subject
        _, _, t = _der(cert_der, t)
    _, _, end = _der(cert_der, t)                # subjectPublicKeyInfo
    return "sha256:" + hashlib.sha256(cert_der[t:end]).hexdigest()


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """https trusting the server whose key has the pinned fingerprint (no CA, no names)."""

    def __init__(self, host: str, port: int, pin: str, timeout: float) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # trust comes from the pin, checked in connect()
        super().__init__(host, port, timeout=timeout, context=ctx)
        self._pin = pin.lower()

    def connect(self) -> None:
        super().connect()
        assert isinstance(self.sock, ssl.SSLSocket)
        got = spki_fingerprint(self.sock.getpeercert(binary_form=True) or b"")
        if got != self._pin:
            self.close()
            raise ssl.SSLError(f"the node's TLS key is {got}, not the pinned {self._pin}")


def _split_host_port(peer: str) -> tuple[str, int]:
    if peer.startswith("["):
        host, _, rest = peer[1:].partition("]")
        return host, int(rest.lstrip(":") or 7071)
    host, _, port = peer.rpartition(":")
    return (host, int(port)) if host else (peer, 7071)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Client:
    """A client of one node's API; any node of the cluster answers for all of it.

    `peer`: `host:port` (or `http://…`, `https://…`); default `RINGLEADER_PEER`, else
    127.0.0.1:7071. `token`: default `RINGLEADER_TOKEN`, else the file
    `RINGLEADER_TOKEN_FILE` names, else `ringleader-data/api.token` when it exists (the
    CLI's order); a token of more than one line (a token file's whole text) is refused
    with ValueError, as the CLI refuses it. `tls_sha256`: the pin of the API's TLS key
    beyond loopback; default `RINGLEADER_TLS_SHA256`, else the token file's `tls` line.
    """

    def __init__(self, peer: str | None = None, token: str | None = None, *,
                 tls_sha256: str | None = None, timeout: float = REQUEST_TIMEOUT_S) -> None:
        peer = peer or os.environ.get("RINGLEADER_PEER") or DEFAULT_PEER
        pin = tls_sha256 or os.environ.get("RINGLEADER_TLS_SHA256") or None
        if token is not None:
            token = _checked_token(token, "the token given to Client")
        else:
            token = os.environ.get("RINGLEADER_TOKEN") or None
            if token is not None:
                token = _checked_token(token, "RINGLEADER_TOKEN") or None
        # The token file a token came from: read again when the token is refused, so a
        # client outlives `ringleader key rotate`, which rewrites a node's api.token.
        self._token_file: str | None = None
        if token is None:
            path = os.environ.get("RINGLEADER_TOKEN_FILE")
            if not path and os.path.exists(DEFAULT_TOKEN_FILE):
                path = DEFAULT_TOKEN_FILE
            if path:
                token, file_pin = _read_token_file(path)
                pin = pin or file_pin
                self._token_file = path
        self.token = token
        self.timeout = timeout
        lower = peer.lower()
        if lower.startswith("http://"):
            self._scheme, bare = "http", peer[7:]
        elif lower.startswith("https://"):
            self._scheme, bare = ("https" if pin else "needs-pin"), peer[8:]
        else:
            bare = peer
            if _is_loopback(_split_host_port(peer)[0]):
                self._scheme = "http"
            elif pin:
                self._scheme = "https"
            else:
                self._scheme = "needs-pin" if token else "http"
        self.peer = bare.rstrip("/")
        self._pin = pin

    def __repr__(self) -> str:
        return f"ringleader.Client({self.peer!r})"

    # --- HTTP -------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        host, port = _split_host_port(self.peer)
        if self._scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        if self._scheme == "https" and self._pin:
            return _PinnedHTTPSConnection(host, port, self._pin, self.timeout)
        raise _errors.Unreachable(
            f"the node's API at {self.peer} speaks TLS and its fingerprint is unknown: set "
            "RINGLEADER_TOKEN_FILE to a node's api.token, which carries it (or "
            f"RINGLEADER_TLS_SHA256; http://{self.peer} would send the token in clear)")

    def request(self, method: str, path: str, body: object = None,
                content_type: str | None = None) -> Any:
        """`method path` with the token; the answer's JSON, or a typed ApiError. A token
        read from a token file that the node refuses (401) is read again once: if the file
        holds another token now (a key rotation wrote it), the request is sent again with it."""
        try:
            return self._request(method, path, body, content_type)
        except _errors.ApiError as e:
            if e.status != 401 or not self._token_file:
                raise
            try:
                token, _ = _read_token_file(self._token_file)
            except (OSError, ValueError):
                raise e from None
            if token == self.token:
                raise
            self.token = token
            return self._request(method, path, body, content_type)

    def _request(self, method: str, path: str, body: object = None,
                 content_type: str | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data: bytes | None = None
        if body is not None:
            if not isinstance(body, (bytes, str)):
                body, content_type = json.dumps(body), "application/json"
            headers["Content-Type"] = content_type or "text/plain"
            data = body.encode() if isinstance(body, str) else body
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise _errors.Unreachable(f"cannot reach ringleader node at {self.peer}: {e}") from e
        finally:
            conn.close()
        try:
            doc = json.loads(answer) if answer else None
        except ValueError:
            doc = None
        if 200 <= resp.status < 300:
            if doc is None and answer:
                raise _errors.Unreachable(f"node at {self.peer} sent an unreadable answer")
            return doc
        reason = doc.get("error") if isinstance(doc, dict) else None
        if resp.status == 401:
            missing = not self.token or (isinstance(doc, dict) and doc.get("reason") == "missing")
            reason = ("the node wants an API token: set RINGLEADER_TOKEN or RINGLEADER_TOKEN_FILE "
                      f"(a node's admin token is in its <data-dir>/api.token; node at {self.peer})"
                      if missing else f"the API token was refused by the node at {self.peer}")
        if reason is None:
            text = answer[:200].decode(errors="replace")
            reason = f"node at {self.peer} answered {resp.status}: {text}"
        cls = _errors.BY_STATUS.get(resp.status, _errors.ApiError)
        if cls is _errors.BadRequest and method == "POST" and path.startswith("/v1/jobs?") \
                and isinstance(doc, dict) and "field" in doc:
            cls = _errors.SpecError
        raise cls(resp.status, reason, doc if isinstance(doc, dict) else None)

    # --- cluster and jobs ---------------------------------------------------------------

    def status(self) -> Doc:
        """This node, the chief and its term, the members, the jobs (`status --json`)."""
        status: Doc = self.request("GET", "/v1/status")
        return status

    def submit(self, spec: dict[str, Any] | str | os.PathLike[str], *,
               idempotency_token: str | None = None) -> "Job":
        """Submits a job and returns it (a `Job`, a `Search` for `kind = "search"`).

        `spec`: a dict with the TOML spec's keys (docs/book/src/reference/spec.md; `search.params`
        may be a dict of `{name: distribution or list}`, see `ringleader.distributions`), the TOML
        text itself, or the path of a TOML file. A refused spec raises `SpecError` with the
        node's `reason`, `field` and `line`. `idempotency_token`: a retried submit with the
        same value gets the same job.
        """
        if isinstance(spec, dict):
            text = _toml.dumps(_prepared(spec))
        elif isinstance(spec, os.PathLike) or (isinstance(spec, str) and "\n" not in spec
                                               and spec.endswith(".toml")):
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        elif isinstance(spec, str):
            text = spec
        else:
            raise TypeError(f"a spec is a dict, TOML text or a path, not {type(spec).__name__}")
        query = "?token=" + urllib.parse.quote(idempotency_token) if idempotency_token else "?"
        answer = self.request("POST", "/v1/jobs" + query, text, "application/toml")
        return self.job(answer["id"])

    def jobs(self) -> list[Doc]:
        """Every job's summary (`[{id, name, kind, state, …}]`), oldest first, as
        `ringleader jobs --all --json`: the API's pages of `JOBS_PAGE_ROWS`, walked back."""
        jobs: list[Doc] = []
        before: str | None = None
        while True:
            query = f"?limit={JOBS_PAGE_ROWS}"
            if before is not None:
                query += "&before=" + urllib.parse.quote(before)
            page = self.request("GET", "/v1/jobs" + query)
            jobs[:0] = page
            if len(page) < JOBS_PAGE_ROWS:
                return jobs
            before = page[0]["id"]

    def queue(self) -> list[Doc]:
        """The waiting jobs, and running searches whose trials wait (`trials` true), in
        the order they will start (`ringleader queue --json`'s `jobs`): `[{position, id,
        name, owner, priority, priority_label, effective_priority, workers,
        cpus_per_worker, gpus_per_worker, submitted_at_ms, pending_reason, trials}]`."""
        doc = self.request("GET", "/v1/queue")
        jobs: list[Doc] = doc["jobs"]
        return jobs

    def quotas(self) -> list[Doc]:
        """Each user's use against its quota (`ringleader quota ls --json`): `[{user,
        quota, used: {cpus, gpus}, borrowed: {cpus, gpus}, gpu_hours_used?}]`."""
        rows: list[Doc] = self.request("GET", "/v1/quotas")
        return rows

    def set_quota(self, user: str, *, cpus: int | None = None, gpus: int | None = None,
                  borrow_cpus: int | None = None, borrow_gpus: int | None = None,
                  gpu_hours: float | None = None, weight: int | None = None,
                  max_priority: int | None = None, group: str | None = None) -> Doc:
        """Sets the fields given of `user`'s (or `@GROUP`'s) quota, as `ringleader quota
        set` does (the admin token only: Forbidden otherwise); returns `{user, quota}`."""
        body = {"user": user, "cpus": cpus, "gpus": gpus, "borrow_cpus": borrow_cpus,
                "borrow_gpus": borrow_gpus, "gpu_hours": gpu_hours, "weight": weight,
                "max_priority": max_priority, "group": group}
        answer: Doc = self.request("POST", "/v1/quotas", body)
        return answer

    def job(self, id: str) -> "Job":
        """The job `id` (a `Search` for a search), fetched at once: NotFound if there is none."""
        doc = self.request("GET", f"/v1/jobs/{urllib.parse.quote(str(id))}")
        cls: type[Job] = Search if doc.get("kind") == "search" else Job
        return cls(self, doc)

    def launch(self, fn: Callable[..., Any], params: dict[str, Any], *,
               algorithm: str = "grid", metric: str | None = None, direction: str = "max",
               trials: int | None = None, max_parallel: int | None = None, workers: int = 1,
               resource: int | str | None = None, resumable: bool | None = None,
               python: str | None = None, name: str | None = None,
               env: dict[str, str] | None = None, priority: int | str | None = None,
               dataset: str | None = None, quiet: bool = False,
               **search: Any) -> "Search":
        """Runs `fn(**params)` as the command trials of a search; returns the `Search`
        (`.wait()` gives the final document, `.best` the best trial).

        `fn` is pickled here with cloudpickle and rides in the spec's `[[files]]` with a
        small runner (`PickleTooLarge` past the spec's 128 KiB), so it needs no shared
        filesystem. `python`: the interpreter trials run under on each node, which needs
        `cloudpickle` and `ringleader` installed and this Python's minor version (else the
        trial fails saying so and how to install them); default: the node's `--python`
        (`status()["python"]`), else this interpreter (`sys.executable`: right on a
        one-host cluster, and where every host has the environment at the same path; a
        package imported from a checkout then rides along as the trials' `PYTHONPATH`).
        `params`: `{name: list of values, or
        ringleader.uniform/loguniform/randint/choice}`. `fn`'s return value, a number or a
        dict holding `metric` (default `"objective"`), is the trial's metric, unless `fn`
        reported it itself with `ringleader.report(epoch, metric=value)` (which ASHA and
        the median rule act on). A function that raises fails its trial, with the traceback
        in its logs. `resource`: the epochs a trial runs to (the search's `max_resource`,
        required by asha and hyperband).

        `resumable` (the search's `resumable`; default None: True for `asha` and
        `hyperband`, which alone pause and promote): ASHA and Hyperband pause a trial at
        each rung and promote the best, as Ray Tune's ASHA does; each promotion calls `fn`
        again in a new process, which resumes from what it saved. So `fn` loads its state
        with `ringleader.checkpoint.load()` (None in the first run), trains from there to
        `ringleader.trial()["rung"]`, and saves before each `report`; a loop that goes on
        past the rung ends at the report after it (`Stopped`, which the runner takes as the
        run's end). A function that saves nothing starts over when promoted (its reports
        up to the last rung are ignored). With `resumable=False`, every trial runs to
        `resource` and ASHA only stops the laggards (SIGTERM, `Stopped` at the next
        report).

        `dataset`: a shared dataset's name (`ringleader dataset ls`), fetched to each
        trial's node before it starts; `ringleader.dataset_dir()` is its directory there.
        `env`: extra environment of the trials; `priority`: the search's (and its trials')
        priority, `"low"`, `"normal"`, `"high"` or 0 to 1000
        (docs/book/src/guide/sharing.md); `quiet`: no progress lines from `wait()`; the
        other keywords go into `[search]` (`seed`, `min_resource`, `reduction_factor`, `stopping`, …). A spec
        the node refuses raises `SpecError` naming the argument it came from
        (`launch(max_parallel=-1): …`, its `argument`).
        """
        arguments = dict(search, params=params, algorithm=algorithm, metric=metric,
                         direction=direction, trials=trials, max_parallel=max_parallel,
                         workers=workers, resource=resource, resumable=resumable,
                         python=python, name=name, env=env, priority=priority,
                         dataset=dataset, fn=fn)
        try:
            if isinstance(params, dict):
                search_params(params)
        except (TypeError, ValueError) as e:
            text = str(e).removeprefix("search.params.")
            raise type(e)(f"launch(params=...): {text}") from None
        spec = _launch.launch_spec(
            fn, params, algorithm=algorithm, metric=metric, direction=direction,
            trials=trials, max_parallel=max_parallel, workers=workers, resource=resource,
            resumable=resumable, python=python, name=name, env=env, priority=priority,
            dataset=dataset, node_python=lambda: self.status().get("python"), **search)
        try:
            job = self.submit(spec)
        except _errors.SpecError as e:
            raise _launch.launch_error(e, arguments) from None
        assert isinstance(job, Search)
        job.quiet = quiet
        return job

    # --- tokens -------------------------------------------------------------------------

    def create_token(self, name: str, *, user: str | None = None,
                     role: str = "user") -> Doc:
        """Makes an API token named `name` for `user` (default: `name`) with `role`
        (`admin`, `user` or `viewer`; `ringleader token create NAME --user U --role R`).
        Needs an admin token. Returns `{"name", "user", "role", "token", "created_at_ms"}`:
        the token is shown this once (the cluster keeps its hash)."""
        body: dict[str, object] = {"name": name, "role": role}
        if user is not None:
            body["user"] = user
        made: Doc = self.request("POST", "/v1/tokens", body)
        return made

    def tokens(self) -> list[Doc]:
        """Every token: `{"name", "user", "role", "created_at_ms", "created_by",
        "hash_prefix"}` (`ringleader token ls --json`)."""
        listed: list[Doc] = self.request("GET", "/v1/tokens")
        return listed

    def revoke_token(self, name: str) -> None:
        """Revokes the token `name`: every node refuses it within about a second. Needs an
        admin token."""
        self.request("DELETE", f"/v1/tokens/{name}")

    # --- datasets -----------------------------------------------------------------------

    def datasets(self) -> list[Doc]:
        """Every registered dataset with its live holders (`dataset ls --json`)."""
        datasets: list[Doc] = self.request("GET", "/v1/datasets")
        return datasets

    def add_dataset(self, name: str, path: str | os.PathLike[str], *,
                    chunk_mib: int | None = None) -> Doc:
        """Adds the file or directory at `path` **on the node's machine** (the node this
        client talks to reads it; a relative path is made absolute here, against this
        process's directory, as the CLI does) as dataset `name`; blocks while it is copied
        into the node's store. Returns the dataset's document."""
        body: dict[str, object] = {"name": name, "path": os.path.abspath(os.fspath(path))}
        if chunk_mib is not None:
            body["chunk_mib"] = int(chunk_mib)
        added: Doc = self.request("POST", "/v1/datasets", body)
        return added

    def get_dataset(self, name: str, to: str | os.PathLike[str] | None = None, *,
                    wait: bool = True, timeout: float | None = None) -> DatasetFetch:
        """Fetches dataset `name` to **the node's machine** (the node this client talks to)
        from the peers that hold it, and with `to`, also writes its files under that
        directory there (made absolute here, as the CLI does). Waits until it is done
        (`wait=False`: returns at once) and returns the fetch's status (a `DatasetFetch`,
        still the dict it was), whose `path` is where the files are on the node; raises
        ApiError if the fetch failed."""
        body = {"to": os.path.abspath(os.fspath(to)) if to is not None else None}
        quoted = urllib.parse.quote(name)
        status = DatasetFetch.of(self.request("POST", f"/v1/datasets/{quoted}/get", body))
        deadline = None if timeout is None else time.monotonic() + timeout
        while wait and status.state == "fetching":
            if deadline is not None and time.monotonic() > deadline:
                raise _errors.WaitTimeout(f"dataset {name}: still fetching after {timeout} s")
            time.sleep(POLL_S)
            status = DatasetFetch.of(self.request("GET", f"/v1/datasets/{quoted}/get"))
        if status.state == "failed":
            raise _errors.ApiError(500, f"dataset {name}: fetch failed: {status.error}", status)
        return status


def _prepared(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A dict spec with `search.params` given as `{name: distribution or list}` turned into
    the list of tables the spec wants."""
    search = spec.get("search")
    if isinstance(search, dict) and isinstance(search.get("params"), dict):
        return dict(spec, search=dict(search, params=search_params(search["params"])))
    return dict(spec)


# The order trial states are counted in a progress line, and the words for them.
TRIAL_STATE_WORDS = (("running", "running"), ("pending", "pending"), ("paused", "paused"),
                     ("succeeded", "done"), ("stopped", "stopped"), ("failed", "failed"))


def progress_line(doc: Doc) -> str:
    """A search document's progress: its trials counted by state and its best so far."""
    trials = doc.get("trials") or []
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.get("state", "?")] = counts.get(t.get("state", "?"), 0) + 1
    parts = [f"{counts.pop(state)} {word}" for state, word in TRIAL_STATE_WORDS
             if state in counts]
    parts += [f"{n} {state}" for state, n in sorted(counts.items())]
    line = f"ringleader: {doc.get('id')} {doc.get('name')} [{doc.get('state')}]: "
    line += f"{len(trials)} trials" + (": " + ", ".join(parts) if parts else "")
    best = doc.get("best")
    if best:
        metric = doc.get("search_metric") or "metric"
        line += f"; best {metric} {best.get('metric'):.6g} (trial {best.get('id')})"
    return line


def _offsets_query(offsets: dict[str, int]) -> str:
    return ",".join(f"{w}:{o}" for w, o in sorted(offsets.items()))


def _lines(doc: Doc, offsets: dict[str, int]) -> Iterator["LogLine"]:
    """A logs answer's lines as `LogLine`s; moves `offsets` past them."""
    runs = doc.get("runs") or []
    for chunk in doc["chunks"]:
        run = _run_of(runs, chunk["generation"])
        for line in chunk["text"].splitlines():
            yield LogLine(line, chunk["rank"], run, chunk["generation"])
        offsets[chunk["worker"]] = chunk["next_offset"]


def _failure_reason(doc: Doc) -> str:
    """Why a job ended as it did: its last event's reason, else its exits."""
    for event in reversed(doc.get("events") or []):
        if isinstance(event, dict) and event.get("reason"):
            return str(event["reason"])
    exits = doc.get("exits") or {}
    if exits:
        return "exits " + ", ".join(f"rank {r}: {c}" for r, c in sorted(exits.items()))
    return str(doc.get("state", "unknown"))


class LogLine(str):
    """One line of a rank's output (a str), with the `rank` that printed it and the `run`
    it belongs to (1-based: a search trial's first run, then each promotion and re-run; a
    job's attempts), placed in `generation`."""

    __slots__ = ("rank", "run", "generation")
    rank: int
    run: int
    generation: int | None

    def __new__(cls, text: str, rank: int, run: int = 1,
                generation: int | None = None) -> "LogLine":
        line = super().__new__(cls, text)
        line.rank = rank
        line.run = run
        line.generation = generation
        return line

    def __repr__(self) -> str:
        return f"LogLine({str(self)!r}, rank={self.rank}, run={self.run})"


def _run_of(runs: list[int], generation: int) -> int:
    """The run (1-based) `generation` belongs to: the runs placed at or before it."""
    return max(1, sum(1 for g in runs if g <= generation))


class Job:
    """A job on the cluster. `doc` is its latest document (`ringleader job ID --json`);
    `refresh()` fetches it again."""

    def __init__(self, client: Client, doc: Doc) -> None:
        self.client = client
        self.doc = doc

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.doc.get('name')!r} {self.state}>"

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    @property
    def state(self) -> str:
        """`pending`, `running`, `succeeded`, `failed` or `cancelled`, as of the last fetch;
        `stopped` for a trial's job its search stopped (ASHA, the median rule), an end
        that `wait` returns from like `succeeded`."""
        return str(self.doc["state"])

    @property
    def owner(self) -> str:
        """The user the job belongs to (the submitting token's; a trial's job, its search's
        owner): `admin` for the admin token's jobs, and from nodes older than owners. Only
        the owner and admins read its logs, metrics and checkpoints (Forbidden, naming the
        owner, for anyone else)."""
        return str(self.doc.get("owner", "admin"))

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def pending_reason(self) -> str | None:
        """Why the job waits, as of the last fetch (None unless it is pending and the
        chief has said why)."""
        reason = self.doc.get("pending_reason")
        return None if reason is None else str(reason)

    def refresh(self: _J) -> _J:
        """Fetches the job's document again; returns self."""
        self.doc = self.client.request("GET", f"/v1/jobs/{self.id}")
        return self

    def wait(self, timeout: float | None = None) -> Doc:
        """Waits until the job ends and returns its final document. Raises JobFailed (with
        the reason from its events) if it failed, JobCancelled if it was cancelled,
        WaitTimeout (a TimeoutError) after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            self._waiting(done=False)
            if deadline is not None and time.monotonic() > deadline:
                raise _errors.WaitTimeout(
                    f"job {self.id} is still {self.state} after {timeout} s")
            time.sleep(POLL_S)
        self._waiting(done=True)
        if self.state == "failed":
            raise _errors.JobFailed(self.id, _failure_reason(self.doc), self.doc)
        if self.state == "cancelled":
            raise _errors.JobCancelled(self.id, _failure_reason(self.doc), self.doc)
        return self.doc

    def _waiting(self, done: bool) -> None:
        """Called by `wait` at each poll with the fresh document (`done`: the last)."""

    def logs(self, follow: bool = False) -> Iterator[LogLine]:
        """Every run's output, oldest run first, line by line (`ringleader logs ID
        [--follow]`): an iterator of `LogLine`s (a str with the `rank` that printed it and
        its `run`: a search trial's first run, then each promotion and re-run, each a new
        process; a job's attempts). With `follow`, it goes on until the job ends; a new
        generation of the job (a restart, a re-form, a promotion) starts its ranks' logs
        again."""
        path = f"/v1/jobs/{self.id}/logs"
        first = self.client.request("GET", path)
        runs = first.get("runs") or []
        for generation in runs[:-1]:
            offsets: dict[str, int] = {}
            while True:
                doc = self.client.request("GET", f"{path}?generation={generation}&offsets="
                                          + _offsets_query(offsets))
                yield from _lines(doc, offsets)
                if all(not c["text"] for c in doc["chunks"]):
                    break
        offsets, generation, doc = {}, None, first
        while True:
            if doc is None:
                doc = self.client.request("GET", f"{path}?offsets=" + _offsets_query(offsets))
            chunks = doc["chunks"]
            if chunks and generation != chunks[0]["generation"]:
                generation = chunks[0]["generation"]
                if offsets:
                    # Read at the last generation's offsets: read the new one from its start.
                    offsets.clear()
                    doc = None
                    continue
            yield from _lines(doc, offsets)
            drained = all(not c["text"] for c in chunks)
            if drained and (not follow or doc["state"] in TERMINAL_STATES):
                return
            doc = None
            if drained:
                time.sleep(POLL_S)

    def metrics(self) -> dict[str, list[tuple[int, float]]]:
        """Each metric's history: `{name: [(step, value), …]}`."""
        doc = self.client.request("GET", f"/v1/jobs/{self.id}/metrics")
        return {k: [(p[0], p[1]) for p in v] for k, v in doc["metrics"].items()}

    def cancel(self: _J) -> _J:
        """Cancels the job (BadRequest with the node's reason if it already ended)."""
        self.client.request("POST", f"/v1/jobs/{self.id}/cancel")
        return self.refresh()


class Search(Job):
    """A search job: its trials and best, the same records as `ringleader job ID --json`.

    `wait()` prints a progress line to stderr when the trials' states or the best change,
    at most one each `PROGRESS_EVERY_S` seconds, and the last one when the search ends
    (`ringleader: j-4 train: 6 trials: 2 running, 3 done, 1 pending; best 0.91 (trial
    2)`); `quiet` (an attribute, `launch(quiet=True)`) turns that off.
    """

    quiet: bool = False
    _progress: tuple[str, float] | None = None

    def wait(self, timeout: float | None = None, *, quiet: bool | None = None) -> Doc:
        """`Job.wait`, with progress lines unless `quiet` (default: `self.quiet`)."""
        before = self.quiet
        if quiet is not None:
            self.quiet = quiet
        try:
            return super().wait(timeout)
        finally:
            self.quiet = before
            self._progress = None

    def _waiting(self, done: bool) -> None:
        if self.quiet:
            return
        line = progress_line(self.doc)
        now = time.monotonic()
        last = self._progress
        if last is not None and (line == last[0]
                                 or (not done and now - last[1] < PROGRESS_EVERY_S)):
            return
        self._progress = (line, now)
        print(line, file=sys.stderr, flush=True)

    def trials(self) -> list[Trial]:
        """Every trial as of now: `Trial`s (dataclasses read as the dicts they were) with
        `id, job, params, state, metric, resource, promotions, node` (refreshes the
        document)."""
        return [Trial.of(t) for t in self.refresh().doc.get("trials") or []]

    @property
    def best(self) -> BestTrial | None:
        """The best trial so far, a `BestTrial` (`{id, params, metric}` as before), or None
        (refreshes the document)."""
        best = self.refresh().doc.get("best")
        return None if best is None else BestTrial.of(best)
