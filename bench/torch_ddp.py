#!/usr/bin/env python3
"""PyTorch DDP (NCCL) on dyngrad-dist-bench's workloads, for scripts/run-dist-bench.sh.

    torchrun --standalone --nproc-per-node N bench/torch_ddp.py [--steps 30] [--warmup 5]

Per GPU: mlp4096x4 (4 linear layers 4096->4096, ReLU between, batch 4096) in f32 and TF32, lenet (conv 1->20,
pool, conv 20->50, pool, linear 800->500, ReLU, linear 500->10) on (256,1,28,28); SGD momentum 0.9,
cross-entropy. World 1: the plain model (no DDP), as dyngrad's baseline; world N: DDP with its default buckets
(overlap=1) and with the all-reduce after the backward (overlap=0: no_sync for the backward, then one
all-reduce per parameter-sized bucket through torch.distributed, the same schedule dyngrad's overlap=0 runs).
Also all_reduce bandwidth by message size. Prints the same lines as dyngrad-dist-bench (rank 0).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    layers = []
    for i in range(4):
        layers.append(nn.Linear(4096, 4096))
        if i < 3:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def lenet():
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))


def step_bench(name, make, sample, batch, tf32, overlap, world, rank, device, steps, warmup):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    model = make().to(device)
    wrapped = model
    if world > 1:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    x = (torch.rand((batch, *sample), generator=gen) * 2 - 1).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)

    def one_step():
        if world > 1 and not overlap:
            with wrapped.no_sync():
                F.cross_entropy(wrapped(x), y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        else:
            F.cross_entropy(wrapped(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        one_step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1000 / steps
    if world > 1:
        t = torch.tensor([ms], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        ms = t.item()
    if rank == 0:
        print(f"step model={name} world={world} overlap={int(overlap) if world > 1 else 0} batch_per_gpu={batch} "
              f"step_ms={ms:.4f} samples_per_s={1000.0 * batch * world / ms:.1f}", flush=True)


def allreduce_bench(world, rank, device, steps=20):
    if world < 2:
        return
    size = 1 << 16
    while size <= 1 << 30:
        t = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1000 / steps
        algbw = size / (ms * 1e6)
        if rank == 0:
            print(f"allreduce bytes={size} world={world} ms={ms:.4f} algbw_GBps={algbw:.2f} "
                  f"busbw_GBps={algbw * 2 * (world - 1) / world:.2f}", flush=True)
        size *= 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", choices=["mlp", "lenet", "allreduce"])
    a = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    if rank == 0:
        print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{torch.cuda.get_device_name(device)}, world {world}", flush=True)
    workloads = [("mlp4096x4_f32", mlp, (4096,), 4096, False), ("mlp4096x4_tf32", mlp, (4096,), 4096, True),
                 ("lenet_b256", lenet, (1, 28, 28), 256, False)]
    for name, make, sample, batch, tf32 in workloads:
        if a.only and not name.startswith(a.only):
            continue
        step_bench(name, make, sample, batch, tf32, True, world, rank, device, a.steps, a.warmup)
        if world > 1:
            step_bench(name, make, sample, batch, tf32, False, world, rank, device, a.steps, a.warmup)
    if a.only in (None, "allreduce"):
        allreduce_bench(world, rank, device)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
