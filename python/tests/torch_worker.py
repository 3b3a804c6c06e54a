"""One rank of the torch tests (test_torch.py starts it the way torchrun or a node does: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment). `python torch_worker.py SCENARIO`:

- `ops`: every collective of the "ringleader" backend against reference results computed
  here from every rank's (deterministic) inputs, for float32/float64/int32/int64 and more;
- `ddp`: DistributedDataParallel over "ringleader", N workers × batch b, against one model
  trained here on the whole N·b batch, for an MLP and a small CNN;
- `job`: what a command job's rank runs: init, a DDP step, and the parameters' checksum;
- `device-group`: two generations from node lines (`RL_LINE_1`, `RL_LINE_2`), each with a
  device group beside the ring built from the ring's own store.

Prints `ok SCENARIO` at the end; any mismatch raises (exit 1) naming it.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringleader.torch  # noqa: F401  (registers the backend)

# Sizes: below the ring's small-message switch (recursive doubling, 64 KiB) and well above
# it (pipelined ring, several 512 KiB frames per segment for 4-byte elements).
SIZES = (5, 300_007)
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
# Exact in every dtype: small integers (sums of up to 4 ranks stay small).
VALUE_RANGE = 17


def inputs(rank, n, dtype, salt=0):
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 3 + rank * 7 + salt) % VALUE_RANGE - VALUE_RANGE // 2).to(dtype)


def expect(what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "-"
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)} != want "
                             f"{want.dtype}{tuple(want.shape)} (max diff {diff})")


def check_ops(rank, world):
    everyone = range(world)
    for dtype in DTYPES:
        for n in SIZES:
            tag = f"{dtype} n={n}"
            all_in = [inputs(r, n, dtype) for r in everyone]
            stacked = torch.stack(all_in)
            ops = [(dist.ReduceOp.SUM, stacked.sum(0, dtype=dtype)),
                   (dist.ReduceOp.MIN, stacked.min(0).values),
                   (dist.ReduceOp.MAX, stacked.max(0).values)]
            if dtype.is_floating_point:
                ops.append((dist.ReduceOp.AVG, stacked.sum(0, dtype=dtype) / world))
            for op, want in ops:
                t = inputs(rank, n, dtype)
                dist.all_reduce(t, op=op)
                expect(f"all_reduce {op} {tag}", t, want)
            if not dtype.is_floating_point:
                try:
                    dist.all_reduce(inputs(rank, n, dtype), op=dist.ReduceOp.AVG)
                except ValueError as e:
                    assert "AVG" in str(e), e
                else:
                    raise AssertionError(f"AVG of {dtype} was not refused")
            # Broadcast from the last rank.
            t = inputs(rank, n, dtype, salt=rank)
            dist.broadcast(t, src=world - 1)
            expect(f"broadcast {tag}", t, inputs(world - 1, n, dtype, salt=world - 1))
            # Allgather into a list, and into one flat tensor.
            outs = [torch.empty(n, dtype=dtype) for _ in everyone]
            dist.all_gather(outs, inputs(rank, n, dtype))
            for r in everyone:
                expect(f"all_gather[{r}] {tag}", outs[r], all_in[r])
            flat = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, inputs(rank, n, dtype))
            expect(f"all_gather_into_tensor {tag}", flat, torch.cat(all_in))
            # Reduce-scatter from a list, and from one flat tensor: rank r gets part r of the
            # sum of every rank's parts.
            parts = [[inputs(r, n, dtype, salt=q) for q in everyone] for r in everyone]
            want = sum(parts[r][rank] for r in everyone).to(dtype)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, parts[rank])
            expect(f"reduce_scatter {tag}", out, want)
            src = torch.cat(parts[rank])
            before = src.clone()
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, src)
            expect(f"reduce_scatter_tensor {tag}", out, want)
            expect(f"reduce_scatter_tensor leaves its input {tag}", src, before)
    # Asynchronous: a Work to wait on and a future holding the output.
    t = inputs(rank, 1000, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait()
    fut = dist.all_reduce(inputs(rank, 7, torch.int64), async_op=True).get_future()
    expect("future value", fut.wait()[0], sum(inputs(r, 7, torch.int64) for r in everyone))
    expect("async all_reduce", t, sum(inputs(r, 1000, torch.float32) for r in everyone))
    # A non-contiguous tensor (a transposed view) is reduced in place too.
    m = inputs(rank, 12, torch.float64).reshape(3, 4).t()
    dist.all_reduce(m)
    want = sum(inputs(r, 12, torch.float64) for r in everyone).reshape(3, 4).t()
    expect("non-contiguous all_reduce", m, want)
    # Any dtype moves as bytes: bool and int8 broadcasts, a float16 allgather.
    b = torch.tensor([rank % 2 == 0, True, rank == 0])
    dist.broadcast(b, src=0)
    expect("bool broadcast", b, torch.tensor([True, True, True]))
    i8 = torch.full((9,), rank - 100, dtype=torch.int8)
    dist.broadcast(i8, src=world - 1)
    expect("int8 broadcast", i8, torch.full((9,), world - 1 - 100, dtype=torch.int8))
    h = [torch.empty(3, dtype=torch.float16) for _ in everyone]
    dist.all_gather(h, torch.full((3,), rank + 0.5, dtype=torch.float16))
    for r in everyone:
        expect("float16 all_gather", h[r], torch.full((3,), r + 0.5, dtype=torch.float16))
    # Work.wait(timeout): a wait that runs out raises and the operation goes on, the next
    # wait has it. Rank 0's peers join only once its first wait has run out (the store says).
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        try:
            work.wait(timedelta(milliseconds=200))
        except RuntimeError as e:
            assert "timed out after 0.2 s" in str(e), e
        else:
            raise AssertionError("a wait for peers that had not joined did not time out")
        store.set("wait-timed-out", "1")
        assert work.wait(timedelta(seconds=120))
    else:
        store.wait(["wait-timed-out"])
        dist.all_reduce(t)
    expect("all_reduce after a timed-out wait", t,
           torch.full((4,), float(sum(r + 1 for r in everyone))))
    dist.barrier()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


# DDP equivalence: steps, batch per worker, tolerance.
DDP_STEPS = 8
DDP_BATCH = 8
DDP_TOLERANCE = 1e-4


def check_ddp(rank, world):
    for name, make, shape in (("mlp", MLP, (20,)), ("cnn", CNN, (1, 16, 16))):
        torch.manual_seed(0)
        reference = make()
        torch.manual_seed(1 + rank)  # DDP must replace these with rank 0's parameters
        model = torch.nn.parallel.DistributedDataParallel(make())
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
        if rank == 0:
            for p, q in zip(model.module.parameters(), reference.parameters()):
                q.data.copy_(p.data)
        data = torch.Generator().manual_seed(42)
        for step in range(DDP_STEPS):
            x = torch.randn((world * DDP_BATCH,) + shape, generator=data)
            y = torch.randint(0, 10, (world * DDP_BATCH,), generator=data)
            mine = slice(rank * DDP_BATCH, (rank + 1) * DDP_BATCH)
            opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            ref_opt.step()
        # Every rank holds the same parameters; rank 0's equal the one-worker model's.
        flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        for r in range(world):
            expect(f"{name} parameters of rank {r}", gathered[r], gathered[0])
        if rank == 0:
            want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
            diff = (flat - want).abs().max().item()
            print(f"{name} max |ddp - single| = {diff:.3g}", flush=True)
            if diff > DDP_TOLERANCE:
                raise AssertionError(f"{name}: DDP over ringleader differs from one worker "
                                     f"by {diff} > {DDP_TOLERANCE}")


def run_job(rank, world):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(DDP_BATCH, 20, generator=torch.Generator().manual_seed(rank))
    y = torch.zeros(DDP_BATCH, dtype=torch.int64)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    total = sum(p.detach().double().sum().item() for p in model.module.parameters())
    print(f"rank {rank} of {world} checksum {total:.12e}", flush=True)


def generations_with_a_device_group():
    """Two generations, each a ring from its node line (`RL_LINE_<g>`) made the default group
    with a device group beside it from the ring's own store (`cuda:gloo` stands in for
    `cuda:nccl` on a host without a GPU): the CPU collectives run on the ring, and the group
    is built again for the second generation's ranks."""
    for g in (1, 2):
        ring = ringleader.torch.Ring.from_generation_line(os.environ[f"RL_LINE_{g}"], 7)
        ringleader.torch.init_from_ring(ring, device_backends="cuda:gloo", master="127.0.0.1")
        rank, world = dist.get_rank(), dist.get_world_size()
        config = dist.get_backend_config()
        assert "cpu:ringleader" in config and "cuda:gloo" in config, config
        t = torch.full((5,), float(rank + g))
        dist.all_reduce(t)
        expect(f"generation {g} sum", t, torch.full((5,), float(sum(r + g for r in range(world)))))
        dist.destroy_process_group()
        ring.close()
    print("ok device-group", flush=True)


def main():
    scenario = sys.argv[1]
    if scenario == "device-group":
        generations_with_a_device_group()
        return
    dist.init_process_group("ringleader")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "ringleader", dist.get_backend()
    assert world == int(os.environ["WORLD_SIZE"])
    {"ops": check_ops, "ddp": check_ddp, "job": run_job}[scenario](rank, world)
    dist.destroy_process_group()
    print(f"ok {scenario}", flush=True)


if __name__ == "__main__":
    main()
