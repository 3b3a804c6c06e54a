"""`ElasticOptimizer`: a torch optimizer that commits the training state in memory at every
step and re-forms the group when the ring changes, without storage.

The commit (`_Commit`) is the model's parameters and buffers, the optimizer's state (its
per-parameter tensors and counters, each group's base learning rate and its learning rate
of that step per unit of world × accumulation), the learning-rate scheduler's state when
one is given (`scheduler=`) and the sampler's position, at a step count. Its tensors are allocated once and copied into at each step
(a memcpy of the model and optimizer state, no allocation); the last `COMMITS_KEPT` are
kept, so ranks one step apart still share one.

A commit of CUDA tensors lives in pinned host memory, not on the device: two commits on the
device would triple the device memory of the parameters and optimizer state. Its copy is
queued on a stream of its own after the step's work and runs while the next step's forward
and backward do (they only read the parameters); the next `optimizer.step()` (the first
write to what was copied) waits for it on the device, and a reader of the commit on the host
(the agreement's restore, a broadcast) waits for it there. The module's buffers (a batch
norm's running statistics, written by the next forward) are copied on the step's own stream,
so that forward comes after their copy. A restore puts each optimizer
state tensor back where torch's own `load_state_dict` would (beside its parameter; `step`
where it was, unless the group is fused or capturable).

A standby joiner (`_session`) says `ringleader-ready` when the optimizer is made (the
script has built its model and data by then) and joins the generation that follows.

A re-form, on a collective error noted in the step (`_session`) or on a newer generation
from the node at a step boundary: the ring and process group are dropped, the next
generation's ring is connected, the ranks run the agreement of the protocol crate
(`Ring.agree`: the newest commit every surviving holder has and the lowest rank holding
it), the root broadcasts that commit to the ranks that lack it (joiners, laggards), every
rank restores it, DDP is rebuilt, the sampler shares out the epoch's remaining samples
over the new world, and the learning rate follows the world linearly: each group's lr is
the committed step's lr per unit × world × accumulation (at a fresh start, `base`: the lr
given divided by the world the optimizer was made in), so a schedule's decay carries over
and a joiner gets the group's; a scheduler given as `scheduler=` is restored to the
committed step (the script's `scheduler.step()` after the `step()` that re-formed then
moves it on, as on every step) with its base learning rates rescaled the same way. The rank prints
`ringleader-elastic resumed … restored_step=C steps_lost=L source=memory|broadcast|fresh`
and goes on; a failed collective is printed as `ringleader-elastic failed …` first. At most
the failed step is lost (trained again).

A ring shrunk by a preemption that keeps its global batch (`[elastic] keep_global_batch`,
the default) has `accumulation` = ceil(W / W') micro-batches per step in its generation
line: `step()` then steps the wrapped optimizer once every `accumulation` calls, with the
gradients summed over those calls (`zero_grad` between them is skipped) and divided by
their number, so each step sees the global batch of W ranks and the learning rate is
unchanged; `steps` counts those steps. A re-form drops a step's partial accumulation.

Outside an elastic ringleader rank it is the wrapped optimizer, counting steps and moving
the sampler on.
"""

import contextlib
import copy
import ctypes
import io
import time
from collections.abc import Callable
from typing import Any, Literal

import torch

from .. import _native, elastic
from ._ddp import DistributedDataParallel
from ._sampler import ElasticSampler
from ._session import session

State = dict[str, Any]
"""A commit as `_Commit.as_dict()` writes it (and a broadcast carries it)."""
Source = Literal["fresh", "memory", "broadcast"]

# Commits kept in memory (the newest last).
COMMITS_KEPT = 2
# Largest commit a rank accepts from a broadcast, bytes (checked before allocating).
STATE_BROADCAST_BYTES_MAX = 16 << 30


def _host_like(t: torch.Tensor) -> torch.Tensor:
    """A commit's buffer for `t`: pinned host memory for a CUDA tensor, else memory like it."""
    if t.is_cuda:
        return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    return torch.empty_like(t)


