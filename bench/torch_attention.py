#!/usr/bin/env python3
"""PyTorch's F.scaled_dot_product_attention on the workload of dyngrad-attention-bench, measured the same way.

B 8, H 8, D 64, T = S in --lengths (default 256,1024,4096), --dtype f32 (default) | bf16 | f16, without and with
is_causal: one forward + backward (dq, dk, dv; output gradient given) per step. PyTorch picks its backend itself
unless --backend names one (for float32 on an H100: the memory-efficient kernel, flash attention takes no float32;
for bf16/f16: flash, or cuDNN in some versions; --backend flash pins flash); the backend is recorded. Timing: the median of
--repetitions wall times of one synchronised step after warm-up, as dyngrad-attention-bench; peak memory: what
the step adds to the inputs (torch.cuda.max_memory_allocated).

    python3 bench/torch_attention.py --json torch_attention.json
    python3 bench/torch_attention.py --dtype bf16 --backend flash --json torch_attention_bf16.json
"""
import statistics
import sys
import time

import torch_bench


def main():
    parser = torch_bench.parser(__doc__, repetitions=10)
    parser.add_argument("--lengths", default="256,1024,4096")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    parser.add_argument("--backend", choices=["auto", "flash", "efficient", "cudnn", "math"], default="auto",
                        help="pin PyTorch's SDPA backend (default: PyTorch chooses)")
    args = parser.parse_args()

    torch, device = torch_bench.cuda_torch("torch_attention.py")
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False  # strict float32, as dyngrad
    torch.manual_seed(0)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    if args.backend == "auto":
        import contextlib
        backend_scope = contextlib.nullcontext
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        pinned = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                  "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[args.backend]
        backend_scope = lambda: sdpa_kernel(pinned)  # noqa: E731
    rows = []
    for length in [int(t) for t in args.lengths.split(",")]:
        shape = (args.batch, args.heads, length, args.head_dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        dy = torch.randn(shape, device=device, dtype=dtype)
        for causal in (False, True):
            def step():
                q.grad = k.grad = v.grad = None
                with backend_scope():
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                y.backward(dy)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            samples = []
            for _ in range(args.repetitions):
                start = time.perf_counter()
                step()
                torch.cuda.synchronize()
                samples.append((time.perf_counter() - start) * 1e3)
            q.grad = k.grad = v.grad = None
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            peak_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            kernels = sorted({e.name for e in prof.events()
                              if any(word in e.name.lower() for word in ("attention", "fmha", "flash", "cudnn"))})
            backend = ("memory-efficient" if any("efficient" in n or "fmha" in n for n in kernels)
                       else "flash" if any("flash" in n.lower() for n in kernels)
                       else "cudnn" if any("cudnn" in n.lower() for n in kernels) else "math/other")
            row = {"length": length, "causal": causal, "ms": statistics.median(samples), "peak_mib": peak_mib,
                   "backend": backend}
            rows.append(row)
            print(f"T {length:5d} causal {str(causal):5s} {row['ms']:9.3f} ms  peak {peak_mib:8.1f} MiB  {backend}",
                  flush=True)
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "dtype": args.dtype,
              "batch": args.batch,
              "heads": args.heads, "head_dim": args.head_dim, "rows": rows}
    torch_bench.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
