#!/usr/bin/env python3
"""PyTorch side of dyngrad's performance comparison (issue 7): the workloads of bench/perf.cpp with the same
measurement, and a time-to-accuracy run that mirrors `dyngrad-train --target-accuracy`.

    python3 bench/torch_reference.py --json torch.json                # every workload, eager and captured
    python3 bench/torch_reference.py --only lenet5_b64,matmul_relu --quick
    python3 bench/torch_reference.py --time-to-accuracy --data DIR --json torch_tta.json [--compile]

Needs only torch and the standard library. The epoch order of dyngrad's BatchLoader (core/dataset.cpp
epoch_permutation: std::seed_seq, std::mt19937_64 and its bounded() draw, all fully specified by the C++
standard) is reimplemented here in plain Python; it is importable without torch (tests/data/check_epoch_order.py
compares it with the C++ one).

Measurement (as in bench/perf.cpp): W warm-up steps; a probe of 3 steps sizes K, the steps of one
repetition, so a repetition lasts at least 20 ms (K in [10, 200]); R repetitions, each timed by the host
clock from a synchronised device to the return of torch.cuda.synchronize() after its K steps; the figure is
the median over R of (repetition time / K). Peak memory: synchronize, reset_peak_memory_stats, one step,
synchronize, max_memory_allocated(): absolute (parameters, optimizer state, inputs included).

PyTorch allocates its cuBLAS and cuBLASLt workspaces (tens of MiB per stream) through its caching allocator,
so they count in max_memory_allocated(); cuBLAS allocates dyngrad's by itself, outside dyngrad's allocator.
Between workloads the cached blocks and those workspaces are released, so no workload carries another's.

Modes: eager runs the step as written; captured is torch.cuda.graphs capture as the PyTorch documentation
shows it for a whole network (warm-up on a side stream, capture of one step on static inputs, replay after
copying the new inputs into them), the counterpart of dyngrad's cuda::CapturedStep; compiled runs the step with
torch.compile (Inductor) applied to the forward + loss (hence the backward, through AOTAutograd) and to the
optimizer update, compiled before the clock starts (compile_s in the JSON); compiled_captured is that compiled
step captured and replayed like captured (issue 17's anchor: the highest a PyTorch user can reach).

Settings that make the two sides compute the same thing: float32 without TF32 for convolutions and GEMMs
(except mlp4096_tf32, TF32 for both); cudnn.benchmark on by default because dyngrad times cuDNN's algorithms
too (cudnnFind*AlgorithmEx) and caches the fastest per shape (--no-cudnn-benchmark: PyTorch's heuristics).
Weights: kaiming_uniform with the ReLU gain (bound sqrt(6 / fan_in)) and zero biases, dyngrad's own
initialisation family (nn/layers.h); the values differ, the random generators do. For the time-to-accuracy run,
--init-from FILE loads the exact initial weights `dyngrad-train --epochs 0 --save FILE` wrote (safetensors,
read here without third-party packages; scripts/run-perf.sh does this), so both sides start from the same
point and differ only in floating-point rounding (cuDNN's algorithms differ).
"""
import argparse
import gc
import gzip
import json
import math
import os
import statistics
import struct
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the epoch order below needs no torch
    torch = None

# ---- dyngrad's epoch order, bit for bit ----

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF


def seed_seq_generate(values, count):
    """std::seed_seq(values).generate() of `count` 32-bit words ([rand.util.seedseq])."""
    v = [x & MASK32 for x in values]
    s, n = len(v), count
    out = [0x8B8B8B8B] * n
    if n == 0:
        return out
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x):
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * mix(out[k % n] ^ out[(k + p) % n] ^ out[(k - 1) % n])) & MASK32
        if k == 0:
            r2 = r1 + s
        elif k <= s:
            r2 = r1 + k % n + v[k - 1]
        else:
            r2 = r1 + k % n
        r2 &= MASK32
        out[(k + p) % n] = (out[(k + p) % n] + r1) & MASK32
        out[(k + q) % n] = (out[(k + q) % n] + r2) & MASK32
        out[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * mix((out[k % n] + out[(k + p) % n] + out[(k - 1) % n]) & MASK32)) & MASK32
        r4 = (r3 - k % n) & MASK32
        out[(k + p) % n] ^= r3
        out[(k + q) % n] ^= r4
        out[k % n] = r4
    return out


