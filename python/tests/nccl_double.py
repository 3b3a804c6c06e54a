"""A test double of torch's NCCL process group, on the CPU: the `torch.distributed` backend
`"fakenccl"` (registered on import, for CPU tensors), which fails the way NCCL does rather
than the way a CPU ring does.

- A work completes on enqueue: `wait()` returns at once and `get_future()` is already done
  (NCCL's wait only orders the caller's CUDA stream after the collective; its future is done
  for the host), so the host never sees a failure through them. `is_completed()` is the only
  honest answer: whether the exchange itself has finished (NCCL's end event).
- The exchange runs later, in issue order, on the group's one background thread (the
  "stream"), through the store: each rank writes its tensor under the operation's key and
  polls for everyone's. A peer gone (dead, stopped, never issuing the collective) leaves
  the exchange blocked, never raising: an error of the store itself (its server died with
  rank 0) blocks too, as NCCL spins on a dead connection.
- `abort()`, from any thread, unblocks the exchange and marks the group aborted; queued
  operations are dropped (their tensors keep what they held).
- `shutdown()` (torch's destroy) waits for the operations in flight unless the group was
  aborted: destroying an NCCL group whose peer is gone hangs.

Collectives: allreduce (SUM, AVG, MIN, MAX, PRODUCT) also coalesced, broadcast, allgather
(also into one tensor), barrier: what DDP and the elastic session use. `instances` lists
every group made, for tests to look at.
"""

import ctypes
import itertools
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import PrefixStore, Store
from torch.futures import Future

BACKEND = "fakenccl"
# Store prefix of the double's keys (torch's own prefix per group comes first).
KEY_PREFIX = "fakenccl"
# Polling of the store while an exchange waits for its peers, seconds (first, most).
POLL_S_MIN = 0.001
POLL_S_MAX = 0.02

