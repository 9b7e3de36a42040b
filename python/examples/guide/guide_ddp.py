# Data-parallel training from Python: `mpirun -np 2 python guide_ddp.py` runs it on two ranks (CPU tensors
# through MPI); run alone it is a group of one, where every collective is a copy.
import numpy as np

import dyngrad as dg
import dyngrad.distributed as dist
from dyngrad import nn
from dyngrad.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group()
try:
    rank, world = dist.get_rank(), dist.get_world_size()
    dg.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)))  # rank 0's weights everywhere
    opt = dg.optim.SGD(model.parameters(), lr=0.05)

    rng = np.random.default_rng(0)  # the same data set on every rank; the loader gives each rank its shard
    x = rng.standard_normal((512, 4)).astype(np.float32)
    y = x @ np.array([[0.5], [-1.0], [2.0], [0.25]], dtype=np.float32)
    data = dg.data.TensorDataset(dg.tensor(x), dg.tensor(y))
    loader = dg.data.DataLoader(data, batch_size=32, shuffle=True, num_shards=world, shard=rank)

    losses = []
    for epoch in range(8):
        total = dg.zeros(1)
        for xb, yb in loader:
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()  # the gradients are averaged across the ranks during the backward
            opt.step()
            opt.zero_grad()
            total += loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the epoch's loss, the same on every rank
        losses.append(total.item() / len(loader))
    if rank == 0:
        print("epoch losses", [round(v, 4) for v in losses])
    assert losses[-1] < 0.25 * losses[0], losses
finally:
    dist.destroy_process_group()
