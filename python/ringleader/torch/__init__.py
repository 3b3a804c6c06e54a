"""PyTorch on the ring: a `torch.distributed` backend named ``"ringleader"``.

Importing this package registers the backend; then, under torchrun or as a ringleader
command job's rank (both give RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT):

    import torch.distributed as dist
    import ringleader.torch  # noqa: F401  (a wheel install finds it by itself)
    dist.init_process_group("ringleader")
    model = torch.nn.parallel.DistributedDataParallel(Net())

Its place: the collectives (allreduce with SUM, AVG, MIN, MAX; broadcast; allgather, also
into one flat tensor; reduce_scatter, also from one flat tensor; barrier) on CPU tensors of
float32, float64, float16, bfloat16, int32, int64 and uint8 run on the `collective` crate's
ring through `ringleader._native.Ring`: TCP between hosts, shared memory between the ranks
of one host, the GIL released for each transfer, the tensor's own memory used in place
(no copy for allreduce and broadcast of contiguous tensors). Broadcast and allgather move any
dtype (bool, int8, complex, …) as bytes; integer sums are exact (wrapping on overflow);
AVG of integers raises `ValueError`, as Gloo refuses it. Operations run in the order they are
issued on one thread per process group, so DDP's bucket allreduces overlap the backward
pass; each returns a `Work` whose future holds the output tensors.

Rendezvous (`init_process_group("ringleader")`, or `new_group(backend="ringleader")`): each
rank binds a data-plane port on its host (`RINGLEADER_DATA_HOST`, else the address this host
reaches MASTER_ADDR from, else 127.0.0.1) and publishes it in torch's store; then the ranks
connect to each other directly. With `RINGLEADER_SECRET` set (the same on every rank) the
connections are authenticated with it and the secret never touches the store. Without it,
rank 0 draws a random secret and shares it through the store, so the data plane is exactly
as protected as torch's store, which has no authentication: fine on a trusted network, set
the secret otherwise. `RINGLEADER_SHM=0` keeps every link on TCP (for emulated hosts that
share /dev/shm). The `timeout` of `init_process_group` is each operation's deadline.

Without a store: `init_from_ring(ring)` makes an already connected `Ring` (say, one built
from a node's `ringleader-generation` line with `Ring.from_generation_line`) torch's
default process group.

CUDA tensors are not carried: a collective on one raises `RuntimeError` naming the way to
send them through NCCL, `init_process_group("cpu:ringleader,cuda:nccl")` (torch then builds
its own NCCL group for CUDA tensors from the same store). An elastic rank on a host with a
GPU gets such a group at every generation (`init_from_ring(…, device_backends="cuda:nccl")`,
built from a store rank 0 serves, its port broadcast over the ring).

Failures raise the ring's exceptions (`RingError`, a `RuntimeError` and a
`ringleader.RingleaderError`, and its subclasses `PeerLost`, `Aborted`, `RingTimeout`,
`HandshakeRefused`, with `reason` and `rank`) from `Work.wait()`; after one,
the process group is spent, as torch's are. `Work.wait(timeout)` raises `RuntimeError` once
the timeout has passed, and the operation goes on.

Elastic training from survivors' memory (docs/book/src/guide/pytorch.md), a few lines in a DDP
script:

    import ringleader, ringleader.torch as rlt
    rlt.init()
    sampler = rlt.ElasticSampler(len(dataset), batch_size=32, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    model = rlt.DistributedDataParallel(Net())
    opt = rlt.ElasticOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model=model,
                               sampler=sampler)
    for epoch in sampler.epochs(20):
        for x, y in loader:
            opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()

As a rank of a `[elastic] protocol = "ringleader"` command job it follows the node's
generations (`_session`), commits every step in memory and re-forms on a loss
(`_optimizer`), re-sharding the epoch's remaining samples (`_sampler`) and rebuilding DDP
(`_ddp`); under torchrun or in one process the same script is plain DDP. The generic,
framework-free part (generation lines, heartbeats, rank stats) is `ringleader.elastic`.

PyTorch is imported here only: the rest of `ringleader` works without it.
"""

try:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("ringleader.torch needs PyTorch (pip install torch)") from e

from .._native import Aborted, HandshakeRefused, Listener, PeerLost, Ring, RingError, RingTimeout
from ._backend import BACKEND, RingleaderBackend, init_from_ring, register
from ._ddp import DistributedDataParallel
from ._optimizer import ElasticOptimizer
from ._sampler import ElasticSampler
from ._session import generation, init, rank, world_size

register()

__all__ = [
    "Aborted", "BACKEND", "DistributedDataParallel", "ElasticOptimizer", "ElasticSampler",
    "HandshakeRefused", "Listener", "PeerLost", "Ring", "RingError",
    "RingTimeout", "RingleaderBackend", "generation", "init", "init_from_ring", "rank",
    "register", "world_size",
]
