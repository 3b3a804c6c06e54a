"""The device group of an elastic generation: the process group that carries the device's
tensors (NCCL for CUDA) beside the ring, chosen through one seam, agreed by the whole
generation, fenced before a step commits, and aborted, never waited on, when a peer is lost.

NCCL fails unlike the ring: a CUDA work's `wait()` and future complete for the host once the
collective is enqueued, a collective whose peer died blocks (it never raises), and
destroying a group with work in flight waits for that work. So the session (`_session`)
never learns of a lost peer from the device group; it learns from the node (a newer
generation), the ring, or the deadline of a `Fence`, and then aborts the device group
(`abort`) and drops it without waiting (`drop`). At a normal end (the script returns)
every rank meets at a barrier over the ring first, then destroys the group (`end`).

- The seam: `RINGLEADER_CUDA_BACKEND` names the group's backend, `nccl` by default, for CUDA
  tensors; `none` turns it off; `<device>:<backend>` names another device's, e.g. `cpu:gloo`
  (the device group then carries CPU tensors and the ring only the session's own
  agreement and state broadcast; the tests put a double of NCCL there, on the CPU).
- Who may build it (`usable_here`): a rank the node gave devices (`RINGLEADER_GPUS` ≥ 1;
  a rank without the variable, as outside a node, counts as given), whose torch sees the
  device (`torch.cuda.is_available()` for CUDA).
- The agreement (`agree`): the minimum of that over the generation's ring, before any store
  is built, so a GPU rank beside a CPU rank (or one given no GPU that sees the host's) puts
  the whole generation on the ring rather than half of it on NCCL.
- The fence (`Fence`): one collective on the device group after the step's own, in the
  group's order, whose completion the host polls without blocking (a CUDA event; on the
  CPU, its output filled in), so a step commits only after its device work is done.
- `survive_communicator_errors`: `TORCH_NCCL_ASYNC_ERROR_HANDLING=2` (abort the
  communicator, keep the process) where torch would tear the process down.
"""

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import _native

DEVICE_BACKEND_ENV = "RINGLEADER_CUDA_BACKEND"
DEVICE_BACKEND_DEFAULT = "nccl"
GPUS_ENV = "RINGLEADER_GPUS"
ASYNC_ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
# torch's values: 0 no handling, 1 tear down, 2 clean up only (abort the communicator, the
# process lives), 3 tear down without clean-up (the default).
ASYNC_ERROR_HANDLING_SURVIVE = "2"
ASYNC_ERROR_HANDLING_TEAR_DOWN = ("1", "3")

Environ = dict[str, str] | os._Environ[str]


@dataclass(frozen=True)
class DeviceGroup:
    """A device group's backend: `backend` for tensors on `device` ("cuda", "cpu")."""

    device: str
    backend: str

    def spec(self) -> str:
        """`"<device>:<backend>"`, as `init_from_ring(device_backends=…)` takes it."""
        return f"{self.device}:{self.backend}"


def configured(environ: Environ | None = None) -> DeviceGroup | None:
    """The device group `RINGLEADER_CUDA_BACKEND` names (see the module doc); a malformed
    value raises `ValueError` naming the variable."""
    env = os.environ if environ is None else environ
    value = env.get(DEVICE_BACKEND_ENV, DEVICE_BACKEND_DEFAULT).strip()
    if value == "none":
        return None
    device, sep, backend = value.rpartition(":")
    if not sep:
        device = "cuda"
    if not backend or not device or ":" in device or "," in value:
        raise ValueError(f"{DEVICE_BACKEND_ENV}={value!r}: want a backend name (nccl), "
                         "<device>:<backend> (cpu:gloo) or none")
    return DeviceGroup(device, backend)


def usable_here(group: DeviceGroup | None, environ: Environ | None = None) -> bool:
    """Whether this rank may build `group`: given devices by its node and seeing them."""
    if group is None:
        return False
    env = os.environ if environ is None else environ
    given = env.get(GPUS_ENV)
    if given is not None:
        try:
            if int(given) < 1:
                return False
        except ValueError as e:
            raise ValueError(f"{GPUS_ENV}={given!r}: want a device count") from e
    if group.device == "cuda":
        return bool(torch.cuda.is_available())
    return True


def agree(ring: _native.Ring, wanted: DeviceGroup | None,
          usable: bool | None = None) -> DeviceGroup | None:
    """The generation's device group: `wanted` when every rank of `ring` may build it, else
    None (every rank alike). One int64 minimum over the ring; raises its `RingError`."""
    mine = usable_here(wanted) if usable is None else usable
    flag = torch.tensor([1 if mine and wanted is not None else 0], dtype=torch.int64)
    ring.allreduce(flag.data_ptr(), 8, "int64", "min")
    return wanted if int(flag.item()) == 1 else None


