"""Speed from Python (issue 14): host overhead per op against the C++ figure, and training steps against
PyTorch eager from Python, in one run on one machine.

    python python/bench/bench_python.py --device cuda --json bench_python.json [--cpp-json perf.json]

1. Host overhead: a chain x <- x + c of --chain ops on one-element tensors, x requiring grad, as
   bench/perf.cpp's host_overhead(): host microseconds per recorded op (on a GPU the clock stops before the
   device is synchronised: launches are asynchronous) and per node of the backward. --cpp-json reads the C++
   figures from `dyngrad-perf --json` to print the difference (target: <= 1.5 us above C++).
2. Training steps: lenet5 and the 784-256-256-10 MLP at batch 64, forward + cross-entropy + backward +
   SGD(momentum 0.9) step, dyngrad from Python against PyTorch eager from Python (same model, same data):
   ms per step, median over --reps repetitions of --steps steps, each timed from a synchronised device to
   the synchronisation after its last step. Target: dyngrad >= 3x faster.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import dyngrad as dg
import dyngrad.functional as F


def median_time(fn, reps):
    samples = []
    for r in range(reps + 1):  # repetition 0 warms up
        value = fn()
        if r:
            samples.append(value)
    return statistics.median(samples)


def chain_timer(leaf, c, sync, chain):
    """Host us per op of a chain y <- y + c from leaf(), and per node of its backward."""
    def run():
        y = leaf()
        start = time.perf_counter()
        for _ in range(chain):
            y = y + c
        record = time.perf_counter() - start
        sync()
        start = time.perf_counter()
        y.backward()
        back = time.perf_counter() - start
        sync()
        return record * 1e6 / chain, back * 1e6 / chain

    return run


def dyngrad_chain(device, chain):
    sync = (lambda: None) if device == "cpu" else dg.synchronize
    return chain_timer(lambda: dg.ones(1, device=device, requires_grad=True), dg.ones(1, device=device), sync, chain)


def torch_chain(torch, device, chain):
    sync = (lambda: None) if device == "cpu" else torch.cuda.synchronize
    return chain_timer(lambda: torch.ones(1, device=device, requires_grad=True), torch.ones(1, device=device), sync,
                       chain)


def chain_medians(run, reps):
    pairs = [run() for _ in range(reps + 1)][1:]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def dyngrad_step(name, device, batch, steps):
    dg.manual_seed(0)
    model = (dg.models.LeNet5() if name == "lenet5" else dg.models.MLP((784, 256, 256, 10))).to(device)
    opt = dg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = dg.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), device=device)
    y = dg.tensor(rng.integers(0, 10, batch), device=device)

    def run():
        dg.synchronize() if device != "cpu" else None
        start = time.perf_counter()
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if device != "cpu":
            dg.synchronize()
        return (time.perf_counter() - start) * 1e3 / steps

    return run


def torch_step(torch, name, device, batch, steps):
    torch.manual_seed(0)
    tnn = torch.nn
    if name == "lenet5":
        model = tnn.Sequential(tnn.Conv2d(1, 6, 5), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Conv2d(6, 16, 5), tnn.ReLU(),
                               tnn.MaxPool2d(2), tnn.Flatten(), tnn.Linear(256, 120), tnn.ReLU(), tnn.Linear(120, 10))
    else:
        model = tnn.Sequential(tnn.Flatten(), tnn.Linear(784, 256), tnn.ReLU(), tnn.Linear(256, 256), tnn.ReLU(),
                               tnn.Linear(256, 10))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def run():
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3 / steps

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if dg.cuda_is_available() else "cpu")
    parser.add_argument("--chain", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default="")
    parser.add_argument("--cpp-json", default="", help="dyngrad-perf --json output for the C++ host overhead")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("PyTorch not installed: dyngrad figures only")
    device = "cuda:0" if args.device == "cuda" else args.device
    result = {"device": device, "chain": args.chain, "steps": args.steps, "reps": args.reps}

    rec, back = chain_medians(dyngrad_chain(device, args.chain), args.reps)
    result["python_record_us_per_op"], result["python_backward_us_per_node"] = rec, back
    print(f"host overhead from Python ({device}, chain of {args.chain} adds): record {rec:.3f} us/op, "
          f"backward {back:.3f} us/node")
    if args.cpp_json:
        with open(args.cpp_json) as f:
            host = json.load(f).get("host_overhead", {})
        key = "cpu_record_us_per_op" if device == "cpu" else "cuda_record_host_us_per_op"
        if key in host:
            result["cpp_record_us_per_op"] = host[key]
            result["python_minus_cpp_us"] = rec - host[key]
            print(f"  C++ (dyngrad-perf): {host[key]:.3f} us/op -> Python adds {rec - host[key]:.3f} us/op "
                  f"(target <= 1.5): {'met' if rec - host[key] <= 1.5 else 'NOT met'}")
    if torch is not None:
        trec, tback = chain_medians(torch_chain(torch, device, args.chain), args.reps)
        result["torch_record_us_per_op"], result["torch_backward_us_per_node"] = trec, tback
        print(f"  PyTorch eager from Python: record {trec:.3f} us/op, backward {tback:.3f} us/node")

    result["steps_ms"] = {}
    for name in ("lenet5", "mlp"):
        ms = median_time(dyngrad_step(name, device, 64, args.steps), args.reps)
        row = {"dyngrad_ms": ms}
        line = f"{name} b64 training step: dyngrad {ms:.4f} ms"
        if torch is not None:
            tms = median_time(torch_step(torch, name, device, 64, args.steps), args.reps)
            row.update(torch_ms=tms, speedup=tms / ms)
            line += f", PyTorch eager {tms:.4f} ms, {tms / ms:.2f}x (target >= 3x: {'met' if tms / ms >= 3 else 'NOT met'})"
        result["steps_ms"][name] = row
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