class _Commit:
    """One committed state (see the module doc); `fill` copies into its tensors."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.tensors: list[torch.Tensor] = []
        self.opt_state: dict[int, dict[str, Any]] = {}
        self.sampler: tuple[int, int] | None = None
        self.base_lrs: list[float] | None = None
        self.unit_lrs: list[float] | None = None
        self.scheduler: dict[str, Any] | None = None
        # The side stream a CUDA state's copy runs on; the events of the last copy on it and
        # on the step's stream (the buffers'), None when done or on the CPU.
        self._stream: Any = None
        self._copied: Any = None
        self._buffers_copied: Any = None

    def fill(self, step: int, tensors: list[torch.Tensor], buffers_from: int,
             opt: torch.optim.Optimizer, params: list[torch.Tensor], sampler: ElasticSampler,
             base_lrs: list[float], scale: int, scheduler: Any) -> None:
        """Copies the state in: `tensors` are the module's parameters, then (from
        `buffers_from`) its buffers; `params` the optimizer's, in its groups' order; `scale`
        the generation's world × accumulation; `scheduler` the lr scheduler or None."""
        self.wait()  # its buffers are written again: the last copy into them is done
        stream = self._side_stream(tensors)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(stream.device))
        if len(self.tensors) != len(tensors) or any(
                a.shape != b.shape or a.dtype != b.dtype for a, b in zip(self.tensors, tensors)):
            self.tensors = [_host_like(t) for t in tensors]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for dst, src in zip(self.tensors[:buffers_from], tensors[:buffers_from]):
                dst.copy_(src.detach(), non_blocking=True)
            self._copy_optimizer(opt, params)
        if stream is not None:
            self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._copied.record(stream)
        for dst, src in zip(self.tensors[buffers_from:], tensors[buffers_from:]):
            dst.copy_(src.detach(), non_blocking=True)
        if stream is not None:
            self._buffers_copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._buffers_copied.record(torch.cuda.current_stream(stream.device))
        self.step = step
        self.sampler = sampler.state()
        self.base_lrs = list(base_lrs)
        self.unit_lrs = [float(g["lr"]) / scale for g in opt.param_groups]
        self.scheduler = None if scheduler is None else copy.deepcopy(scheduler.state_dict())

    def _side_stream(self, tensors: list[torch.Tensor]) -> Any:
        """The copy's stream when the state is on a CUDA device, else None."""
        cuda = next((t for t in tensors if t.is_cuda), None)
        if cuda is None:
            return None
        if self._stream is None or self._stream.device != cuda.device:
            self._stream = torch.cuda.Stream(device=cuda.device)  # type: ignore[no-untyped-call]
        return self._stream

    def _copy_optimizer(self, opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        for i, p in enumerate(params):
            st = opt.state.get(p)
            if not st:
                self.opt_state.pop(i, None)
                continue
            mine = self.opt_state.setdefault(i, {})
            for k, v in st.items():
                old = mine.get(k)
                if torch.is_tensor(v):
                    if not (torch.is_tensor(old) and old.shape == v.shape
                            and old.dtype == v.dtype):
                        old = mine[k] = _host_like(v)
                    old.copy_(v.detach(), non_blocking=True)
                else:
                    mine[k] = v

    def hold_writes(self) -> None:
        """Makes the current CUDA stream wait for this commit's copy: called before the
        optimizer writes what was copied."""
        if self._copied is not None:
            torch.cuda.current_stream(self._copied.device).wait_event(self._copied)

    def wait(self) -> None:
        """Waits on the host for this commit's copy (before it is read or written again)."""
        for event in (self._copied, self._buffers_copied):
            if event is not None:
                event.synchronize()
        self._copied = self._buffers_copied = None

    def as_dict(self) -> State:
        self.wait()
        return {"step": self.step, "tensors": self.tensors, "opt_state": self.opt_state,
                "sampler": list(self.sampler or ()), "base_lrs": self.base_lrs,
                "unit_lrs": self.unit_lrs, "scheduler": self.scheduler}


def _restored(value: Any, param: torch.Tensor, key: str, group: dict[str, Any]) -> Any:
    """A copy of a committed optimizer state value where torch's `load_state_dict` puts it:
    `step` where it is unless the group is fused or capturable, any other tensor beside
    its parameter."""
    if not torch.is_tensor(value):
        return value
    if key == "step" and not (group.get("fused") or group.get("capturable")):
        return value.clone()
    return value.to(device=param.device, copy=True)


def _encode(commit: _Commit) -> bytes:
    buf = io.BytesIO()
    torch.save(commit.as_dict(), buf)
    return buf.getvalue()


def _decode(data: bytes) -> State:
    state: State = torch.load(io.BytesIO(data), weights_only=True)
    return state


def _broadcast_bytes(ring: _native.Ring, data: bytes, root: int) -> bytes:
    """`root`'s bytes on every rank (length first, checked before allocating)."""
    n = torch.tensor([len(data) if ring.rank == root else 0], dtype=torch.int64)
    ring.broadcast(n.data_ptr(), 8, root)
    size = int(n.item())
    if not 0 <= size <= STATE_BROADCAST_BYTES_MAX:
        raise _native.RingError(f"state broadcast by rank {root}: {size} bytes "
                                f"(at most {STATE_BROADCAST_BYTES_MAX})")
    if ring.rank == root:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if size else \
            torch.empty(0, dtype=torch.uint8)
    else:
        buf = torch.empty(size, dtype=torch.uint8)
    if size:
        ring.broadcast(buf.data_ptr(), size, root)
    return data if ring.rank == root else _tensor_bytes(buf)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a uint8 tensor (numpy may be missing)."""
    n = t.numel()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


class ElasticOptimizer:
    """`rlt.ElasticOptimizer(torch.optim.SGD(model.parameters(), lr=…), model=model,
    sampler=sampler, scheduler=None)`: see the module doc. `steps` counts the group's
    steps; other attributes are the wrapped optimizer's. `scheduler`: a
    `torch.optim.lr_scheduler` of the wrapped optimizer, committed and restored with it."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: DistributedDataParallel,
                 sampler: ElasticSampler, scheduler: Any = None) -> None:
        self.optimizer = optimizer
        self.model = model
        self.sampler = sampler
        self.scheduler = scheduler
        self.steps = 0
        # Calls of `step()` since the last optimizer step (accumulation).
        self._micro = 0
        self._sess = session()
        world = max(self._sess.world, 1)
        self._base_lrs: list[float] = [g["lr"] / world for g in optimizer.param_groups]
        # Each group's lr per unit of world × accumulation at the restored step (None: a
        # fresh start, `_base_lrs`).
        self._unit_lrs: list[float] | None = None
        self._params: list[torch.Tensor] = [p for g in optimizer.param_groups for p in g["params"]]
        self._commits = [_Commit() for _ in range(COMMITS_KEPT)]
        self._newest = -1  # index of the newest commit, -1: none
        self._step_start = time.monotonic()
        if self._sess.elastic:
            self._sess.step_started()
            self._reform(first=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._micro == 0:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    # -- commits -----------------------------------------------------------------------

    def _state_tensors(self) -> list[torch.Tensor]:
        m: torch.nn.Module = self.model.module if hasattr(self.model, "module") else self.model
        return list(m.parameters()) + list(m.buffers())

    def _commit(self) -> None:
        i = (self._newest + 1) % COMMITS_KEPT
        m: torch.nn.Module = self.model.module if hasattr(self.model, "module") else self.model
        params = len(list(m.parameters()))
        sess = self._sess
        self._commits[i].fill(self.steps, self._state_tensors(), params, self.optimizer,
                              self._params, self.sampler, self._base_lrs,
                              max(sess.world, 1) * sess.accumulation, self.scheduler)
        self._newest = i

    def _held(self) -> list[int]:
        return sorted(c.step for c in self._commits if c.step is not None)

    def _find(self, step: int) -> _Commit | None:
        for c in self._commits:
            if c.step == step:
                return c
        return None

    def _restore(self, state: State) -> None:
        """Loads a commit (`_Commit.as_dict()` form) into the model, optimizer, sampler."""
        with torch.no_grad():
            for dst, src in zip(self._state_tensors(), state["tensors"]):
                dst.copy_(src)
        self.optimizer.state.clear()
        group_of = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        for i, st in state["opt_state"].items():
            p = self._params[int(i)]
            self.optimizer.state[p] = {
                k: _restored(v, p, k, group_of[id(p)]) for k, v in st.items()}
        self.sampler.set_state(state["sampler"])
        self._base_lrs = list(state["base_lrs"])
        units = state.get("unit_lrs")
        self._unit_lrs = None if units is None else list(units)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["step"])

    # -- the step ----------------------------------------------------------------------

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """The wrapped optimizer's step, then a commit; or, when the step's collectives
        failed or the node moved to a newer generation, a re-form (see the module doc)."""
        sess = self._sess
        if not sess.elastic:
            out = self.optimizer.step(closure)
            self.steps += 1
            self.sampler.normalize()
            return out
        # Under a device group (NCCL) the step's collectives are done for the host once
        # enqueued: known complete only once its fence passed (else it was aborted, noted).
        sess.wait_device_work()
        if sess.failure is not None:
            self._fail()
            return None
        self._micro += 1
        k = sess.accumulation
        if self._micro < k:
            return None  # more micro-batches to sum before this step
        self._micro = 0
        if k > 1:
            with torch.no_grad():
                for p in self._params:
                    if p.grad is not None:
                        p.grad.div_(k)
        if self._newest >= 0:
            self._commits[self._newest].hold_writes()
        out = self.optimizer.step(closure)
        if sess.failure is not None:
            # Aborted meanwhile (a newer generation's grace ran out): not committed.
            self._fail()
            return None
        self.steps += 1
        self.sampler.normalize()
        self._commit()
        now = time.monotonic()
        wait = sess.op_clock.take()
        sess.stats.add(now - self._step_start - wait, wait, sess.generation, sess.rank,
                       self.steps)
        sess.step_ended()
        if sess.feed.stopped:
            sess.exit_stopped()
        if sess.feed.pending(sess.generation) is not None:
            self._reform()
        self._step_start = time.monotonic()
        sess.between_steps()
        sess.step_started()
        return out

    def _fail(self) -> None:
        """The step failed (`sess.failure`): raised when it is not the ring's nor the
        node's doing, else reported and re-formed."""
        sess = self._sess
        e = sess.failure
        assert e is not None
        if not isinstance(e, _native.RingError) and not sess.superseded():
            raise e
        sess.report_failure(e)
        self._reform()

    def _reform(self, first: bool = False) -> None:
        """Leaves the current generation (unless `first`: the one `rlt.init()` joined),
        joins the next one that connects and agrees, and restores the agreed state."""
        sess = self._sess
        sess.step_ended()
        sess.clock.leave()
        step_reached = self.steps
        if first and sess.ring is None:
            # A standby joiner: set up now, so say so; the node re-forms with it.
            elastic.ready()
            first = False
        while True:
            if not first:
                self.model.drop()
                sess.leave_group()
                sess.join_next()
            first = False
            try:
                self._unit_lrs = None  # a commit restored sets them
                source, restored, group_step = self._agree(step_reached)
                self._rebuild(source)
            except _native.RingError as e:
                sess.report_failure(e)
                continue
            break
        sess.failure = None
        sess.op_clock.take()
        sess.last_generation = sess.generation
        self._micro = 0
        self.optimizer.zero_grad(set_to_none=True)
        scale = sess.world * sess.accumulation
        units = self._unit_lrs if self._unit_lrs is not None else self._base_lrs
        for g, unit in zip(self.optimizer.param_groups, units):
            g["lr"] = unit * scale
        if self.scheduler is not None:
            # Its own base lrs (closed-form schedules start from them) follow the world too.
            self.scheduler.base_lrs = [base * scale for base in self._base_lrs]
            for g, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                if "initial_lr" in g:
                    g["initial_lr"] = base
            self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        # The commits newer than the restored step belong to an abandoned history.
        for c in self._commits:
            if c.step is not None and c.step > self.steps:
                c.step = None
        self._commit()
        elastic.resumed(sess.generation, sess.world, sess.rank, group_step, self.steps,
                        max(group_step - self.steps, 0), source)
        self._step_start = time.monotonic()
        sess.between_steps()
        sess.step_started()

    def _rebuild(self, source: Source) -> None:
        """DDP on the new group; a fresh start takes rank 0's parameters. Under a device
        group DDP's own start-up sync is skipped (it reads its collectives' results on the
        host, which an NCCL work does not wait for): rank 0's state is broadcast on the
        device group instead, and fenced. Raises a `RingError` when that fails."""
        sess = self._sess
        if sess.device_group is None:
            self.model.rebuild(init_sync=source == "fresh")
            return
        self.model.rebuild(init_sync=False)
        if source == "fresh":
            self.model.broadcast_state(0)
        if not sess.wait_device_work():
            e = sess.failure
            raise e if isinstance(e, _native.RingError) else _native.RingError(str(e))

    def _agree(self, step_reached: int) -> tuple[Source, int | None, int]:
        """The agreement on the current ring, and the restore: (source, restored step or
        None, the group's step)."""
        sess, ring = self._sess, self._sess.ring
        assert ring is not None, "a re-form agrees on the ring it joined"
        held = self._held()
        outcome = ring.agree(sess.last_generation if held else None, step_reached, held)
        if len(outcome) == 2:  # ("fresh", group_step)
            return "fresh", None, outcome[1]
        _, step, root, everyone_holds, group_step, holds = outcome
        mine = self._find(step) if holds else None
        # The agreement's contract: when everyone holds the step, so does this rank, and the
        # root always holds it.
        if everyone_holds:
            assert mine is not None, f"every rank holds step {step}, this one does not"
            self._restore(mine.as_dict())
            return "memory", step, group_step
        if ring.rank == root:
            assert mine is not None, f"the root of step {step} does not hold it"
        data = _encode(mine) if mine is not None and ring.rank == root else b""
        got = _broadcast_bytes(ring, data, root)
        if mine is not None:
            self._restore(mine.as_dict())
            return "memory", step, group_step
        state = _decode(got)
        if int(state["step"]) != step:
            raise _native.RingError(f"state broadcast by rank {root}: step {state['step']}, "
                                    f"agreed {step}")
        self._restore(state)
        return "broadcast", step, group_step