class Fence:
    """One collective on the device group, enqueued after everything the step issued there;
    `done()` says, without blocking, whether it (so all before it) completed on every rank.
    Building one may raise the group's error (a backend that fails on the host, gloo)."""

    def __init__(self, group: DeviceGroup, world: int) -> None:
        self._world = world
        # Every rank's 1 gathered into zeros: all ones once the gather ran (an allreduce in
        # place would read as done at once in a world of one).
        self._flag = torch.zeros(world, device=group.device)
        work = dist.all_gather_into_tensor(self._flag, torch.ones(1, device=group.device),
                                           async_op=True)
        # NCCL: the current stream waits for the collective, the host does not; a backend
        # whose works are done on the host when done (gloo) blocks here.
        assert work is not None  # async_op=True always gives a work
        work.wait()
        self._event = None
        if self._flag.device.type == "cuda":
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()

    def done(self) -> bool:
        """Whether the fence's collective ended: ran, or was cut by an abort (torch's
        watchdog aborts an NCCL communicator on a peer's error under
        `TORCH_NCCL_ASYNC_ERROR_HANDLING=2`, and the cut kernels end: the event completes).
        `complete()` tells which."""
        if self._event is not None:
            return bool(self._event.query())  # type: ignore[no-untyped-call]
        # On the host a collective writes its output when it ran; one cut by an abort never
        # does, and has ended once its backend says it was aborted (the NCCL double does).
        return self.complete() or _aborted(self._flag.device)

    def complete(self) -> bool:
        """Whether the collective ran on every rank: each one's 1 was gathered (a cut one
        leaves zeros). Read once `done()`: a small copy to the host, nothing in flight."""
        return int(self._flag.sum().item()) == self._world


def _aborted(device: torch.device) -> bool:
    """Whether the default group's backend for `device` says it was aborted (an `aborted`
    attribute: the NCCL double's; torch's own backends have none)."""
    world = dist.group.WORLD
    if world is None:
        return False
    try:
        backend = world._get_backend(device)
    except RuntimeError:
        return False
    return bool(getattr(backend, "aborted", False))


def abort(group: DeviceGroup) -> bool:
    """Aborts the default process group's backend of `group`'s device, from any thread:
    its collectives in flight end, it takes no more. False when there is none to abort."""
    world = dist.group.WORLD
    if not dist.is_initialized() or world is None:
        return False
    try:
        backend = world._get_backend(torch.device(group.device))
    except RuntimeError:
        return False
    backend.abort()
    return True


def drop(aborted: bool) -> None:
    """Drops the default process group: destroyed when its work is known done, else aborted
    (torch's `_abort_process_group`, which waits on nothing) so no wait on a dead peer."""
    if not dist.is_initialized():
        return
    abort_group = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if aborted and abort_group is not None:
        abort_group()
        return
    world = dist.group.WORLD
    if aborted and world is not None:
        world.abort()
    dist.destroy_process_group()


def end(barrier: Callable[[], object]) -> bool:
    """The normal end of the default process group under a device group, on every rank:
    `barrier` (the ring's, bounded by its op deadline: every rank has reached its end, so no
    peer still has work in flight with this one), then `destroy_process_group`. A failed
    barrier (a peer gone at the end) aborts the group instead of destroying it, which would
    wait on a dead peer. Returns whether the group was destroyed normally."""
    try:
        barrier()
    except Exception as e:  # noqa: BLE001 - RingError or torch's: the group is spent either way
        print(f"ringleader: the final barrier failed ({e}): aborting the device group",
              file=sys.stderr, flush=True)
        drop(aborted=True)
        return False
    drop(aborted=False)
    return True


def survive_communicator_errors(environ: Environ | None = None) -> None:
    """Sets `TORCH_NCCL_ASYNC_ERROR_HANDLING=2` unless it already lets the process live (0,
    2): an elastic rank outlives a lost peer's communicator error."""
    env = os.environ if environ is None else environ
    old = env.get(ASYNC_ERROR_HANDLING_ENV)
    if old is not None and old not in ASYNC_ERROR_HANDLING_TEAR_DOWN:
        return
    if old is not None:
        print(f"ringleader: {ASYNC_ERROR_HANDLING_ENV}={old} would end this elastic rank at "
              f"a lost peer: set to {ASYNC_ERROR_HANDLING_SURVIVE}", file=sys.stderr,
              flush=True)
    env[ASYNC_ERROR_HANDLING_ENV] = ASYNC_ERROR_HANDLING_SURVIVE