class MT19937_64:
    """std::mt19937_64 ([rand.eng.mers], [rand.predef]) seeded from a std::seed_seq."""

    N, M, R = 312, 156, 31
    A = 0xB5026F5AA96619E9
    UPPER = (MASK64 << R) & MASK64
    LOWER = (1 << R) - 1

    def __init__(self, seed_values):
        words = seed_seq_generate(seed_values, 2 * self.N)
        self.state = [words[2 * i] | (words[2 * i + 1] << 32) for i in range(self.N)]
        if self.state[0] & self.UPPER == 0 and not any(self.state[1:]):
            self.state[0] = 1 << 63
        self.index = self.N

    def _twist(self):
        st, n, m = self.state, self.N, self.M
        for i in range(n):
            x = (st[i] & self.UPPER) | (st[(i + 1) % n] & self.LOWER)
            st[i] = st[(i + m) % n] ^ (x >> 1) ^ (self.A if x & 1 else 0)
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        y = self.state[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def bounded(engine, n):
    """core/dataset.cpp bounded(): uniform in [0, n), rejecting the low 2^64 mod n draws."""
    threshold = (2**64 - n) % n
    draw = engine()
    while draw < threshold:
        draw = engine()
    return draw % n


def epoch_permutation(n, seed, epoch):
    """core/dataset.cpp epoch_permutation(n, seed, epoch): the sample order of one epoch."""
    seed &= MASK64
    epoch &= MASK64
    engine = MT19937_64([seed & MASK32, seed >> 32, epoch & MASK32, epoch >> 32])
    order = list(range(n))
    for i in range(n, 1, -1):
        j = bounded(engine, i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


# ---- models: samples/models.h in PyTorch ----

def init_like_dyngrad(model):
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_uniform_(module.weight, nonlinearity="relu")
            torch.nn.init.zeros_(module.bias)
    return model


def make_model(name, height=28, width=28, classes=10, default_init=False):
    """The network, initialised like dyngrad (init_like_dyngrad); default_init=True: its layers as PyTorch
    initialised them (a list, for nn.Sequential)."""
    nn = torch.nn
    h2, w2 = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    if name == "lenet5":
        layers = [nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Flatten(), nn.Linear(16 * h2 * w2, 120), nn.ReLU(), nn.Linear(120, classes)]
    elif name == "lenet":
        layers = [nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2), nn.Flatten(),
                  nn.Linear(50 * h2 * w2, 500), nn.ReLU(), nn.Linear(500, classes)]
    elif name == "mlp":
        layers = [nn.Flatten(), *mlp_layers([height * width, 500, classes])]
    else:
        raise ValueError(f"unknown model {name!r}")
    return layers if default_init else init_like_dyngrad(nn.Sequential(*layers))


def mlp_layers(widths):
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    return layers


def make_mlp(widths):
    return init_like_dyngrad(torch.nn.Sequential(*mlp_layers(widths)))


# ---- measurement ----

class Settings:
    def __init__(self, quick):
        self.warmup = 3 if quick else 5
        self.repetitions = 3 if quick else 7
        self.min_repetition_ms = 5.0 if quick else 20.0
        self.min_steps = 3 if quick else 10
        self.max_steps = 20 if quick else 200
        self.probe_steps = 2 if quick else 3
        self.chain = 500 if quick else 2000
        self.chain_repetitions = 3 if quick else 9


def time_steps(body, s):
    for _ in range(s.warmup):
        body()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(s.probe_steps):
        body()
    torch.cuda.synchronize()
    estimate = max((time.perf_counter() - start) * 1e3 / s.probe_steps, 1e-6)
    steps = min(max(math.ceil(s.min_repetition_ms / estimate), s.min_steps), s.max_steps)
    samples = []
    for _ in range(s.repetitions):
        start = time.perf_counter()
        for _ in range(steps):
            body()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3 / steps)
    return statistics.median_high(samples), steps, samples


def step_memory(body):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    body()
    torch.cuda.synchronize()
    return before, torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()


def set_tf32(allow):
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        backends.cuda.matmul.fp32_precision = "tf32" if allow else "ieee"
        backends.cudnn.conv.fp32_precision = "tf32" if allow else "ieee"
    else:
        backends.cuda.matmul.allow_tf32 = allow
        backends.cudnn.allow_tf32 = allow


_side_stream = None


def side_stream():
    """One warm-up stream for every capture: PyTorch keeps a cuBLAS workspace per stream it has run a GEMM on,
    so a new stream per workload would pile workspaces up in the later workloads' memory figures."""
    global _side_stream
    if _side_stream is None:
        _side_stream = torch.cuda.Stream()
    return _side_stream


def release_memory():
    """Drops what the last workload left: cached blocks and the per-stream cuBLAS workspaces."""
    gc.collect()
    torch.cuda.synchronize()
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()


