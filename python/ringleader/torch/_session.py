"""The process's elastic session: `rlt.init()`, the generation it is in, its ring and
process group, and the failures the collectives report.

Under `[elastic] protocol = "ringleader"` (`RINGLEADER_ELASTIC_PROTOCOL=ringleader`) the
generations come from the node on stdin (`ringleader.elastic.GenerationFeed`); the session
prints a heartbeat at once, joins the first generation's ring and makes it torch's default
process group (`init_from_ring`); later generations are joined by the `ElasticOptimizer`'s
re-form (`_optimizer`). A standby joiner (`RINGLEADER_STANDBY=1`: started ahead of the
re-form that takes it in) joins no ring in `init()`: the optimizer says `ringleader-ready`
once the script built its model, and joins the generation that follows. Elsewhere (torchrun, a command rank of another job, one process)
`init()` is plain `dist.init_process_group` from the environment, and nothing is elastic.

On a host with a GPU each generation's group also carries CUDA tensors, through torch's
own NCCL group of exactly that generation's ranks (`device_backends`,
`RINGLEADER_CUDA_BACKEND`), rebuilt at every re-form as the ring is.

A collective error is never raised into the training loop while elastic: DDP's comm hook
and the model's forward note it here (`note_failure`), the step finishes locally, and the
optimizer's `step()` re-forms instead of stepping. When a newer generation (or a stop)
arrives while a step runs, the step gets `ABORT_GRACE_S` to end by itself; then the ring is
aborted, so a step blocked on a silent peer (a dead host, a stopped process) fails at once
rather than at the collective's deadline.
"""

import atexit
import os
import sys
import threading
import time
import zlib
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from .. import _native, elastic
from . import _backend

# How long a step may go on once a newer generation or a stop arrived before its ring is
# aborted, seconds (the Rust trainer's ABORT_GRACE_MS).
ABORT_GRACE_S = 1.0
# Deadline for a generation's ranks to connect, ms.
CONNECT_TIMEOUT_MS = 10_000
# How long the ranks of a generation keep trying to connect to each other, seconds (each
# try lasts CONNECT_TIMEOUT_MS), while no newer generation arrives.
JOIN_WAIT_S = 120
# Pause between two tries, seconds.
CONNECT_RETRY_S = 0.2
# Deadline of each collective operation, ms: a peer that died is seen sooner by its closed
# connection or the ring's silence bound; this catches the rest.
OP_TIMEOUT_MS = 60_000
# Names the backend of CUDA tensors (see `device_backends`).
CUDA_BACKEND_ENV = "RINGLEADER_CUDA_BACKEND"
# The process group's timeout (torch's own bookkeeping; the ring's deadlines above rule).
GROUP_TIMEOUT = timedelta(minutes=30)


def device_backends() -> str | None:
    """The process group's backend for CUDA tensors, `"cuda:<name>"`, inside each
    generation's membership (`_backend.init_from_ring`), when this process sees a GPU:
    `RINGLEADER_CUDA_BACKEND` (`nccl` by default; `none`: CUDA tensors are refused, as
    without a GPU)."""
    name = os.environ.get(CUDA_BACKEND_ENV, "nccl")
    if name == "none" or not torch.cuda.is_available():
        return None
    return f"cuda:{name}"