_REDUCE: dict[Any, Callable[[torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.SUM: lambda s: s.sum(0),
    dist.ReduceOp.AVG: lambda s: s.sum(0) / s.shape[0],
    dist.ReduceOp.MIN: lambda s: s.min(0).values,
    dist.ReduceOp.MAX: lambda s: s.max(0).values,
    dist.ReduceOp.PRODUCT: lambda s: s.prod(0),
}

# Every group made, oldest first.
instances: list["FakeNcclBackend"] = []


class Aborted(Exception):
    """The exchange was cut by `abort()`."""


def _bytes(t: torch.Tensor) -> bytes:
    c = t.detach().contiguous()
    n = c.numel() * c.element_size()
    return ctypes.string_at(c.data_ptr(), n) if n else b""


def _tensor(data: bytes, like: torch.Tensor) -> torch.Tensor:
    if not data:
        return torch.empty_like(like)
    return torch.frombuffer(bytearray(data), dtype=like.dtype).view(like.shape)


class _Work(dist.Work):
    """Done for the host at once; `is_completed()` says whether the exchange ran."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._future: Future[Any] = Future()
        self._future.set_result(result)
        self.exchanged = threading.Event()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        return True

    def get_future(self) -> Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        return self.exchanged.is_set()


class FakeNcclBackend(_C10dBackend):
    """One group of the double (see the module doc)."""

    def __init__(self, store: Store, rank: int, world: int) -> None:
        super().__init__(rank, world)
        self._store = PrefixStore(KEY_PREFIX, store)
        self._rank, self._world = rank, world
        self._seq = itertools.count()
        self._queue: queue.SimpleQueue[tuple[int, Callable[[int], None], _Work] | None] = \
            queue.SimpleQueue()
        self._aborted = threading.Event()
        self._peers_gone = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0
        self.completed = 0
        self.shut_down = False
        # The store's error that blocked an exchange (a gone peer's), if any.
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"fakenccl-{rank}",
                                        daemon=True)
        self._thread.start()
        instances.append(self)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # -- what tests look at ------------------------------------------------------------

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def lose_peers(self, watchdog_s: float | None = None) -> None:
        """From now on every exchange finds its peers gone (blocks until `abort()`). With
        `watchdog_s`, the group aborts itself that long after, as torch's watchdog aborts an
        NCCL communicator whose peer failed (`TORCH_NCCL_ASYNC_ERROR_HANDLING=2`): the cut
        works end (`is_completed()`, as their CUDA events) with their outputs partial."""
        self._peers_gone.set()
        if watchdog_s is not None:
            threading.Timer(watchdog_s, self.abort).start()

    def in_flight(self) -> int:
        """Operations enqueued whose exchange has not finished (nor been aborted)."""
        with self._lock:
            return self._in_flight

    # -- the stream --------------------------------------------------------------------

    def _enqueue(self, run: Callable[[int], None], result: Any) -> _Work:
        work = _Work(result)
        with self._lock:
            self._in_flight += 1
        self._queue.put((next(self._seq), run, work))
        return work

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            seq, run, work = item
            try:
                if not self._aborted.is_set():
                    run(seq)
                    self.completed += 1
            except Aborted:
                pass
            finally:
                with self._lock:
                    self._in_flight -= 1
                work.exchanged.set()

    def _exchange(self, seq: int, data: bytes) -> list[bytes]:
        """Every rank's `data` for operation `seq`: blocks while a peer is missing (or the
        store is gone), until `abort()`."""
        keys = [f"{seq}/{r}" for r in range(self._world)]
        if self._peers_gone.is_set():
            self._aborted.wait()
            raise Aborted()
        try:
            self._store.set(keys[self._rank], data)
            pause = POLL_S_MIN
            while not self._store.check(keys):
                if self._aborted.wait(pause):
                    raise Aborted()
                pause = min(pause * 2, POLL_S_MAX)
            got = [bytes(self._store.get(k)) for k in keys]
            if self._store.add(f"{seq}/read", 1) == self._world:
                for k in keys + [f"{seq}/read"]:
                    self._store.delete_key(k)
            return got
        except Aborted:
            raise
        except Exception as e:  # noqa: BLE001 - NCCL does not raise on a dead peer: it hangs
            self.error = e
            self._aborted.wait()
            raise Aborted() from None

    # -- collectives -------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor],
                  opts: dist.AllreduceOptions | None = None) -> _Work:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        reduce = _REDUCE[getattr(op, "op", op)]

        def run(seq: int) -> None:
            for t in tensors:
                got = self._exchange(seq, _bytes(t))
                stacked = torch.stack([_tensor(b, t) for b in got])
                t.copy_(reduce(stacked).to(t.dtype))

        return self._enqueue(run, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor],
                            opts: dist.AllreduceCoalescedOptions | None = None) -> _Work:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> _Work:
        root = opts.rootRank

        def run(seq: int) -> None:
            for t in tensors:
                got = self._exchange(seq, _bytes(t) if self._rank == root else b"")
                if self._rank != root:
                    t.copy_(_tensor(got[root], t))

        return self._enqueue(run, tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]],
                  input_tensors: list[torch.Tensor],
                  opts: Any = None) -> _Work:
        def run(seq: int) -> None:
            for outs, inp in zip(output_tensors, input_tensors):
                got = self._exchange(seq, _bytes(inp))
                for out, b in zip(outs, got):
                    out.copy_(_tensor(b, inp))

        return self._enqueue(run, output_tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> _Work:
        def run(seq: int) -> None:
            got = self._exchange(seq, _bytes(input))
            output.copy_(torch.cat([_tensor(b, input).reshape(-1) for b in got])
                         .view_as(output))

        return self._enqueue(run, [output])

    _allgather_base = all_gather_single

    def barrier(self, opts: dist.BarrierOptions | None = None) -> _Work:
        def run(seq: int) -> None:
            self._exchange(seq, b"")

        return self._enqueue(run, [])

    # -- life cycle --------------------------------------------------------------------

    def abort(self) -> None:
        """From any thread: cuts the exchange in flight, drops the queued ones."""
        self._aborted.set()

    def shutdown(self) -> None:
        """Torch's destroy: waits for the operations in flight, unless aborted."""
        self.shut_down = True
        self._queue.put(None)
        if not self._aborted.is_set() and threading.current_thread() is not self._thread:
            self._thread.join()


def _create(store: Store, rank: int, world_size: int,
            timeout: timedelta | None) -> FakeNcclBackend:
    return FakeNcclBackend(store, rank, world_size)


def register() -> None:
    """Registers the double with torch (once)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()


def wait_for(cond: Callable[[], bool], seconds: float, what: str) -> None:
    """Polls `cond` until it holds; fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.005)
