"""`DistributedDataParallel`: torch's DDP, rebuilt for each generation of the ring.

The wrapper owns the module (its parameters are the module's, so an optimizer built on
`model.parameters()` stays valid through re-forms) and a torch
`DistributedDataParallel` over the current process group, built by the `ElasticOptimizer`
once the ranks agreed on the state (a joiner's first collectives must be the agreement's,
not DDP's), or at the first forward without one. While elastic, gradients are averaged by
a comm hook that notes a failed collective in the session instead of raising it into the
backward pass (the optimizer's `step()` then re-forms), and a forward whose collectives
fail runs on the local module. Under a device group (NCCL) gradients are views of DDP's
buckets (`gradient_as_bucket_view`, unless the options say otherwise), written in place by
the collective in the device's order; the optimizer fences them before it steps.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.futures import Future

from ._session import Session, session


def _average_hook(sess: Session, bucket: GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over the ranks; on a failed collective, the bucket
    unchanged (the step is lost anyway) and the failure noted."""
    buf = bucket.buffer()
    if sess.failure is not None:
        done: Future[torch.Tensor] = Future()
        done.set_result(buf)
        return done
    try:
        work = dist.all_reduce(buf, op=dist.ReduceOp.AVG, async_op=True)
    except Exception as e:  # noqa: BLE001 - noted; step() re-forms or raises it
        sess.note_failure(e)
        done = Future()
        done.set_result(buf)
        return done

    def finished(fut: Future[Any]) -> torch.Tensor:
        try:
            value = fut.value()
        except Exception as e:  # noqa: BLE001 - noted; step() re-forms or raises it
            value = e
        # torch hands a Python backend's failed future on as its value, not raised.
        if isinstance(value, BaseException):
            sess.note_failure(value)
            return buf
        first: torch.Tensor = value[0]
        return first

    return work.get_future().then(finished)


class DistributedDataParallel(torch.nn.Module):
    """`rlt.DistributedDataParallel(module, **ddp_options)`: see the module doc; the
    options are torch DDP's (`bucket_cap_mb`, `find_unused_parameters`, …)."""

    # Set with object.__setattr__: not submodules (see __init__).
    _ddp: torch.nn.parallel.DistributedDataParallel | None
    _options: dict[str, Any]

    def __init__(self, module: torch.nn.Module, **ddp_options: Any) -> None:
        super().__init__()
        self.module = module
        # Not a submodule: the parameters are listed once, through `module`.
        object.__setattr__(self, "_ddp", None)
        object.__setattr__(self, "_options", ddp_options)

    def rebuild(self, init_sync: bool = True) -> torch.nn.parallel.DistributedDataParallel:
        """A new torch DDP on the current process group; `init_sync` broadcasts rank 0's
        parameters and buffers first (a fresh start; a restore has them equal already); returns
        it."""
        object.__setattr__(self, "_ddp", None)
        sess = session()
        options = dict(self._options)
        if sess.device_group is not None:
            options.setdefault("gradient_as_bucket_view", True)
        ddp = torch.nn.parallel.DistributedDataParallel(
            self.module, init_sync=init_sync, **options)
        if sess.elastic:
            ddp.register_comm_hook(sess, _average_hook)
        object.__setattr__(self, "_ddp", ddp)
        return ddp

    def broadcast_state(self, root: int) -> None:
        """Issues rank `root`'s parameters and buffers to every rank (asynchronous: the
        caller waits, `Session.wait_device_work`)."""
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                dist.broadcast(t.data, root, async_op=True)

    def drop(self) -> None:
        """Forgets the DDP of a spent process group."""
        object.__setattr__(self, "_ddp", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        ddp = self._ddp if self._ddp is not None else self.rebuild()
        sess = session()
        if not sess.elastic:
            return ddp(*args, **kwargs)
        if sess.failure is not None:
            return self.module(*args, **kwargs)
        # A compute section per forward (each of an evaluation's too), until `step()`.
        sess.forward_marks = True
        sess.clock.restart()
        try:
            return ddp(*args, **kwargs)
        except RuntimeError as e:  # RingError is one; step() tells the kinds apart
            sess.note_failure(e)
            return self.module(*args, **kwargs)