def captured(step, inputs):
    """torch.cuda.graphs capture of step(static inputs); the returned run() copies `inputs` in and replays."""
    static = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    side = side_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step(static)

    def run():
        with torch.no_grad():
            for dst, src in zip(static, inputs):
                dst.copy_(src)
        graph.replay()
        return output

    run.graph = graph  # keeps the graph and its memory pool alive with the closure
    return run


GPU = "cuda"
MUL_ELEMENTS = 64 << 20


def maybe_compile(fn, compiled):
    """torch.compile (Inductor, default mode: fused Triton kernels; the CUDA graph, when wanted, is captured
    around the whole step by captured(), as for the other modes) or the function itself."""
    return torch.compile(fn) if compiled else fn


def training(model, input_shape, classes, compiled=False, precision=None):
    """precision None: float32; torch.bfloat16 / torch.float16: the forward and loss under
    torch.autocast("cuda", precision), float16 with a GradScaler (as dyngrad-perf's *_bf16 / *_f16 rows)."""
    model = model.to(GPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == torch.float16)
    gen = torch.Generator(device="cpu").manual_seed(7)
    x = (torch.rand(input_shape, generator=gen) * 2 - 1).to(GPU)
    y = torch.randint(0, classes, (input_shape[0],), generator=gen).to(GPU)

    def autocast_loss(x, y):
        with torch.autocast("cuda", dtype=precision or torch.float32, enabled=precision is not None):
            return F.cross_entropy(model(x), y)

    # Compiled: the forward with its loss (and so, through AOTAutograd, the backward) and the optimizer update.
    forward_loss = maybe_compile(autocast_loss, compiled)
    update = maybe_compile(optimizer.step, compiled)

    def step(inputs):
        optimizer.zero_grad(set_to_none=True)
        loss = forward_loss(inputs[0], inputs[1])
        if scaler.is_enabled():
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # reads found_inf on the host: PyTorch's f16 step cannot be captured
            scaler.update()
        else:
            loss.backward()
            update()
        return loss

    return [x, y], step


def matmul_relu(compiled=False):
    gen = torch.Generator(device="cpu").manual_seed(42)
    x = torch.rand(100, 100, generator=gen).to(GPU).requires_grad_()
    w = torch.rand(100, 50, generator=gen).to(GPU).requires_grad_()
    forward = maybe_compile(lambda x, w: torch.relu(x @ w).sum(), compiled)

    def step(inputs):
        for t in inputs:
            t.grad = None
        loss = forward(inputs[0], inputs[1])
        loss.backward()  # dx (100,100), dw (100,50)
        return loss

    return [x, w], step


