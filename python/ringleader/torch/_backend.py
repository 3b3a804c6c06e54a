"""The backend: a `torch.distributed` Backend written in Python over `ringleader._native.Ring`.

Every collective is checked on the calling thread (device, dtype, sizes, op: a mistake
raises at once, on every rank alike) and then queued to the group's one operation thread,
which runs it on the ring with the GIL released and completes its future; so the order of
operations is the order they were issued, the same on every rank, and DDP's bucket
allreduces overlap the backward pass as Gloo's do.
"""

import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, HashStore, Store, TCPStore
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch.futures import Future

from .. import _native
from . import _rendezvous

Tensors = list[torch.Tensor]

BACKEND = "ringleader"

# torch dtypes the ring reduces, by the names `Ring` takes.
REDUCIBLE = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
}
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
}



class OpObserver(Protocol):
    """Told around each operation a group's thread runs."""

    def begin(self) -> None: ...

    def end(self) -> None: ...


# When set, told around each operation a group's thread runs (`begin()`, `end()`): the
# elastic session (`_session`) counts that time as waiting for the collective, not compute.
op_observer: OpObserver | None = None

# The ring `init_from_ring` hands to the backend's creator (torch calls it from inside
# init_process_group, on the same thread).
_given_ring = threading.local()


class _Work(dist.Work):
    """An operation queued on the group's thread: `wait()` returns True once it is done, or
    raises its error; `get_future()` holds its output tensors."""

    def __init__(self, future: Future[Any]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Waits for the operation (with a `timeout`, timedelta or seconds, at most that
        long: past it raises `RuntimeError`, as torch's own `Work.wait` does, and the
        operation goes on: a later wait has it); raises the operation's error."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if seconds and not self._future.done():
            done = threading.Event()
            self._future.add_done_callback(lambda _: done.set())
            if not done.wait(seconds):
                raise RuntimeError(
                    f"ringleader: operation timed out after {seconds:g} s (it goes on: wait "
                    "again, or destroy the process group)")
        self._future.wait()
        return True

    def get_future(self) -> Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()


class _Runner:
    """The group's operation thread: runs queued operations in order, completing each
    future with its result or its exception (a failed ring fails every later one at once)."""

    def __init__(self, rank: int) -> None:
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], None], object, Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._loop, name=f"ringleader-torch-{rank}", daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[], None], result: object) -> _Work:
        future: Future[Any] = Future()
        self._queue.put((run, result, future))
        return _Work(future)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            if threading.current_thread() is not self._thread:
                self._thread.join()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, result, future = item
            observer = op_observer
            if observer is not None:
                observer.begin()
            try:
                run()
            except BaseException as e:  # noqa: BLE001 - every error goes to the caller
                future.set_exception(e)
                continue
            finally:
                if observer is not None:
                    observer.end()
            future.set_result(result)


def _check_cpu(t: torch.Tensor) -> None:
    if t.device.type != "cpu":
        raise RuntimeError(
            f"the ringleader backend carries CPU tensors, not {t.device} ones: "
            "init_process_group('cpu:ringleader,cuda:nccl') sends CUDA tensors through NCCL")
    if t.layout != torch.strided:
        raise RuntimeError(f"the ringleader backend carries dense tensors, not {t.layout}")


def _reduce_args(t: torch.Tensor, reduce_op: Any) -> tuple[str, str]:
    """The (dtype name, op name) of a reduction of `t`, or the error every rank raises."""
    _check_cpu(t)
    kind = getattr(reduce_op, "op", reduce_op)
    op = _OPS.get(kind)
    if op is None:
        raise ValueError(f"the ringleader backend reduces with SUM, AVG, MIN or MAX, not {kind}")
    name = REDUCIBLE.get(t.dtype)
    if name is None:
        raise ValueError(
            f"the ringleader backend reduces {', '.join(REDUCIBLE.values())} tensors, not "
            f"{t.dtype} ones")
    if op == "avg" and t.dtype not in FLOATS:
        raise ValueError(f"AVG of {t.dtype} tensors has no exact value: use SUM and divide")
    return name, op


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _InPlace:
    """A contiguous tensor to run on in place: `t` itself, or a copy written back by
    `done()`."""

    def __init__(self, t: torch.Tensor) -> None:
        self.target = t
        self.buf = t if t.is_contiguous() else t.contiguous()

    def done(self) -> None:
        if self.buf is not self.target:
            self.target.copy_(self.buf)


