"""An unmodified-style PyTorch DDP script, as torchrun would run it.

It reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment (torch's `env://`
rendezvous), trains a small MLP on synthetic data with DistributedDataParallel over Gloo, and
prints `ringleader-metric` lines so the job's metrics show the loss. Run it with
`ringleader submit examples/jobs/torch-ddp.toml` (or under torchrun: nothing here is
ringleader-specific except the metric lines).
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(512, 64, generator=gen)
    y = (x[:, :10].argmax(dim=1))
    steps = int(os.environ.get("STEPS", "50"))
    for step in range(1, steps + 1):
        idx = torch.randint(0, x.shape[0], (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"ringleader-metric loss {loss.item():.6f} {step}", flush=True)
    # Every rank holds the same parameters after DDP's allreduce.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    check = flat.clone()
    dist.all_reduce(check)
    assert torch.allclose(check / world, flat), "ranks diverged"
    if rank == 0:
        print(f"ringleader-metric world_size {world}", flush=True)
        print(f"ddp ok: rank {rank} of {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
