"""The generic half of an elastic rank of the ringleader protocol
(docs/book/src/reference/protocol.md, *Elastic command ranks*), with the standard library only:
no framework here, so a rank written on another framework than torch reuses it
(`ringleader.torch` is built on it).

- `GenerationFeed`: a thread reads the node's lines on stdin (`ringleader-generation {json}`,
  `ringleader-stop`, the end of input); the rank waits for the next generation newer than
  the one it is in (`next`), looks without waiting (`pending`), and is called back when one
  arrives (`on_arrival`), to abort a step blocked on a silent peer.
- `ComputeClock`: the rank's compute sections; its thread prints `ringleader-heartbeat
  computing_ms=X` every `HEARTBEAT_EVERY_S` while one lasts, so the node names a rank stuck
  in its own computation (a hang) without confusing it with a rank waiting on a peer.
- `StepStats`: the mean compute and wait time per step, printed as `ringleader-rank-stats`
  at the first step, then about every `RANK_STATS_EVERY_S` (the chief finds stragglers).
- `failed` and `resumed`: the `ringleader-elastic` lines of a re-form.
- `is_standby` and `ready`: a joiner the node started ahead of the re-form that takes it in
  (`RINGLEADER_STANDBY=1`, no generation yet) prints `ringleader-ready` once it is set up
  (framework imported, model built), and the node then re-forms the ring with it: the
  survivors train on meanwhile and wait only for its connect.
- `install_line_stdout`: whole lines on stdout from every thread (a heartbeat never lands
  inside a line the script prints).

Every line is made by the protocol crate (`ringleader._native`), so it parses on the node.
"""

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

from . import _native
from .rank import Environ, _emit

PROTOCOL_ENV = _native.ELASTIC_PROTOCOL_ENV
STANDBY_ENV = _native.STANDBY_ENV
GENERATION_PREFIX = "ringleader-generation "
STOP_LINE = "ringleader-stop"
# Longest line read from stdin, bytes (the protocol's bound on a node line).
NODE_LINE_BYTES_MAX = 64 * 1024
# How often a heartbeat is printed while a compute section lasts, seconds.
HEARTBEAT_EVERY_S = 1.0
# How often rank stats are printed (after the first step's, at once), seconds.
RANK_STATS_EVERY_S = 1.0


def is_elastic_rank(environ: Environ | None = None) -> bool:
    """Whether this process is a rank of a `[elastic] protocol = "ringleader"` job (its
    generations arrive on stdin)."""
    env = os.environ if environ is None else environ
    return env.get(PROTOCOL_ENV) == "ringleader"


def is_standby(environ: Environ | None = None) -> bool:
    """Whether this elastic rank is a standby joiner: started ahead of the re-form that takes
    it in, its first generation comes once it said `ready()`."""
    env = os.environ if environ is None else environ
    return is_elastic_rank(env) and env.get(STANDBY_ENV) == "1"


def ready(file: IO[str] | None = None) -> None:
    """Prints `ringleader-ready`: this standby is set up and waits for its first generation."""
    _emit(_native.ready_line(), file)