class RingleaderBackend(_C10dBackend):
    """The `"ringleader"` backend of one process group: a `Ring` and its operation thread."""

    def __init__(self, ring: _native.Ring, timeout: timedelta | None = None) -> None:
        super().__init__(ring.rank, ring.world)
        self._ring = ring
        self._rank = ring.rank
        self._world = ring.world
        self._timeout = timeout
        self._runner = _Runner(ring.rank)

    @property
    def ring(self) -> _native.Ring:
        """The `ringleader._native.Ring` carrying this group."""
        return self._ring

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # -- collectives -------------------------------------------------------------------

    def allreduce(self, tensors: Tensors,
                  opts: dist.AllreduceOptions | None = None) -> _Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        args = [_reduce_args(t, reduce_op) for t in tensors]
        ring = self._ring

        def run() -> None:
            for t, (dtype, op) in zip(tensors, args):
                b = _InPlace(t)
                ring.allreduce(b.buf.data_ptr(), _nbytes(b.buf), dtype, op)
                b.done()

        return self._runner.submit(run, tensors)

    def allreduce_coalesced(self, tensors: Tensors,
                            opts: dist.AllreduceCoalescedOptions | None = None) -> _Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        args = [_reduce_args(t, reduce_op) for t in tensors]
        ring = self._ring

        def run() -> None:
            # One operation per dtype, over the tensors flattened together.
            for dtype in dict.fromkeys(a[0] for a in args):
                group = [t for t, a in zip(tensors, args) if a[0] == dtype]
                flat = torch.cat([t.reshape(-1) for t in group])
                ring.allreduce(flat.data_ptr(), _nbytes(flat), dtype, args[0][1])
                offset = 0
                for t in group:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

        return self._runner.submit(run, tensors)

    def broadcast(self, tensors: Tensors, opts: dist.BroadcastOptions) -> _Work:
        root = opts.rootRank
        if not 0 <= root < self._world:
            raise ValueError(f"root {root} of world {self._world}")
        for t in tensors:
            _check_cpu(t)
        ring = self._ring

        def run() -> None:
            for t in tensors:
                b = _InPlace(t)
                ring.broadcast(b.buf.data_ptr(), _nbytes(b.buf), root)
                b.done()

        return self._runner.submit(run, tensors)

    def allgather(self, output_tensors: list[Tensors], input_tensors: Tensors,
                  opts: AllgatherOptions | None = None) -> _Work:
        for outs, inp in zip(output_tensors, input_tensors):
            self._check_gather(outs, inp)
        ring, rank = self._ring, self._rank

        def run() -> None:
            for outs, inp in zip(output_tensors, input_tensors):
                flat = torch.empty((self._world,) + tuple(inp.shape), dtype=inp.dtype)
                flat[rank].copy_(inp)
                ring.allgather(flat.data_ptr(), _nbytes(flat))
                for r, out in enumerate(outs):
                    out.copy_(flat[r])

        return self._runner.submit(run, output_tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: AllgatherOptions | None = None) -> _Work:
        _check_cpu(output)
        _check_cpu(input)
        if output.dtype != input.dtype or output.numel() != self._world * input.numel():
            raise ValueError(
                f"allgather into one tensor: output of {output.numel()} {output.dtype} "
                f"elements for world {self._world} × {input.numel()} {input.dtype} ones")
        ring, rank, n = self._ring, self._rank, input.numel()

        def run() -> None:
            b = _InPlace(output)
            flat = b.buf.view(-1)
            flat[rank * n:(rank + 1) * n].copy_(input.reshape(-1))
            ring.allgather(flat.data_ptr(), _nbytes(flat))
            b.done()

        return self._runner.submit(run, [output])

    # The older name some torch code paths still call.
    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors: Tensors, input_tensors: list[Tensors],
                       opts: dist.ReduceScatterOptions | None = None) -> _Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        args: list[tuple[str, str]] = []
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._world or any(
                    x.numel() != out.numel() or x.dtype != out.dtype for x in ins):
                raise ValueError(
                    f"reduce_scatter: want {self._world} inputs of {out.numel()} {out.dtype} "
                    "elements each")
            args.append(_reduce_args(out, reduce_op))
        ring = self._ring

        def run() -> None:
            for out, ins, (dtype, op) in zip(output_tensors, input_tensors, args):
                flat = torch.cat([x.reshape(-1) for x in ins])
                self._reduce_scatter_flat(ring, flat, out, dtype, op)

        return self._runner.submit(run, output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: dist.ReduceScatterOptions | None = None) -> _Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        dtype, op = _reduce_args(output, reduce_op)
        _check_cpu(input)
        if input.dtype != output.dtype or input.numel() != self._world * output.numel():
            raise ValueError(
                f"reduce_scatter from one tensor: input of {input.numel()} {input.dtype} "
                f"elements for world {self._world} × {output.numel()} {output.dtype} ones")
        ring = self._ring

        def run() -> None:
            # A copy: the ring reduces in place and the input must stay as it was.
            flat = input.reshape(-1).clone()
            self._reduce_scatter_flat(ring, flat, output, dtype, op)

        return self._runner.submit(run, [output])

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter_flat(self, ring: _native.Ring, flat: torch.Tensor, out: torch.Tensor,
                             dtype: str, op: str) -> None:
        ring.reduce_scatter(flat.data_ptr(), _nbytes(flat), dtype, op)
        start, end = ring.segment(flat.numel(), self._rank)
        out.copy_(flat[start:end].view_as(out))

    def barrier(self, opts: dist.BarrierOptions | None = None) -> _Work:
        return self._runner.submit(self._ring.barrier, [])

    def _check_gather(self, outs: Tensors, inp: torch.Tensor) -> None:
        _check_cpu(inp)
        if len(outs) != self._world or any(
                o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
            raise ValueError(
                f"allgather: want {self._world} outputs of {inp.numel()} {inp.dtype} "
                "elements each (the ring gathers equal sizes)")
        for o in outs:
            _check_cpu(o)

    # -- life cycle --------------------------------------------------------------------

    def abort(self) -> None:
        """Aborts the ring (operations in flight raise `Aborted`, here and on the peers)."""
        self._ring.abort()
        self._runner.stop()

    def shutdown(self) -> None:
        """Finishes the queued operations, then closes the ring."""
        self._runner.stop()
        self._ring.close()


def _create(store: Store, rank: int, world_size: int,
            timeout: timedelta | None) -> RingleaderBackend:
    """torch's creator for the backend: the ring `init_from_ring` gave, or a rendezvous
    through `store`."""
    ring: _native.Ring | None = getattr(_given_ring, "ring", None)
    if ring is not None:
        _given_ring.ring = None
        if (ring.rank, ring.world) != (rank, world_size):
            raise ValueError(
                f"ring of rank {ring.rank} of {ring.world}, group of {rank} of {world_size}")
        return RingleaderBackend(ring, timeout)
    ms = int(timeout.total_seconds() * 1000) if timeout is not None else 1_800_000
    return RingleaderBackend(_rendezvous.connect(store, rank, world_size, ms), timeout)


def register() -> None:
    """Registers the backend with torch (once; the package does it on import, and a wheel
    install names this function as torch's `torch.distributed.backends` entry point)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


def init_from_ring(ring: _native.Ring, timeout: timedelta = timedelta(minutes=30),
                   device_backends: str | None = None, master: str | None = None) -> None:
    """Makes the connected `ring` torch's default process group (rank and world size its
    own): for a ring built from a node's generation line. Destroy the group
    (`dist.destroy_process_group()`) before giving the next generation's ring.

    Without `device_backends` no store is needed. With one (`"cuda:nccl"`: CUDA tensors
    through torch's own NCCL group, inside this ring's membership), rank 0 opens a
    `TCPStore` on `master` (its host, as the other ranks reach it) at a free port and
    broadcasts the port over the ring; the group is then `"cpu:ringleader," +
    device_backends`, built from that store, so a new generation gets a new device group of
    exactly its ranks. The store is as protected as torch's (no authentication): the ring
    carries its port only. A device group of the CPU (`"cpu:gloo"`) is the whole group: the
    ring then carries no tensor of it."""
    store: Store = HashStore()
    backend = BACKEND
    if device_backends:
        if not master:
            raise ValueError("init_from_ring: device_backends needs master, rank 0's host")
        store = _generation_store(ring, master, timeout)
        backend = device_backends if device_backends.startswith("cpu:") else \
            f"cpu:{BACKEND},{device_backends}"
    _given_ring.ring = ring
    try:
        dist.init_process_group(
            backend, store=store, rank=ring.rank, world_size=ring.world, timeout=timeout)
    finally:
        _given_ring.ring = None


def _generation_store(ring: _native.Ring, master: str, timeout: timedelta) -> Store:
    """A `TCPStore` of this ring's ranks: rank 0 serves it on `master` at a free port, which
    the ring broadcasts (8 bytes) to the others."""
    port = torch.zeros(1, dtype=torch.int64)
    store: TCPStore | None = None
    if ring.rank == 0:
        store = TCPStore(master, 0, ring.world, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        port[0] = store.port
    ring.broadcast(port.data_ptr(), 8, 0)
    if store is None:
        store = TCPStore(master, int(port.item()), ring.world, is_master=False,
                              timeout=timeout)
    return store
