# ZeRO-3 from Python: `mpirun -np 2 python guide_zero3.py` shards a small transformer's parameters, gradients and
# AdamW state over two ranks, unit by unit (each unit gathered for its forward and again for its recomputed
# backward); run alone it is a group of one.
import numpy as np

import dyngrad as dg
import dyngrad.distributed as dist
from dyngrad import nn

dist.init_process_group()
try:
    rank, world = dist.get_rank(), dist.get_world_size()
    dg.manual_seed(0)
    units = [dist.ZeroUnit("embed", nn.Linear(4, 32))]
    units += [dist.ZeroUnit(f"block{i}", nn.TransformerBlock(32, 4)) for i in range(2)]
    units += [dist.ZeroUnit("head", nn.Linear(32, 1))]
    opt = dist.ZeroOptimizer(units, lr=3e-3, weight_decay=0.01)  # stage 3: rank 0's weights, sharded

    rng = np.random.default_rng(rank)  # each rank draws its own part of every batch
    steps = np.arange(1, 17, dtype=np.float32)[:, None]
    losses = []
    for step in range(80):
        x = rng.standard_normal((8, 16, 4)).astype(np.float32)
        y = np.cumsum(x[..., :1], axis=1) / steps  # the running mean of the first feature: causal attention's task
        loss = ((opt(dg.tensor(x)) - dg.tensor(y)) ** 2).mean()
        loss.backward()  # each unit: gathered, recomputed, its gradients reduce-scattered into this rank's shard
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    memory = opt.memory()  # per-rank bytes: the shards, not the model
    assert memory["parameter_bytes"] == memory["formula_parameter_bytes"]
    full = opt.full_parameters()  # all-gathered (every rank calls it); the model itself stays sharded
    if rank == 0:
        print(f"loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}; {len(full)} tensors, "
              f"{memory['parameters']} parameters, {memory['parameter_bytes']} bytes of them on this rank")
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), losses
finally:
    dist.destroy_process_group()