def written_norm_softmax(compiled=False):
    """A layer norm and a softmax written out of pointwise ops and row reductions (bench/perf.cpp's)."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    x = (torch.rand(256, 1024, generator=gen) * 2 - 1).to(GPU).requires_grad_()
    weight = (torch.rand(1024, generator=gen) + 0.5).to(GPU).requires_grad_()
    w = (torch.rand(1024, 16, generator=gen) * 2 - 1).to(GPU).requires_grad_()

    def loss_of(x, weight, w):
        centred = x - x.mean(-1, keepdim=True)
        inverse = ((centred * centred).mean(-1, keepdim=True) + 1e-5).pow(-0.5)
        normed = centred * inverse * weight
        exps = (normed - normed.amax(-1, keepdim=True)).exp()
        probs = exps / exps.sum(-1, keepdim=True)
        return (probs @ w).sum()

    forward = maybe_compile(loss_of, compiled)

    def step(inputs):
        for t in inputs:
            t.grad = None
        loss = forward(inputs[0], inputs[1], inputs[2])
        loss.backward()  # dx, dweight, dw
        return loss

    return [x, weight, w], step


def mul64m(compiled=False):
    gen = torch.Generator(device="cpu").manual_seed(1)
    a = (torch.rand(MUL_ELEMENTS, generator=gen) * 2 - 1).to(GPU).requires_grad_()
    b = (torch.rand(MUL_ELEMENTS, generator=gen) * 2 - 1).to(GPU).requires_grad_()
    dy = (torch.rand(MUL_ELEMENTS, generator=gen) * 2 - 1).to(GPU)
    forward = maybe_compile(lambda a, b: a * b, compiled)

    # a, b, dy are read from the closure as in bench/perf.cpp; the 1-element input only mirrors its key.
    def step(inputs):
        a.grad = None
        b.grad = None
        y = forward(a, b)
        y.backward(dy)  # da = dy*b, db = dy*a
        return y

    return [torch.zeros(1, device=GPU)], step


WIDE = [4096, 4096, 4096, 4096, 4096]
MUL_BYTES = 8 * 4 * MUL_ELEMENTS  # fwd reads a, b, writes y; bwd reads dy, a, b, writes da, db


def workloads():
    """(name, description, prepare, tf32, bytes per step): bench/perf.cpp's list."""
    def model(name, batch):
        return lambda compiled=False: training(make_model(name), (batch, 1, 28, 28), 10, compiled)

    def mlp(widths, batch, precision=None):
        return lambda compiled=False: training(make_mlp(widths), (batch, widths[0]), widths[-1], compiled, precision)

    def reduced_model(name, batch, precision):
        return lambda compiled=False: training(make_model(name), (batch, 1, 28, 28), 10, compiled, precision)

    return [
        ("lenet5_b1", "lenet5, batch 1, SGD step", model("lenet5", 1), False, 0),
        ("lenet5_b64", "lenet5, batch 64, SGD step", model("lenet5", 64), False, 0),
        ("lenet_b256", "lenet, batch 256, SGD step", model("lenet", 256), False, 0),
        ("mlp784_b64", "MLP 784-256-256-10, batch 64, SGD step", mlp([784, 256, 256, 10], 64), False, 0),
        ("mlp4096_fp32", "MLP 4096x4 layers, batch 4096, float32, SGD step", mlp(WIDE, 4096), False, 0),
        ("mlp4096_tf32", "MLP 4096x4 layers, batch 4096, TF32 GEMMs, SGD step", mlp(WIDE, 4096), True, 0),
        ("lenet5_b64_bf16", "lenet5, batch 64, bf16 autocast, SGD step", reduced_model("lenet5", 64, torch.bfloat16),
         False, 0),
        ("mlp4096_bf16", "MLP 4096x4 layers, batch 4096, bf16 autocast, SGD step", mlp(WIDE, 4096, torch.bfloat16),
         False, 0),
        ("mlp4096_f16", "MLP 4096x4 layers, batch 4096, f16 autocast + GradScaler, SGD step",
         mlp(WIDE, 4096, torch.float16), False, 0),
        ("matmul_relu", "x 100x100 @ w 100x50, ReLU, sum, backward (dx, dw)", matmul_relu, False, 0),
        ("mul64m", "a*b of 64M floats, forward + backward", mul64m, False, MUL_BYTES),
        ("written_norm_softmax", "x 256x1024: layer norm and softmax written out, @ w 1024x16, sum, backward",
         written_norm_softmax, False, 0),
    ]


def copy_bandwidth_gbs(s):
    src = torch.zeros(MUL_ELEMENTS, device=GPU)
    dst = torch.empty_like(src)
    ms, _, _ = time_steps(lambda: dst.copy_(src), s)
    return 2.0 * src.numel() * 4 / (ms * 1e6)


MODES = ("eager", "captured", "compiled", "compiled_captured")


def measure(name, description, prepare, tf32, bytes_per_step, mode, s, copy_gbs):
    """One (workload, mode) row. Modes: eager; captured (torch.cuda.graphs around the step); compiled
    (torch.compile of the forward + loss, hence of the backward, and of the optimizer update); compiled_captured
    (that compiled step captured into one CUDA graph and replayed: issue 17's anchor)."""
    row = {"workload": name, "mode": mode, "description": description}
    set_tf32(tf32)
    try:
        inputs, step = prepare(compiled=mode.startswith("compiled"))
        if mode.startswith("compiled"):
            start = time.perf_counter()
            for _ in range(3):  # compiles (forward, backward, update) before the clock starts
                step(inputs)
            torch.cuda.synchronize()
            row["compile_s"] = time.perf_counter() - start
        body = captured(step, inputs) if mode.endswith("captured") else (lambda: step(inputs))
        ms, steps, samples = time_steps(body, s)
        before, peak, reserved = step_memory(body)
        row.update(ms=ms, steps_per_repetition=steps, samples_ms=samples, before_bytes=before, peak_bytes=peak,
                   reserved_bytes=reserved)
        if bytes_per_step:
            row["gbs"] = bytes_per_step / (ms * 1e6)
            row["copy_fraction"] = row["gbs"] / copy_gbs if copy_gbs else 0.0
    except Exception as error:  # a failed workload is reported in its row; the others still run
        row["error"] = f"{type(error).__name__}: {error}"
    finally:
        set_tf32(False)
        inputs = step = body = None
        if mode.startswith("compiled"):
            torch._dynamo.reset()  # the next workload's compiled functions start from a clean cache
        release_memory()
    return row


