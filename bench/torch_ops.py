#!/usr/bin/env python3
"""PyTorch on the ops and sizes of dyngrad-op-bench (bench/op_bench.cpp), measured the same way (issue 13).

Each step: forward + backward of one op, float32, every float input requires_grad, backward from the
scalar for the losses (mean, every 8th label = ignore_index -100), otherwise with a random output gradient
(y.backward(dy)). Timing: CUDA events around one step on an idle (synchronised) device; the median of
--repetitions steps after --warmup untimed ones. TF32 is irrelevant (no matmul). F.rms_norm exists only
from torch 2.4; on older versions the same formula is written with torch ops and the JSON says so.

    python3 bench/torch_ops.py --json torch_ops.json [--op layer_norm,softmax]
"""
import statistics
import sys

import torch_bench

ROWS, HIDDEN, FFN, VOCAB, BATCH, SEQ, HEADS = 8192, 768, 3072, 50257, 8, 1024, 12


def cases(torch, F, device):
    """(op, size, prepare) in dyngrad-op-bench's order; prepare() builds the inputs and returns the step."""
    gen = torch.Generator(device=device)
    gen.manual_seed(0)

    def randn(*shape, grad=False):
        return torch.randn(*shape, device=device, generator=gen).requires_grad_(grad)

    def indices(count, high, ignore_every=0):
        ids = torch.randint(0, high, (count,), device=device, generator=gen)
        if ignore_every:
            ids[::ignore_every] = -100
        return ids

    def causal_mask(n):  # True above the diagonal: the positions to hide
        return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)

    rms_norm = getattr(F, "rms_norm", None)
    if rms_norm is None:
        def rms_norm(x, shape, weight, eps=None):
            eps = torch.finfo(x.dtype).eps if eps is None else eps
            axes = tuple(range(-len(shape), 0))
            return x * torch.rsqrt(x.pow(2).mean(axes, keepdim=True) + eps) * weight

    def unary(op, shape, fn, out_shape=None):
        def prepare():
            x, dy = randn(*shape, grad=True), randn(*(out_shape or shape))

            def step():
                x.grad = None
                fn(x).backward(dy)
            return step
        return op, "x".join(map(str, shape)), prepare

    def norm(op, width):
        def prepare():
            x, dy = randn(ROWS, width, grad=True), randn(ROWS, width)
            weight = (torch.rand(width, device=device, generator=gen) + 0.5).requires_grad_(True)
            bias = randn(width, grad=True)

            def step():
                x.grad = weight.grad = bias.grad = None
                y = F.layer_norm(x, (width,), weight, bias) if op == "layer_norm" else rms_norm(x, (width,), weight)
                y.backward(dy)
            return step
        return op, f"{ROWS}x{width}", prepare

    def embedding():
        weight, dy = randn(VOCAB, HIDDEN, grad=True), randn(BATCH, SEQ, HIDDEN)
        ids = indices(BATCH * SEQ, VOCAB).reshape(BATCH, SEQ)

        def step():
            weight.grad = None
            F.embedding(ids, weight).backward(dy)
        return step

    def loss(op):
        def prepare():
            x, labels = randn(ROWS, VOCAB, grad=True), indices(ROWS, VOCAB, ignore_every=8)
            fn = F.cross_entropy if op == "cross_entropy" else F.nll_loss

            def step():
                x.grad = None
                fn(x, labels, ignore_index=-100).backward()
            return step
        return op, f"{ROWS}x{VOCAB}", prepare

    scores = (BATCH, HEADS, SEQ, SEQ)

    def where():
        a, b, dy, mask = randn(*scores, grad=True), randn(*scores, grad=True), randn(*scores), causal_mask(SEQ)

        def step():
            a.grad = b.grad = None
            torch.where(mask, b, a).backward(dy)
        return step

    def masked_fill():
        x, dy, mask = randn(*scores, grad=True), randn(*scores), causal_mask(SEQ)

        def step():
            x.grad = None
            x.masked_fill(mask, -1e9).backward(dy)
        return step

    def index_select():
        x, dy, index = randn(ROWS, FFN, grad=True), randn(ROWS, FFN), indices(ROWS, ROWS)

        def step():
            x.grad = None
            torch.index_select(x, 0, index).backward(dy)
        return step

    def maximum():
        a, b, dy = randn(ROWS, FFN, grad=True), randn(ROWS, FFN, grad=True), randn(ROWS, FFN)

        def step():
            a.grad = b.grad = None
            torch.maximum(a, b).backward(dy)
        return step

    return [
        norm("layer_norm", HIDDEN), norm("layer_norm", 4096), norm("rms_norm", HIDDEN), norm("rms_norm", 4096),
        unary("gelu_erf", (ROWS, FFN), lambda x: F.gelu(x)),
        unary("gelu_tanh", (ROWS, FFN), lambda x: F.gelu(x, approximate="tanh")),
        unary("silu", (ROWS, FFN), F.silu),
        ("embedding", f"{VOCAB}x{HIDDEN}[{BATCH}x{SEQ}]", embedding),
        loss("cross_entropy"), loss("nll_loss"),
        unary("softmax", (ROWS, 1024), lambda x: torch.softmax(x, -1)),
        ("where", "x".join(map(str, scores)), where),
        ("masked_fill", "x".join(map(str, scores)), masked_fill),
        unary("permute", (BATCH, SEQ, HEADS, 64), lambda x: x.permute(0, 2, 1, 3).contiguous(),
              (BATCH, HEADS, SEQ, 64)),
        ("index_select", f"{ROWS}x{FFN}[{ROWS}]", index_select),
        unary("clamp", (ROWS, FFN), lambda x: x.clamp(-1.0, 1.0)),
        ("maximum", f"{ROWS}x{FFN}", maximum),
    ], hasattr(F, "rms_norm")


def median_ms(torch, step, warmup, repetitions):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repetitions):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    return statistics.median(samples)


def main():
    parser = torch_bench.parser(__doc__, repetitions=50)
    parser.add_argument("--op", help="comma-separated op names (default: all)")
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    torch, device = torch_bench.cuda_torch("torch_ops.py")
    import torch.nn.functional as F
    all_cases, native_rms_norm = cases(torch, F, device)
    wanted = set(args.op.split(",")) if args.op else None
    if wanted and wanted - {op for op, _, _ in all_cases}:
        parser.error(f"--op: unknown op(s) {sorted(wanted - {op for op, _, _ in all_cases})}")
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; float32, forward + backward, "
          f"median of {args.repetitions} after {args.warmup} warm-up"
          + ("" if native_rms_norm else "; rms_norm written with torch ops (no F.rms_norm in this torch)"))
    print(f"{'op':14s} {'size':20s} {'ms':>10s}")
    rows = []
    for op, size, prepare in all_cases:
        if wanted and op not in wanted:
            continue
        step = prepare()
        ms = median_ms(torch, step, args.warmup, args.repetitions)
        del step  # frees this case's inputs before the next
        torch.cuda.empty_cache()
        rows.append({"op": op, "size": size, "ms": ms})
        print(f"{op:14s} {size:20s} {ms:10.3f}", flush=True)
    torch_bench.write_json(args.json, {"framework": "torch", "torch": torch.__version__,
                                       "device": torch.cuda.get_device_name(0), "native_rms_norm": native_rms_norm,
                                       "warmup": args.warmup, "repetitions": args.repetitions, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
