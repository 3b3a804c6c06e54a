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
own NCCL group of exactly that generation's ranks (the device group, `_device`), rebuilt at
every re-form as the ring is, when every rank of the generation may build it (the minimum
over the ring, before any store is built). NCCL never raises on a lost peer, so under a
device group the session acts for it: a step's device work is fenced before it commits
(`wait_device_work`), and a newer generation, a failed ring or the fence's deadline abort
the device group as well as the ring; the group is then dropped without waiting on it
(`leave_group`). At the script's normal end it is destroyed after a barrier over the ring
(`end_normally`). `rlt.init()` sets `TORCH_NCCL_ASYNC_ERROR_HANDLING=2` so torch's watchdog
does not end the process first. A rank whose generation fails while it joins (the ring,
the agreement, the device group's store) reports it and waits for the next generation.

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

import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from .. import _native, elastic
from . import _backend, _device

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
# The process group's timeout (torch's own bookkeeping; the ring's deadlines above rule).
GROUP_TIMEOUT = timedelta(minutes=30)
# Deadline of a step's device work, once its fence is enqueued, ms (the ring's op deadline).
DEVICE_WORK_TIMEOUT_MS = OP_TIMEOUT_MS
# How long a rank that reported a failure naming no lost rank (a deadline that passed on
# every rank alike, a device group cut under all of them) waits for the node's next
# generation, seconds: the node re-forms when another rank names the lost one, else nothing
# comes, and the rank exits 1 so the job's attempt ends and restarts (instead of every rank
# waiting forever).
UNNAMED_FAILURE_WAIT_S = 120.0
# Polling of a fence, seconds (first, most).
FENCE_POLL_S_MIN = 0.0005
FENCE_POLL_S_MAX = 0.01


class _OpClock:
    """Times the operations the backend runs (`_backend.op_observer`): their total is the
    step's wait for the collective, and the heartbeat's compute section pauses meanwhile."""

    def __init__(self, clock: elastic.ComputeClock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._depth = 0
        self._since = 0.0
        # Whether a compute section was open when the operation began (it goes on after).
        self._resume = False
        self.total_s = 0.0

    def begin(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._since = time.monotonic()
                self._resume = self._clock.computing_ms() is not None
                self._clock.leave()
            self._depth += 1

    def end(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self.total_s += time.monotonic() - self._since
                if self._resume:
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
        # Micro-batches per step in the current generation (see `elastic.Generation`).
        self.accumulation = 1
        self.ring: _native.Ring | None = None
        # The generation this process last restored or started in (None: never, a joiner).
        self.last_generation: int | None = None
        # The first collective error of the current step, noted by the hooks.
        self.failure: BaseException | None = None
        # A failure reported since the last generation joined that named no lost rank.
        self.unnamed_failure: BaseException | None = None
        # Whether `rlt.DistributedDataParallel`'s forward marks compute sections: each
        # forward starts one, which ends at `step()` (else a section runs from one step to
        # the next, the time between steps included).
        self.forward_marks = False
        # Counts steps ended, so the abort watcher knows whether a step moved on.
        self.step_seq = 0
        self.in_step = False
        self.group_id = zlib.crc32(os.environ.get(_native.JOB_ID_ENV, "").encode())
        self._abort_timer: threading.Timer | None = None
        # The device group this process would build (`RINGLEADER_CUDA_BACKEND`), the one the
        # current generation agreed on (None: the ring carries everything), whether it was
        # aborted, and whether everything issued on it is known complete (a fence passed).
        self.wanted_device: _device.DeviceGroup | None = None
        self.device_group: _device.DeviceGroup | None = None
        self.device_aborted = False
        self.device_settled = True

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
        self.wanted_device = _device.configured()
        _device.survive_communicator_errors()
        elastic.install_line_stdout()
        self.clock = elastic.ComputeClock()
        self.clock.beat_now(0)
        self.stats = elastic.StepStats()
        self.op_clock = _OpClock(self.clock)
        _backend.op_observer = self.op_clock
        self.feed = elastic.GenerationFeed(on_arrival=self._on_arrival)
        # At the script's end, close the ring before the interpreter's teardown does it.
        atexit.register(self.end_normally)
        # A standby joiner gets its first generation only after it said it is ready, which
        # the optimizer does once the script built its model (`_optimizer`).
        self.standby = elastic.is_standby()
        if not self.standby:
            self.join_next()

    def join_next(self) -> elastic.Generation:
        """Waits for the next generation and connects its ring as torch's default group
        (with the device group the generation agrees on), retrying with later ones while
        joining fails; exits 0 when the node says stop."""
        while True:
            wait = None if self.unnamed_failure is None else UNNAMED_FAILURE_WAIT_S
            g = self.feed.next(self.generation, wait)
            if g is None and self.feed.stopped:
                self.exit_stopped()
            if g is None:
                self.exit_unrecovered(wait)
            self.unnamed_failure = None
            self.generation = g.generation
            ring = self._connect(g)
            if ring is None:
                continue
            self.ring, self.rank, self.world = ring, g.rank, g.world
            self.accumulation = g.accumulation
            self.failure = None
            try:
                self._build_group(ring, g)
            except RuntimeError as e:  # RingError, torch's DistError: this generation is spent
                self.report_failure(e)
                self.device_aborted = True
                self.leave_group()
                continue
            return g

    def _build_group(self, ring: _native.Ring, g: elastic.Generation) -> None:
        """Agrees on the device group over `ring` (before any store), then makes the
        generation's process group."""
        self.device_group = None
        self.device_group = _device.agree(ring, self.wanted_device)
        self.device_aborted = False
        self.device_settled = self.device_group is None
        devices = self.device_group.spec() if self.device_group is not None else None
        master = g.addrs[0].rsplit(":", 1)[0].strip("[]")
        _backend.init_from_ring(ring, timeout=GROUP_TIMEOUT, device_backends=devices,
                                master=master)

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
        tells its peers first). A device group whose work is not known complete is aborted,
        never waited on: its destroy would wait for a dead peer."""
        if dist.is_initialized():
            try:
                if self.device_group is not None:
                    _device.drop(aborted=self.device_aborted or not self.device_settled)
                else:
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

    def end_normally(self) -> None:
        """The script's end: a device group whose work is settled ends with a barrier over
        the ring, then `destroy_process_group` (`_device.end`); otherwise as `leave_group`."""
        if (dist.is_initialized() and self.device_group is not None and self.ring is not None
                and self.device_settled and not self.device_aborted):
            try:
                _device.end(self.ring.barrier)
            except Exception as e:  # noqa: BLE001 - the ring closes anyway
                print(f"ringleader: ending the process group: {e}", file=sys.stderr,
                      flush=True)
        self.leave_group()

    def exit_stopped(self) -> NoReturn:
        """The node said stop (or stdin ended): exit 0 at once."""
        self._exit(0)

    def _exit(self, code: int) -> NoReturn:
        """Leaves the group and exits with `code` at once. `os._exit`: the interpreter's
        teardown with the ring's threads and torch's process group alive took seconds and
        could block in a finalizer; the node's SIGKILL follows its stop after 5 s."""
        self.leave_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def exit_unrecovered(self, waited: float | None) -> NoReturn:
        """The failure reported named no lost rank and no generation followed within
        `waited` s: exit 1 (as `exit_stopped`), so the node ends the attempt."""
        print(f"ringleader: generation {self.generation} failed ({self.unnamed_failure}) "
              f"and no newer generation came within {waited:.0f} s: exiting",
              file=sys.stderr, flush=True)
        self._exit(1)

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
        if lost is None:
            self.unnamed_failure = e

    # -- the device group ----------------------------------------------------------------

    def abort_device(self) -> None:
        """Aborts the device group (from any thread; once)."""
        dg = self.device_group
        if dg is None or self.device_aborted:
            return
        self.device_aborted = True
        try:
            _device.abort(dg)
        except Exception as e:  # noqa: BLE001 - the group is dropped as aborted anyway
            print(f"ringleader: aborting the device group: {e}", file=sys.stderr, flush=True)

    def wait_device_work(self) -> bool:
        """Whether everything issued on the device group so far completed on every rank:
        enqueues a `_device.Fence` and polls it until it completes, the device group is
        aborted, the ring fails or a collective error is noted, a newer generation or a stop
        has waited `ABORT_GRACE_S`, or `DEVICE_WORK_TIMEOUT_MS` passed. Short of completion
        the device group is aborted and the failure noted (a `RingError`). Without a device
        group: whether no failure was noted. The wait is the step's wait for its collectives,
        not compute (the heartbeat's section pauses, as around the ring's operations)."""
        dg = self.device_group
        if dg is None:
            return self.failure is None
        if self.failure is None and not self.device_aborted:
            self.op_clock.begin()
            try:
                fence = _device.Fence(dg, self.world)
                done = self._poll(fence)
            except RuntimeError as e:
                self.note_failure(_native.RingError(f"the device group failed: {e}"))
                done = False
            finally:
                self.op_clock.end()
            if done:
                self.device_settled = True
                return True
        self.abort_device()
        self.note_failure(_native.Aborted("the device group was aborted: a peer was lost"))
        return False

    def _poll(self, fence: _device.Fence) -> bool:
        """Polls `fence` (see `wait_device_work`); True once it completed."""
        deadline = time.monotonic() + DEVICE_WORK_TIMEOUT_MS / 1000
        superseded_at: float | None = None
        pause = FENCE_POLL_S_MIN
        while not fence.done():
            ring = self.ring
            if self.device_aborted or self.failure is not None or (
                    ring is not None and ring.failed):
                return False
            now = time.monotonic()
            if self.superseded():
                superseded_at = superseded_at if superseded_at is not None else now
                if now - superseded_at >= ABORT_GRACE_S:
                    return False
            if now >= deadline:
                self.note_failure(_native.RingTimeout(
                    f"the step's device work did not complete within "
                    f"{DEVICE_WORK_TIMEOUT_MS} ms"))
                return False
            time.sleep(pause)
            pause = min(pause * 2, FENCE_POLL_S_MAX)
        # Ended but cut (the group aborted under the step, by torch's watchdog or this
        # session): the step's reductions may be partial, so it is never committed.
        return fence.complete() and not self.device_aborted

    # -- the step watcher ----------------------------------------------------------------

    def step_started(self) -> None:
        self.in_step = True

    def between_steps(self) -> None:
        """After a step or a re-form: the heartbeat's compute section until the next step,
        unless forwards mark the sections (then none: data loading, evaluation between its
        forwards and a checkpoint's save are no step's compute)."""
        if self.forward_marks:
            self.clock.leave()
        else:
            self.clock.enter()

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
                self.abort_device()

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