def profile_one_replay(args):
    """--profile: one captured replay of each --only workload in the first of --modes between
    cudaProfilerStart/Stop, for `ncu --profile-from-start off python3 bench/torch_reference.py --profile ...`
    (per-kernel times of exactly one step, as dyngrad-perf --profile gives for dyngrad's side)."""
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    mode = args.modes[0]
    table = {w[0]: w for w in workloads()}
    for name in [n for n in (args.only or "").split(",") if n]:
        if name not in table:
            sys.exit(f"torch_reference.py: --profile: unknown workload {name!r}")
        _, _, prepare, tf32, _ = table[name]
        set_tf32(tf32)
        inputs, step = prepare(compiled=mode.startswith("compiled"))
        for _ in range(3):
            step(inputs)
        body = captured(step, inputs) if mode.endswith("captured") else (lambda: step(inputs))
        for _ in range(3):
            body()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        body()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"{name}: profiled one {mode} step")
        set_tf32(False)
    return 0


def kernel_counts(args):
    """--kernel-counts: per --only workload and --modes mode (eager, compiled), the CUDA kernels of --kernel-steps
    steps after warm-up, each step profiled alone (torch.profiler, CUPTI, synchronised before and after): count,
    kernel time, busy (the union of the kernels' and memsets' intervals), span (first start to last end) and idle
    (span - busy), each the median over the steps; --verbose-kernels adds each kernel's median duration and name.
    The same figures and words as dyngrad-perf --kernel-times (bench/kernel_trace.h). A compiled step's kernels
    are the ones its CUDA-graph replay runs (compiled_captured)."""
    from torch.profiler import ProfilerActivity, profile
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    table = {w[0]: w for w in workloads()}
    for name in [n for n in (args.only or "").split(",") if n]:
        if name not in table:
            sys.exit(f"torch_reference.py: --kernel-counts: unknown workload {name!r}")
        _, _, prepare, tf32, _ = table[name]
        for mode in [m for m in args.modes if m in ("eager", "compiled")]:
            set_tf32(tf32)
            inputs, step = prepare(compiled=mode == "compiled")
            for _ in range(5):
                step(inputs)
            torch.cuda.synchronize()
            steps = []
            for _ in range(args.kernel_steps):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step(inputs)
                    torch.cuda.synchronize()
                device = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                                key=lambda e: e.time_range.start)
                steps.append(device)
            print(kernel_times_line(name, mode, steps), flush=True)
            if args.verbose_kernels:
                for us, kernel in per_kernel_us(steps):
                    print(f"    {us:8.2f} us  {kernel[:110]}")
            set_tf32(False)
            if mode == "compiled":
                torch._dynamo.reset()
            release_memory()
    return 0


def is_copy(event):
    return event.name.lower().startswith(("memcpy", "memset"))


