#!/usr/bin/env python3
"""PyTorch on CUDA tensors through ringleader, for scripts/gpu-visit.sh (issue 50, point 7).

    python3 gpu_torch_check.py ddp BACKEND [--steps N]
        One rank of a DDP job on CUDA tensors (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
        LOCAL_RANK from torchrun, a ringleader command job or the visit). BACKEND is
        `ringleader` (ringleader's ring for CPU tensors with torch's NCCL for CUDA ones:
        `init_process_group("cpu:ringleader,cuda:nccl")`) or `nccl` (torch's alone). The
        rank on device LOCAL_RANK prints, after the timed steps,
        `torch ddp backend=B rank=R world=N device=cuda:D samples_per_s=X loss=L`.
    python3 gpu_torch_check.py elastic
        A rank of an elastic command job (`[elastic] protocol = "ringleader"`) training a small
        MLP on CUDA tensors with `ringleader.torch`: each step prints
        `elastic step=S gen=G rank=R world=N pid=P device=cuda:D`, the end `finished ...`.
    python3 gpu_torch_check.py commit [--steps N]
        The elastic optimizer's in-memory commit of an MLP with Adam on GPU 0, two ways
        (issue 50, point 6): in pinned host memory copied on a side stream (what
        `ringleader.torch` does) and on the device (a clone per commit, as it did before).
        Prints `torch commit where=host|device device=cuda:0 state_mb=S device_mb_added=M
        step_ms=T step_ms_plain=P`: the device memory the two commits add, and a step's time
        with a commit after it beside one without.
    python3 gpu_torch_check.py local-rank
        A rank of a command job: prints `local-rank rank=R local_rank=L visible=V device=D`
        after `torch.cuda.set_device(LOCAL_RANK)` worked (the torchrun convention).
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

BATCH = 256
FEATURES = 784
CLASSES = 10


def net():
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, CLASSES))


def ddp(backend: str, steps: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    if backend == "ringleader":
        import ringleader.torch  # noqa: F401  (registers the backend)
        dist.init_process_group("cpu:ringleader,cuda:nccl")
    elif backend == "nccl":
        dist.init_process_group("nccl")
    else:
        raise SystemExit(f"backend: ringleader or nccl, not {backend!r}")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(net().to(dev), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randn(BATCH, FEATURES, device=dev, generator=g)
    y = torch.randint(0, CLASSES, (BATCH,), device=dev, generator=g)
    loss = torch.zeros((), device=dev)

    def step():
        nonlocal loss
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    # The same parameters on every rank: DDP averaged the gradients.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    check = flat.sum().reshape(1)
    dist.all_reduce(check, op=dist.ReduceOp.MAX)
    same = bool(torch.isclose(check, flat.sum().reshape(1)).item())
    print(f"torch ddp backend={backend} rank={rank} world={world} device=cuda:{local} "
          f"samples_per_s={steps * BATCH * world / wall:.1f} loss={loss.item():.4f} "
          f"same_params={same}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def elastic() -> None:
    import ringleader.torch as rlt

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(8192, FEATURES, generator=g)
    ys = torch.randint(0, CLASSES, (8192,), generator=g)
    data = torch.utils.data.TensorDataset(xs, ys)
    rlt.init()
    sampler = rlt.ElasticSampler(len(data), batch_size=BATCH, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    model = rlt.DistributedDataParallel(net().to(dev))
    opt = rlt.ElasticOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                               model=model, sampler=sampler)
    steps = int(os.environ.get("STEPS", "300"))
    step_sleep = float(os.environ.get("STEP_SLEEP_S", "0.05"))
    pid = os.getpid()
    for _ in sampler.epochs(1000):
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            time.sleep(step_sleep)
            print(f"elastic step={opt.steps} gen={rlt.generation()} rank={rlt.rank()} "
                  f"world={rlt.world_size()} pid={pid} device=cuda:{local}", flush=True)
            if opt.steps >= steps:
                print(f"finished steps={opt.steps} pid={pid}", flush=True)
                return


def commit(steps: int) -> None:
    from ringleader.torch._optimizer import COMMITS_KEPT, _Commit

    class Sampler:  # the commit keeps the sampler's position; none here
        def state(self):
            return (0, 0)

    dev = torch.device("cuda:0")
    model = net().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, FEATURES, device=dev)
    y = torch.randint(0, CLASSES, (BATCH,), device=dev)
    params = list(model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def timed(after_step) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            step()
            after_step(i)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    for _ in range(5):
        step()
    plain = timed(lambda i: None)
    state_mb = (sum(p.numel() * p.element_size() for p in params) +
                sum(v.numel() * v.element_size() for st in opt.state.values()
                    for v in st.values() if torch.is_tensor(v))) / 2**20
    # On the host, pinned, copied on a side stream (ringleader.torch's commit).
    commits = [_Commit() for _ in range(COMMITS_KEPT)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)

    def host_commit(i):
        commits[i % COMMITS_KEPT].fill(i, params, len(params), opt, params, Sampler(), [1e-3])
        commits[i % COMMITS_KEPT].hold_writes()

    host = timed(host_commit)
    added = (torch.cuda.memory_allocated(dev) - base) / 2**20
    print(f"torch commit where=host device=cuda:0 state_mb={state_mb:.1f} "
          f"device_mb_added={added:.1f} step_ms={host:.2f} step_ms_plain={plain:.2f}", flush=True)
    # On the device: a clone of every state tensor per commit, as before.
    kept = []
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)

    def device_commit(i):
        kept.append([p.detach().clone() for p in params] +
                    [v.detach().clone() for st in opt.state.values() for v in st.values()
                     if torch.is_tensor(v)])
        del kept[:-COMMITS_KEPT]

    device = timed(device_commit)
    added = (torch.cuda.memory_allocated(dev) - base) / 2**20
    print(f"torch commit where=device device=cuda:0 state_mb={state_mb:.1f} "
          f"device_mb_added={added:.1f} step_ms={device:.2f} step_ms_plain={plain:.2f}",
          flush=True)


def local_rank() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    name = torch.cuda.get_device_name(local)
    print(f"local-rank rank={os.environ.get('RANK')} local_rank={local} "
          f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} device={name!r}", flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    mode = sys.argv[1]
    if mode == "ddp":
        steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 50
        ddp(sys.argv[2], steps)
    elif mode == "elastic":
        elastic()
    elif mode == "commit":
        commit(int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 50)
    elif mode == "local-rank":
        local_rank()
    else:
        raise SystemExit(f"mode: ddp, elastic, commit or local-rank, not {mode!r}")


if __name__ == "__main__":
    main()
