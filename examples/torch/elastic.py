"""An elastic PyTorch DDP script: the book's (docs/book/src/guide/pytorch.md) on a small MLP and
generated data. Run it as `ringleader submit examples/jobs/torch-elastic.toml` (a command job
with `[elastic] protocol = "ringleader"`): a rank lost on the way (its process killed, its host
gone) costs the survivors the step in flight, and they go on from their own memory; a member
that comes back joins at the next generation. Under torchrun, or alone, it trains as plain DDP.
"""

import torch
import torch.nn.functional as F

import ringleader
import ringleader.torch as rlt

# Generated data: the class is the sign of the sum of the first half of the features.
torch.manual_seed(0)
torch.set_num_threads(1)  # three ranks may share one machine
x_all = torch.randn(8192, 16, generator=torch.Generator().manual_seed(1))
dataset = torch.utils.data.TensorDataset(x_all, (x_all[:, :8].sum(1) > 0).long())
net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))

rlt.init()  # instead of init_process_group
sampler = rlt.ElasticSampler(len(dataset), batch_size=32, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
model = rlt.DistributedDataParallel(net)  # instead of torch's DDP
opt = rlt.ElasticOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model=model, sampler=sampler)
for epoch in sampler.epochs(200):
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        ringleader.metric("loss", loss.item(), opt.steps)