def kernel_times_line(name, mode, steps):
    """One step's figures as bench/kernel_trace.cpp print_kernel_times() gives them (medians over `steps`)."""
    counts, memsets, copies, kernel_us, busy_us, span_us = [], [], [], [], [], []
    for events in steps:
        kernels = [e for e in events if not is_copy(e)]
        counts.append(len(kernels))
        memsets.append(sum(e.name.lower().startswith("memset") for e in events))
        copies.append(sum(e.name.lower().startswith("memcpy") for e in events))
        kernel_us.append(sum(e.time_range.elapsed_us() for e in kernels))  # a device event's interval is its run
        busy, covered_to = 0.0, None
        for e in events:  # sorted by start: the union of the intervals in one sweep
            start = e.time_range.start if covered_to is None else max(e.time_range.start, covered_to)
            busy += max(0.0, e.time_range.end - start)
            covered_to = e.time_range.end if covered_to is None else max(covered_to, e.time_range.end)
        busy_us.append(busy)
        span_us.append(max(e.time_range.end for e in events) - events[0].time_range.start if events else 0.0)
    med = lambda v: sorted(v)[len(v) // 2] if v else 0  # noqa: E731 (the upper median, as kernel_trace.cpp)
    return (f"kernels {name} {mode}: {med(counts)} per step, {med(kernel_us):.1f} us of kernel time, "
            f"busy {med(busy_us):.1f} us, span {med(span_us):.1f} us, idle {med(span_us) - med(busy_us):.1f} us "
            f"({med(memsets)} memsets, {med(copies)} copies; median of {len(steps)} steps)")


def per_kernel_us(steps):
    """(median duration, name) per position of the step's kernels, when every step ran the same sequence."""
    sequences = [[e for e in events if not is_copy(e)] for events in steps]
    names = [[e.name for e in kernels] for kernels in sequences]
    if not sequences or any(n != names[0] for n in names):
        return []
    return [(statistics.median_high([kernels[i].time_range.elapsed_us() for kernels in sequences]), names[0][i])
            for i in range(len(names[0]))]


def chain_us(device, s):
    """bench/perf.cpp chain_us(): host us per op of x = x + c on 1-element tensors, and per backward node."""
    one = torch.ones(1, device=device)
    record, backward = [], []
    for r in range(s.chain_repetitions + 1):
        x = one.clone().requires_grad_()
        c = one
        y = x
        start = time.perf_counter()
        for _ in range(s.chain):
            y = y + c
        record_ms = (time.perf_counter() - start) * 1e3
        if device == GPU:
            torch.cuda.synchronize()
        start = time.perf_counter()
        y.backward()
        backward_ms = (time.perf_counter() - start) * 1e3
        if device == GPU:
            torch.cuda.synchronize()
        if r > 0:
            record.append(1e3 * record_ms / s.chain)
            backward.append(1e3 * backward_ms / s.chain)
    return statistics.median_high(record), statistics.median_high(backward)


def environment():
    props = torch.cuda.get_device_properties(0)
    return {"device": f"{props.name} ({props.multi_processor_count} SMs)", "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "python": sys.version.split()[0]}


def run_workloads(args):
    s = Settings(args.quick)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    set_tf32(False)
    names = [w[0] for w in workloads()]
    only = [n for n in args.only.split(",") if n] if args.only else []
    for name in only:
        if name not in names and name != "host":
            sys.exit(f"torch_reference.py: --only: unknown workload {name!r} (see --list)")

    def wanted(name):
        return not only or name in only

    env = environment()
    print(f"torch_reference.py on {env['device']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
          f"cudnn.benchmark {env['cudnn_benchmark']}")
    print(f"ms per step: median of {s.repetitions} repetitions of K steps (>= {s.min_repetition_ms:.0f} ms each), "
          f"after {s.warmup} warm-up steps; peak = max_memory_allocated during one step (absolute)\n")
    result = {"tool": "torch_reference.py", **env,
              "timing": "median over repetitions of the mean ms per step; each repetition timed on the host clock "
                        "from a synchronised device to the end of torch.cuda.synchronize after K steps",
              "memory": "torch.cuda.max_memory_allocated during one step after reset_peak_memory_stats, absolute; "
                        "includes PyTorch's cuBLAS/cuBLASLt workspaces, which it allocates through its allocator",
              "settings": {"warmup": s.warmup, "repetitions": s.repetitions,
                           "min_repetition_ms": s.min_repetition_ms, "min_steps": s.min_steps,
                           "max_steps": s.max_steps}}
    copy_gbs = 0.0
    if wanted("mul64m"):
        copy_gbs = copy_bandwidth_gbs(s)
        result["copy_bandwidth_gbs"] = copy_gbs
        print(f"device-to-device copy bandwidth: {copy_gbs:.1f} GB/s (read + write)\n")
    print(f"{'workload':<14} {'mode':<9} {'ms/step':>10} {'K':>5} {'peak MiB':>12}")
    rows, failed = [], False
    for name, description, prepare, tf32, bytes_per_step in workloads():
        if not wanted(name):
            continue
        for mode in args.modes:
            row = measure(name, description, prepare, tf32, bytes_per_step, mode, s, copy_gbs)
            if "error" in row:
                failed = True
                print(f"{name:<14} {mode:<9} FAILED: {row['error']}")
            else:
                line = f"{name:<14} {mode:<9} {row['ms']:10.4f} {row['steps_per_repetition']:5d} " \
                       f"{row['peak_bytes'] / 2**20:12.1f}"
                if "gbs" in row:
                    line += f"  {row['gbs']:.1f} GB/s = {100 * row['copy_fraction']:.1f}% of copy"
                print(line, flush=True)
            rows.append(row)
    result["rows"] = rows
    if wanted("host"):
        cpu_record, cpu_backward = chain_us("cpu", s)
        cuda_record, cuda_backward = chain_us(GPU, s)
        result["host_overhead"] = {"chain": s.chain, "cpu_record_us_per_op": cpu_record,
                                   "cpu_backward_us_per_node": cpu_backward,
                                   "cuda_record_host_us_per_op": cuda_record,
                                   "cuda_backward_host_us_per_node": cuda_backward}
        print(f"\nhost overhead (chain of {s.chain} adds on 1-element tensors, median): CPU {cpu_record:.3f} us/op "
              f"(backward {cpu_backward:.3f} us/node); CUDA host time {cuda_record:.3f} us/op "
              f"(backward {cuda_backward:.3f} us/node)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
        print(f"\nwrote {args.json}")
    return 1 if failed else 0


# ---- time to accuracy: dyngrad-train --target-accuracy in PyTorch ----

def read_idx(directory, stem):
    """An IDX file (core/idx.cpp), plain or gzip-compressed: (dims, bytes)."""
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                raw = f.read()
            break
    else:
        raise FileNotFoundError(f"{directory}: missing {stem} (or {stem}.gz)")
    zero, dtype, rank = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{rank}I", raw[4:4 + 4 * rank])
    return dims, raw[4 + 4 * rank:]


def load_split(directory, prefix, table=None):
    """images (N,1,H,W) float32 and labels (N) int64 on the GPU; `table` maps a byte to its normalised value
    (core/dataset.cpp load_mnist); without one it is computed from these pixels and returned."""
    dims, pixels = read_idx(directory, f"{prefix}-images-idx3-ubyte")
    _, labels = read_idx(directory, f"{prefix}-labels-idx1-ubyte")
    pixels = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).to(GPU)
    if table is None:
        # Mean and population standard deviation of byte / 255 from a histogram, in double, as dyngrad does.
        counts = torch.bincount(pixels, minlength=256).double()
        values = torch.arange(256, dtype=torch.float64, device=GPU) / 255.0
        n = counts.sum()
        mean = (counts * values).sum() / n
        variance = torch.clamp((counts * values * values).sum() / n - mean * mean, min=0.0)
        stddev = torch.sqrt(variance) if variance > 0 else torch.ones((), dtype=torch.float64, device=GPU)
        table = ((values - mean) / stddev).float()
    images = table[pixels.long()].reshape(dims[0], 1, dims[1], dims[2])
    labels = torch.frombuffer(bytearray(labels), dtype=torch.uint8).to(GPU).long()
    return images, labels, table


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file (core/safetensors.h): a little-endian u64 header size,
    a JSON header of dtype, shape and [begin, end) offsets into the data that follows."""
    with open(path, "rb") as f:
        raw = f.read()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    data = raw[8 + size:]
    return {name: (entry["dtype"], entry["shape"], data[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items() if name != "__metadata__"}


def load_initial_weights(model, path):
    """Copies dyngrad's saved parameters into `model`: samples/models.h and make_model() number their layers
    alike, so the names ("0.weight", "5.bias", ...) are the state_dict's keys."""
    state = {}
    for name, (dtype, shape, raw) in read_safetensors(path).items():
        if dtype != "F32":
            raise ValueError(f"{path}: {name} is {dtype}, expected F32")
        state[name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
    model.load_state_dict(state, strict=True)


def write_safetensors(path, tensors):
    """Writes {name: float32 CPU tensor} in the format read_safetensors() reads (and dyngrad's --load)."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        raw = bytes(tensor.detach().to("cpu", torch.float32).contiguous().view(torch.uint8).flatten().tolist())
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def save_default_init(args):
    """lenet as PyTorch initialises it by default (torch.manual_seed(seed); kaiming_uniform(a=√5) weights,
    uniform ±1/√fan_in biases), saved for dyngrad-train --load and --init-from alike."""
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(*make_model("lenet", default_init=True))
    write_safetensors(args.save_default_init, dict(model.state_dict()))
    print(f"saved PyTorch's default lenet initialisation (seed {args.seed}) to {args.save_default_init}")
    return 0


def time_to_accuracy(args):
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    set_tf32(False)
    torch.manual_seed(args.seed)
    train_x, train_y, table = load_split(args.data, "train")
    test_x, test_y, _ = load_split(args.data, "t10k", table)
    n, batch = train_y.numel(), args.batch
    batches = (n + batch - 1) // batch
    line_every = max(1, (batches + 9) // 10)  # dyngrad-train's Progress: about ten lines per epoch
    model = make_model("lenet").to(GPU)
    if args.init_from:
        load_initial_weights(model, args.init_from)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    forward = model
    if args.compile:
        # torch.compile of the model; compiled before the clock starts for both batch sizes an epoch has (the
        # last batch is smaller) and the evaluation's, by forward + backward passes that change no weight.
        forward = torch.compile(model)
        start = time.perf_counter()
        for size in sorted({batch, n % batch or batch}):
            forward(train_x[:size]).sum().backward()
        with torch.no_grad():
            forward(test_x[:1000])
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print(f"torch.compile: {time.perf_counter() - start:.1f} s before the clock")
    env = environment()
    print(f"time to accuracy: lenet, Adam lr {args.lr}, batch {batch}, data on the GPU, seed {args.seed}, "
          f"target {args.target_accuracy}, initial weights {args.init_from or 'drawn by PyTorch'}, "
          f"on {env['device']}, torch {env['torch']}")
    train_seconds = evaluation_seconds = 0.0
    epochs, reached, accuracy = [], 0, 0.0
    for epoch in range(args.max_epochs):
        # The order is drawn on the host before the clock starts (pure Python is slow at it; dyngrad's C++
        # draws it in milliseconds inside its epoch); uploading it and gathering the epoch are timed.
        order = epoch_permutation(n, args.seed, epoch)
        torch.cuda.synchronize()
        start = time.perf_counter()
        index = torch.tensor(order, dtype=torch.long).to(GPU)
        epoch_x, epoch_y = train_x[index], train_y[index]
        model.train()
        for b in range(batches):
            x, y = epoch_x[b * batch:(b + 1) * batch], epoch_y[b * batch:(b + 1) * batch]
            optimizer.zero_grad(set_to_none=True)
            logits = forward(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            # The same read-backs as dyngrad-train's progress display (each one a host synchronisation).
            if (b + 1) % args.log_every == 0 or (b + 1) % line_every == 0 or b + 1 == batches:
                loss.item()
                (logits.argmax(1) == y).sum().item()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        train_seconds += seconds
        start = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, test_y.numel(), 1000):
                correct += (forward(test_x[b:b + 1000]).argmax(1) == test_y[b:b + 1000]).sum().item()
        evaluation_seconds += time.perf_counter() - start
        accuracy = correct / test_y.numel()
        epochs.append({"epoch": epoch + 1, "train_seconds": seconds, "test_accuracy": accuracy})
        print(f"epoch {epoch + 1}: {seconds:.2f} s, test accuracy {100 * accuracy:.2f}%", flush=True)
        if accuracy >= args.target_accuracy:
            reached = epoch + 1
            break
    print(f"epochs_to_target={reached}\ntime_to_target_s={train_seconds if reached else 0.0:.3f}\n"
          f"evaluation_s={evaluation_seconds:.3f}\ntest_accuracy={accuracy:.4f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"tool": "torch_reference.py --time-to-accuracy", **env, "model": "lenet",
                       "compiled": bool(args.compile),
                       "optimizer": f"torch.optim.Adam(lr={args.lr}) (PyTorch's default implementation)",
                       "batch": batch, "seed": args.seed, "initial_weights": args.init_from or "drawn by PyTorch", "target_accuracy": args.target_accuracy,
                       "epochs_to_target": reached, "time_to_target_s": train_seconds if reached else None,
                       "evaluation_s": evaluation_seconds, "test_accuracy": accuracy, "epochs": epochs}, out, indent=2)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--only", help="comma-separated workloads (see --list); 'host' is the host overhead")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repetitions (smoke runs)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated PyTorch modes to measure (default: all of {', '.join(MODES)})")
    parser.add_argument("--list", action="store_true", help="list the workloads")
    parser.add_argument("--no-cudnn-benchmark", action="store_true", help="PyTorch's default cuDNN heuristics")
    parser.add_argument("--time-to-accuracy", action="store_true", help="lenet on Fashion-MNIST to the target")
    parser.add_argument("--compile", action="store_true", help="--time-to-accuracy with torch.compile(model)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="MNIST-format directory")
    parser.add_argument("--target-accuracy", type=float, default=0.90)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="epoch order (dyngrad-train --seed) and weights")
    parser.add_argument("--init-from", help="initial lenet weights (safetensors from dyngrad-train --save)")
    parser.add_argument("--save-default-init", metavar="FILE",
                        help="save lenet with PyTorch's default initialisation for --seed to FILE, then exit")
    parser.add_argument("--log-every", type=int, default=50, help="as dyngrad-train --log-every (GPU default 50)")
    parser.add_argument("--profile", action="store_true",
                        help="one step of each --only workload in the first --modes mode between cudaProfilerStart/Stop")
    parser.add_argument("--kernel-counts", action="store_true",
                        help="kernels per step and their device time of each --only workload, eager and compiled")
    parser.add_argument("--verbose-kernels", action="store_true",
                        help="with --kernel-counts: each kernel's median duration and name")
    parser.add_argument("--kernel-steps", type=int, default=20, help="with --kernel-counts: steps profiled (default 20)")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    for mode in args.modes:
        if mode not in MODES:
            sys.exit(f"torch_reference.py: --modes: unknown mode {mode!r} (one of {', '.join(MODES)})")
    if args.list:
        for name, description, *_ in workloads():
            print(f"{name:<14} {description}")
        print(f"{'host':<14} host overhead per recorded op")
        return 0
    if torch is None:
        sys.exit("torch_reference.py: PyTorch is not installed")
    if not torch.cuda.is_available():
        print("torch_reference.py: no CUDA device; nothing to measure")
        return 77
    if args.save_default_init:
        return save_default_init(args)
    if args.profile:
        return profile_one_replay(args)
    if args.kernel_counts:
        return kernel_counts(args)
    return time_to_accuracy(args) if args.time_to_accuracy else run_workloads(args)


if __name__ == "__main__":
    sys.exit(main())