class _OpClock:
    """Times the operations the backend runs (`_backend.op_observer`): their total is the
    step's wait for the collective, and the heartbeat's compute section pauses meanwhile."""

    def __init__(self, clock: elastic.ComputeClock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._depth = 0
        self._since = 0.0
        self.total_s = 0.0

    def begin(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._since = time.monotonic()
                self._clock.leave()
            self._depth += 1

    def end(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self.total_s += time.monotonic() - self._since
                self._clock.enter()

    def take(self) -> float:
        """The wait since the last `take`, seconds."""
        with self._lock:
            t, self.total_s = self.total_s, 0.0
            return t


class Session:
    """See the module doc. One per process (`session()`)."""

    # The elastic parts, set by `init()` in an elastic rank (only such a rank uses them).
    feed: elastic.GenerationFeed
    clock: elastic.ComputeClock
    op_clock: _OpClock
    stats: elastic.StepStats

    def __init__(self) -> None:
        self.elastic = False
        self.standby = False
        self.initialized = False
        self.generation = 0
        self.rank = 0
        self.world = 1
        self.ring: _native.Ring | None = None
        # The generation this process last restored or started in (None: never, a joiner).
        self.last_generation: int | None = None
        # The first collective error of the current step, noted by the hooks.
        self.failure: BaseException | None = None
        # Counts steps ended, so the abort watcher knows whether a step moved on.
        self.step_seq = 0
        self.in_step = False
        self.group_id = zlib.crc32(os.environ.get(_native.JOB_ID_ENV, "").encode())
        self._abort_timer: threading.Timer | None = None

    # -- set-up --------------------------------------------------------------------------

    def init(self, backend: str = "ringleader") -> None:
        if self.initialized:
            return
        self.initialized = True
        if not elastic.is_elastic_rank():
            if dist.is_initialized():
                pass
            elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                dist.init_process_group(backend)
            else:
                dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            return
        self.elastic = True
        elastic.install_line_stdout()
        self.clock = elastic.ComputeClock()
        self.clock.beat_now(0)
        self.stats = elastic.StepStats()
        self.op_clock = _OpClock(self.clock)
        _backend.op_observer = self.op_clock
        self.feed = elastic.GenerationFeed(on_arrival=self._on_arrival)
        # At the script's end, close the ring before the interpreter's teardown does it.
        atexit.register(self.leave_group)
        # A standby joiner gets its first generation only after it said it is ready, which
        # the optimizer does once the script built its model (`_optimizer`).
        self.standby = elastic.is_standby()
        if not self.standby:
            self.join_next()

    def join_next(self) -> elastic.Generation:
        """Waits for the next generation and connects its ring as torch's default group,
        retrying with later ones while connecting fails; exits 0 when the node says stop."""
        while True:
            g = self.feed.next(self.generation)
            if g is None:
                self.exit_stopped()
            self.generation = g.generation
            ring = self._connect(g)
            if ring is None:
                continue
            self.ring, self.rank, self.world = ring, g.rank, g.world
            self.failure = None
            devices = device_backends()
            master = g.addrs[0].rsplit(":", 1)[0].strip("[]")
            _backend.init_from_ring(ring, timeout=GROUP_TIMEOUT, device_backends=devices,
                                    master=master)
            return g

    def _connect(self, g: elastic.Generation) -> _native.Ring | None:
        """The ring of generation `g`, or None when it failed (reported). Connecting is
        tried again while no newer generation or stop arrives, up to `JOIN_WAIT_S`: a
        joiner's process may take that long to start (importing torch on a busy host)."""
        deadline = time.monotonic() + JOIN_WAIT_S
        while True:
            try:
                return _native.Ring.from_generation_line(
                    g.line, self.group_id, op_timeout_ms=OP_TIMEOUT_MS,
                    connect_timeout_ms=CONNECT_TIMEOUT_MS)
            except _native.RingError as e:
                if (e.reason in ("connect", "handshake") and time.monotonic() < deadline
                        and not self.superseded()):
                    time.sleep(CONNECT_RETRY_S)
                    continue
                self.report_failure(e)
                return None

    def leave_group(self) -> None:
        """Drops the current process group and closes its ring (after a failure the ring
        tells its peers first)."""
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as e:  # noqa: BLE001 - a spent group may refuse; the ring goes anyway
                print(f"ringleader: destroying the process group: {e}", file=sys.stderr,
                      flush=True)
        if self.ring is not None:
            try:
                self.ring.close()
            except _native.RingError:
                pass
            self.ring = None

    def exit_stopped(self) -> NoReturn:
        """The node said stop (or stdin ended): exit 0 at once. `os._exit`: the interpreter's
        teardown with the ring's threads and torch's process group alive took seconds and
        could block in a finalizer; the node's SIGKILL follows its stop after 5 s."""
        self.leave_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    # -- failures ------------------------------------------------------------------------

    def note_failure(self, e: BaseException) -> None:
        """A collective of the current step failed with `e` (the hooks call this)."""
        if self.failure is None:
            self.failure = e

    def superseded(self) -> bool:
        """Whether the node has moved on: a newer generation or a stop waits."""
        return self.feed.stopped or self.feed.pending(self.generation) is not None

    def report_failure(self, e: BaseException) -> None:
        """Prints `ringleader-elastic failed …` for `e`, unless the node had already moved on
        (then the step was aborted to leave, or failed as a peer left first: nobody was
        lost)."""
        if self.superseded():
            return
        lost = getattr(e, "rank", None) if isinstance(e, _native.PeerLost) else None
        elastic.failed(self.generation, lost, e)

    # -- the step watcher ----------------------------------------------------------------

    def step_started(self) -> None:
        self.in_step = True

    def step_ended(self) -> None:
        self.in_step = False
        self.step_seq += 1

    def _on_arrival(self) -> None:
        """The feed thread saw a newer generation or a stop: give the running step
        `ABORT_GRACE_S`, then abort its ring."""
        seq, ring = self.step_seq, self.ring
        if ring is None or not self.in_step:
            return
        if self._abort_timer is not None and self._abort_timer.is_alive():
            return

        def fire() -> None:
            if self.in_step and self.step_seq == seq and self.ring is ring:
                print(f"ringleader: a newer generation or a stop arrived and the step has not "
                      f"ended within {ABORT_GRACE_S} s: aborting it", file=sys.stderr,
                      flush=True)
                ring.abort()

        self._abort_timer = threading.Timer(ABORT_GRACE_S, fire)
        self._abort_timer.daemon = True
        self._abort_timer.start()


_SESSION = Session()


def session() -> Session:
    """The process's session."""
    return _SESSION


def init(backend: str = "ringleader") -> None:
    """Joins the job's ring (see the module doc); idempotent. `backend` is the one used
    outside an elastic ringleader rank (torchrun, one process)."""
    _SESSION.init(backend)


def rank() -> int:
    """This process's rank in the current generation."""
    return _SESSION.rank


def world_size() -> int:
    """The current generation's number of ranks."""
    return _SESSION.world


def generation() -> int:
    """The current generation (0 outside an elastic ringleader rank)."""
    return _SESSION.generation
