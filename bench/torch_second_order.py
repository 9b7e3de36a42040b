#!/usr/bin/env python3
"""PyTorch's side of dyngrad-second-order-bench (bench/second_order_bench.cpp): the same workloads, sizes and timing.

  hvp_mlp         torch.autograd.grad(loss, w, create_graph=True), then torch.autograd.grad(<g, v>, w): double backward
  hvp_mlp_func    torch.func.jvp(torch.func.grad(f), (w,), (v,)): forward-over-reverse, the recipe torch.func recommends
  pinn_step       the 1-D Poisson PINN step: u'' by two create_graph grads, the residual and boundary loss, Adam
                  (fused=True on CUDA: PyTorch's fastest Adam)

Float32, TF32 off. Timing: warm-up iterations, a 3-iteration probe sizes K (a repetition lasts >= 20 ms, K in
[3, 100]), R repetitions of K iterations, each from a synchronised device to torch.cuda.synchronize(); the figure is
the median over repetitions of ms per iteration. Before timing, the two H·v recipes are checked against each other.

  python3 bench/torch_second_order.py [--device cuda] [--width 1024] [--batch 256] [--points 4096] [--hidden 128]
                                      [--repetitions 7] [--json FILE] [--quick]
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def settle(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(body, device, repetitions, quick):
    for _ in range(2 if quick else 5):
        body()
    settle(device)

    def ms_of(k):
        start = time.perf_counter()
        for _ in range(k):
            body()
        settle(device)
        return (time.perf_counter() - start) * 1e3

    probe = ms_of(3) / 3
    iterations = min(max(int(math.ceil(20.0 / max(probe, 1e-3))), 3), 5 if quick else 100)
    samples = [ms_of(iterations) / iterations for _ in range(repetitions)]
    return {"ms": statistics.median(samples), "iterations_per_repetition": iterations, "samples_ms": samples}


def make_mlp(width, batch, device, seed):
    gen = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(width)
    weights = []
    for out in (width, width, width, 10):
        weights.append(((torch.rand(out, width, generator=gen) * 2 - 1) * bound).to(device).requires_grad_())
        weights.append(((torch.rand(out, generator=gen) * 2 - 1) * bound).to(device).requires_grad_())
    direction = [torch.randn(w.shape, generator=gen).to(device) for w in weights]
    x = torch.randn(batch, width, generator=gen).to(device)
    labels = torch.tensor([(i * 7 + 3) % 10 for i in range(batch)], device=device)
    return weights, direction, x, labels


def mlp_loss(w, x, labels):
    h = x
    for layer in range(3):
        h = torch.tanh(F.linear(h, w[2 * layer], w[2 * layer + 1]))
    return F.cross_entropy(F.linear(h, w[6], w[7]), labels)


def hvp_double_backward(w, v, x, labels):
    loss = mlp_loss(w, x, labels)
    g = torch.autograd.grad(loss, w, create_graph=True)
    dot = sum((gi * vi).sum() for gi, vi in zip(g, v))
    return torch.autograd.grad(dot, w)


def hvp_func(w, v, x, labels):
    detached = tuple(t.detach() for t in w)
    f = lambda params: mlp_loss(params, x, labels)  # noqa: E731
    return torch.func.jvp(torch.func.grad(f), (detached,), (tuple(v),))[1]


class Pinn(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                       torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


def make_pinn(hidden, points, device):
    torch.manual_seed(7)
    model = Pinn(hidden).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    xs = torch.tensor([0.02 + 0.96 * i / (points - 1) for i in range(points)], device=device).reshape(points, 1)
    f = -math.pi ** 2 * torch.sin(math.pi * xs)
    boundary = torch.tensor([[0.0], [1.0]], device=device)

    def step():
        x = xs.clone().requires_grad_()
        u = model(x)
        du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
        d2u = torch.autograd.grad(du.sum(), x, create_graph=True)[0]
        residual = d2u - f
        ub = model(boundary)
        loss = (residual * residual).mean() + 100.0 * (ub * ub).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--points", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    w, v, x, labels = make_mlp(args.width, args.batch, device, 11)
    a = hvp_double_backward(w, v, x, labels)
    rows, func_error = [], None
    try:
        b = hvp_func(w, v, x, labels)
        scale = max(t.abs().max().item() for t in a)
        difference = max((s - t).abs().max().item() for s, t in zip(a, b)) / scale
        print(f"check: double backward against torch.func jvp(grad): {difference:.2e}")
        if difference > 1e-4:
            raise SystemExit(f"the two H·v recipes disagree: {difference}")
    except (RuntimeError, NotImplementedError) as e:  # torch.func may not cover an op: report, time the rest
        func_error = f"{type(e).__name__}: {e}"
        print(f"torch.func: {func_error}")
    mlp = f"MLP {args.width}x4 (tanh), batch {args.batch}, cross-entropy, f32"
    rows.append({"workload": "hvp_mlp", "description": "H·v by double backward, " + mlp,
                 **time_it(lambda: hvp_double_backward(w, v, x, labels), device, args.repetitions, args.quick)})
    if func_error is None:
        rows.append({"workload": "hvp_mlp_func", "description": "torch.func jvp(grad), " + mlp,
                     **time_it(lambda: hvp_func(w, v, x, labels), device, args.repetitions, args.quick)})
    else:
        rows.append({"workload": "hvp_mlp_func", "description": "torch.func jvp(grad), " + mlp, "error": func_error})
    step = make_pinn(args.hidden, args.points, device)
    rows.append({"workload": "pinn_step",
                 "description": f"1-D Poisson PINN step: MLP 1-{args.hidden}-{args.hidden}-{args.hidden}-1 (tanh), "
                                f"{args.points} points, u'' by two create_graph grads, Adam (fused on CUDA)",
                 **time_it(step, device, args.repetitions, args.quick)})
    print(f"pinn loss after the timed steps: {step().item():.6g}")
    for row in rows:
        print(f"{row['workload']:<12} {row.get('ms', float('nan')):10.4f} ms  ({row['description']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "torch_second_order.py", "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "settings": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