class Generation:
    """One `ringleader-generation` line: `generation`, `rank`, `world`, every rank's
    data-plane address (`addrs`, "host:port"), the micro-batches each step accumulates
    (`accumulation`: 1, or more once a preemption shrank the ring and it keeps its global
    batch, `batch_workers`), and the `line` itself (hand it to
    `ringleader._native.Ring.from_generation_line`)."""

    def __init__(self, line: str) -> None:
        body = json.loads(line[len(GENERATION_PREFIX):])
        self.line = line
        self.generation = int(body["generation"])
        self.rank = int(body["rank"])
        self.addrs = [str(a) for a in body["addrs"]]
        self.world = len(self.addrs)
        # The world whose global batch each step keeps after a preemption shrank the ring:
        # each rank accumulates ceil(batch_workers / world) micro-batches per step.
        batch_workers = body.get("batch_workers")
        self.batch_workers = None if batch_workers is None else int(batch_workers)
        self.accumulation = 1 if self.batch_workers is None else \
            max(1, -(-self.batch_workers // max(self.world, 1)))

    def __repr__(self) -> str:
        return f"Generation({self.generation}, rank={self.rank}, world={self.world})"


class GenerationFeed:
    """The node's lines on `stream` (stdin), read by a daemon thread. A newer generation
    supersedes older ones not yet taken; a stop line or the end of input is final."""

    def __init__(self, stream: Iterable[str] | None = None,
                 on_arrival: Callable[[], None] | None = None) -> None:
        self._stream = sys.stdin if stream is None else stream
        self._cond = threading.Condition()
        self._newest: Generation | None = None
        self._stopped = False
        self.on_arrival = on_arrival
        self._thread = threading.Thread(target=self._read, name="ringleader-generations",
                                         daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self._stream:
                line = raw.strip()
                if len(line) > NODE_LINE_BYTES_MAX:
                    print(f"ringleader: a node line of {len(line)} bytes ignored "
                          f"(at most {NODE_LINE_BYTES_MAX})", file=sys.stderr, flush=True)
                    continue
                if line == STOP_LINE:
                    break
                if not line.startswith(GENERATION_PREFIX):
                    print(f"ringleader: node line ignored: {line[:200]!r}", file=sys.stderr,
                          flush=True)
                    continue
                try:
                    g = Generation(line)
                except (ValueError, KeyError, TypeError) as e:
                    print(f"ringleader: generation line refused: {e}", file=sys.stderr,
                          flush=True)
                    continue
                with self._cond:
                    if self._newest is None or g.generation > self._newest.generation:
                        self._newest = g
                    self._cond.notify_all()
                self._arrived()
        except (OSError, ValueError) as e:
            print(f"ringleader: reading stdin failed ({e}): taken as a stop", file=sys.stderr,
                  flush=True)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._arrived()

    def _arrived(self) -> None:
        if self.on_arrival is not None:
            self.on_arrival()

    @property
    def stopped(self) -> bool:
        """Whether the node said stop (or stdin ended)."""
        with self._cond:
            return self._stopped

    def pending(self, after: int) -> Generation | None:
        """Without waiting: the newest generation newer than `after`, else None. A stop
        does not show here: see `stopped`."""
        with self._cond:
            g = self._newest
            return g if g is not None and g.generation > after else None

    def next(self, after: int, timeout: float | None = None) -> Generation | None:
        """Waits for a generation newer than `after`; None once stopped (or at `timeout`,
        seconds). A generation already waiting wins over a stop that came after it only
        while no stop has come: a stop is final."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._stopped:
                    return None
                g = self._newest
                if g is not None and g.generation > after:
                    return g
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)


class ComputeClock:
    """Compute sections of the training thread (`enter`, `leave`) and the heartbeat thread
    that prints `ringleader-heartbeat computing_ms=X` every `HEARTBEAT_EVERY_S` while one
    lasts. Time inside a collective is not compute: the caller leaves the section for it."""

    def __init__(self, file: IO[str] | None = None) -> None:
        self._file = file
        self._lock = threading.Lock()
        self._since: float | None = None
        self._thread = threading.Thread(target=self._beat, name="ringleader-heartbeat",
                                         daemon=True)
        self._thread.start()

    def beat_now(self, computing_ms: int = 0) -> None:
        """Prints one heartbeat at once (`rlt.init()` does, so the node hears the rank
        speaks the protocol)."""
        _emit(_native.heartbeat_line(int(computing_ms)), self._file)

    def enter(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()

    def leave(self) -> None:
        with self._lock:
            self._since = None

    def restart(self) -> None:
        """Ends the current section, if any, and starts a new one now."""
        with self._lock:
            self._since = time.monotonic()

    def computing_ms(self) -> int | None:
        """Milliseconds inside the current section, or None outside one."""
        with self._lock:
            since = self._since
        return None if since is None else int((time.monotonic() - since) * 1000)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_EVERY_S)
            ms = self.computing_ms()
            if ms is not None:
                self.beat_now(ms)


class StepStats:
    """Compute and wait time per step, printed as `ringleader-rank-stats` (means since the
    last line) at the first step, then about every `RANK_STATS_EVERY_S`."""

    def __init__(self, file: IO[str] | None = None) -> None:
        self._file = file
        self._steps = 0
        self._compute_s = 0.0
        self._wait_s = 0.0
        self._last: float | None = None

    def add(self, compute_s: float, wait_s: float, generation: int, rank: int,
            step: int) -> None:
        """Counts one step; prints the line when it is due."""
        self._steps += 1
        self._compute_s += max(compute_s, 0.0)
        self._wait_s += max(wait_s, 0.0)
        now = time.monotonic()
        if self._last is not None and now - self._last < RANK_STATS_EVERY_S:
            return
        n = self._steps
        _emit(_native.rank_stats_line(int(generation), int(rank), int(step),
                                      self._compute_s * 1000 / n, self._wait_s * 1000 / n),
              self._file)
        self._last = now
        self._steps, self._compute_s, self._wait_s = 0, 0.0, 0.0


class LineStdout:
    """A stdout whose lines are whole: each thread's writes are kept until their newline
    (or a flush), then written under one lock, so the heartbeat thread's protocol lines never
    land inside a line the training thread is printing (`print` writes its text and its
    newline separately). `install_line_stdout` puts one in place of `sys.stdout`."""

    def __init__(self, raw: IO[str]) -> None:
        self._raw = raw
        self._lock = threading.Lock()
        self._local = threading.local()

    def write(self, text: str) -> int:
        pending: str = getattr(self._local, "pending", "") + text
        cut = pending.rfind("\n") + 1
        self._local.pending = pending[cut:]
        if cut:
            with self._lock:
                self._raw.write(pending[:cut])
        return len(text)

    def flush(self) -> None:
        pending: str = getattr(self._local, "pending", "")
        self._local.pending = ""
        with self._lock:
            if pending:
                self._raw.write(pending)
            self._raw.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def install_line_stdout() -> None:
    """Replaces `sys.stdout` by a `LineStdout` over it (once)."""
    if not isinstance(sys.stdout, LineStdout):
        sys.stdout = LineStdout(sys.stdout)


def failed(generation: int, lost_rank: int | None, error: object,
           file: IO[str] | None = None) -> None:
    """Prints `ringleader-elastic failed generation=G lost_rank=R error="…"` (R None: `-`)."""
    _emit(_native.elastic_failed_line(int(generation), lost_rank, str(error)), file)


def resumed(generation: int, world: int, rank: int, step: int, restored_step: int,
            steps_lost: int, source: str, file: IO[str] | None = None) -> None:
    """Prints `ringleader-elastic resumed generation=G world=N rank=R step=S restored_step=C
    steps_lost=L source=…`."""
    _emit(_native.elastic_resumed_line(int(generation), int(world), int(rank), int(step),
                                       int(restored_step), int(steps_lost), source), file)
