#!/usr/bin/env python3
"""PyTorch DDP and FSDP2 (NCCL) on dyngrad-dist-bench's workloads, for scripts/run-dist-bench.sh.

    torchrun --standalone --nproc-per-node N bench/torch_ddp.py [--steps 30] [--warmup 5] [--repeats 5]
        [--only mlp|lenet|gpt|allreduce] [--fsdp] [--gradient-as-bucket-view]

Per GPU: mlp4096x4 (4 linear layers 4096->4096, ReLU between, batch 4096) in f32 and TF32, lenet (conv 1->20,
pool, conv 20->50, pool, linear 800->500, ReLU, linear 500->10) on (256,1,28,28); SGD momentum 0.9,
cross-entropy; gpt_char_bf16: bench/torch_gpt.py's character GPT (6 layers, 6 heads, width 384, context 256,
vocabulary 96, no dropout) on random tokens, batch 32, under bf16 autocast, AdamW. World 1: the plain model (no DDP), as dyngrad's baseline; world N: DDP with its default buckets
(overlap=1) and with the all-reduce after the backward (overlap=0: no_sync for the backward, then one
all-reduce per parameter-sized bucket through torch.distributed, the same schedule dyngrad's overlap=0 runs).
Also all_reduce bandwidth by message size. --fsdp runs instead, per workload, DDP with AdamW (mode=ddp
optim=adamw) and FSDP2 (mode=fsdp2: torch.distributed.fsdp.fully_shard on each GPT block, then on the root; the
MLP and lenet as one root unit, as dyngrad's ZeRO-3 units). peak_mib: torch.cuda.max_memory_allocated over the
row, reset before it. --gradient-as-bucket-view: DDP's option of that name (dyngrad-dist-bench has the same flag).
Prints the same lines as dyngrad-dist-bench (rank 0).
"""
import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402  (the character GPT, as samples/char_gpt.cpp builds it)

GPT_VOCABULARY, GPT_CONTEXT = 96, 256


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


def char_gpt():
    config = argparse.Namespace(model="char", layers=6, heads=6, width=384, context=GPT_CONTEXT, dropout=0.0)
    return torch_gpt.build_model(GPT_VOCABULARY, config)


def images(sample):
    def make(batch, gen):
        x = torch.rand((batch, *sample), generator=gen) * 2 - 1
        return x, torch.randint(0, 10, (batch,), generator=gen)
    return make


def tokens(batch, gen):
    windows = torch.randint(0, GPT_VOCABULARY, (batch, GPT_CONTEXT + 1), generator=gen)
    return windows[:, :-1].contiguous(), windows[:, 1:].reshape(-1)


def loss_of(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y)


def fsdp2(model):
    """fully_shard on each GPT block, then on the root (the MLP and lenet: the root only)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5 kept it under _composable
        from torch.distributed._composable.fsdp import fully_shard
    for block in getattr(model, "blocks", []):
        fully_shard(block)
    return fully_shard(model)


DDP_OPTIONS = {}  # from the command line (main)


def step_bench(w, mode, adamw, overlap, world, rank, device, steps, warmup, repeats):
    """mode: ddp (the plain model at world 1) or fsdp2."""
    name, make, data, batch, tf32, autocast = w[:6]
    gc.collect()  # the previous row's model and optimizer (DDP holds reference cycles) leave before the peak resets
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(1)
    model = make().to(device)
    wrapped = model
    if mode == "fsdp2":
        wrapped = model = fsdp2(model)
    elif world > 1:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index], **DDP_OPTIONS)
    if adamw:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = data(batch, gen)
    x, y = x.to(device), y.to(device)

    def loss():
        with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
            return loss_of(wrapped(x), y)

    def one_step():
        if mode == "ddp" and world > 1 and not overlap:
            with wrapped.no_sync():
                loss().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        else:
            loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        one_step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    windows = []  # as dyngrad-dist-bench: `repeats` windows, the median reported with the fastest and slowest
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            one_step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1000 / steps
        if world > 1:
            t = torch.tensor([ms], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            ms = t.item()
        windows.append(ms)
    windows.sort()
    ms = windows[len(windows) // 2]
    if rank == 0:
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
        print(f"step model={name} world={world} mode={mode} optim={'adamw' if adamw else 'sgd'} "
              f"overlap={int(overlap) if world > 1 and mode == 'ddp' else 0} batch_per_gpu={batch} "
              f"step_ms={ms:.4f} step_ms_min={windows[0]:.4f} step_ms_max={windows[-1]:.4f} samples_per_s={1000.0 * batch * world / ms:.1f} peak_mib={peak_mib:.1f}", flush=True)


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
    parser.add_argument("--repeats", type=int, default=5, help="timed windows of --steps steps; the median is reported")
    parser.add_argument("--only", choices=["mlp", "lenet", "gpt", "allreduce"])
    parser.add_argument("--fsdp", action="store_true", help="DDP with AdamW and FSDP2 rows instead of the DDP rows")
    parser.add_argument("--gradient-as-bucket-view", action="store_true", help="DDP(gradient_as_bucket_view=True)")
    a = parser.parse_args()
    DDP_OPTIONS["gradient_as_bucket_view"] = a.gradient_as_bucket_view
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    grouped = world > 1 or a.fsdp  # FSDP2 needs a process group even on one GPU
    if grouped:
        dist.init_process_group("nccl", device_id=device)
    if rank == 0:
        print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{torch.cuda.get_device_name(device)}, world {world}", flush=True)
    # name, model, data, batch per GPU, TF32, autocast dtype, AdamW in the DDP rows
    workloads = [("mlp4096x4_f32", mlp, images((4096,)), 4096, False, None, False),
                 ("mlp4096x4_tf32", mlp, images((4096,)), 4096, True, None, False),
                 ("lenet_b256", lenet, images((1, 28, 28)), 256, False, None, False),
                 ("gpt_char_bf16", char_gpt, tokens, 32, False, torch.bfloat16, True)]
    for w in workloads:
        if a.only and not w[0].startswith(a.only):
            continue
        if a.fsdp:
            step_bench(w, "ddp", True, True, world, rank, device, a.steps, a.warmup, a.repeats)
            step_bench(w, "fsdp2", True, False, world, rank, device, a.steps, a.warmup, a.repeats)
            continue
        step_bench(w, "ddp", w[6], True, world, rank, device, a.steps, a.warmup, a.repeats)
        if world > 1:
            step_bench(w, "ddp", w[6], False, world, rank, device, a.steps, a.warmup, a.repeats)
    if not a.fsdp and a.only in (None, "allreduce"):
        allreduce_bench(world, rank, device)
    if grouped:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
