#!/usr/bin/env python3
"""PyTorch's nn.LSTM on the workload of dyngrad-rnn-bench, measured the same way, for the side-by-side table.

Sequence 512, 4 layers, hidden 512, input 512, batch 32..256 in steps of 32 (override with options):
forward + backward (gradients of the input and every weight, output gradient given), float32, cuDNN,
twice per batch: strict float32 (allow_tf32 off) and PyTorch's default math (TF32 allowed in cuDNN). Timing: CUDA events around `--inner` steps, after warm-up; the median of `--repetitions` such means.

    python3 bench/torch_lstm.py --json torch_lstm.json
"""
import statistics
import sys

import torch_bench


def lstm_flops(seq, layers, hidden, inputs, batch, directions=1):
    """Multiply-adds of the gate GEMMs times 2, forward + backward (backward = data + weights = 2x forward)."""
    forward = 0
    for layer in range(layers):
        layer_input = inputs if layer == 0 else hidden * directions
        forward += directions * 2 * seq * batch * 4 * hidden * (layer_input + hidden)
    return 3 * forward


def main():
    parser = torch_bench.parser(__doc__, repetitions=5)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--input", type=int, default=512)
    parser.add_argument("--batches", default="32,64,96,128,160,192,224,256")
    parser.add_argument("--inner", type=int, default=3)
    args = parser.parse_args()

    torch, device = torch_bench.cuda_torch("torch_lstm.py")
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    model = torch.nn.LSTM(args.input, args.hidden, args.layers).to(device)

    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        x = torch.randn(args.seq, batch, args.input, device=device, requires_grad=True)
        dy = torch.randn(args.seq, batch, args.hidden, device=device)

        def step():
            model.zero_grad(set_to_none=True)
            x.grad = None
            y, _ = model(x)
            y.backward(dy)

        def median_ms(allow_tf32):
            torch.backends.cudnn.allow_tf32 = allow_tf32
            for _ in range(2):
                step()
            torch.cuda.synchronize()
            samples = []
            for _ in range(args.repetitions):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.inner):
                    step()
                stop.record()
                stop.synchronize()
                samples.append(start.elapsed_time(stop) / args.inner)
            return statistics.median(samples)

        flops = lstm_flops(args.seq, args.layers, args.hidden, args.input, batch)
        strict, tf32 = median_ms(False), median_ms(True)
        rows.append({"batch": batch, "torch_ms": strict, "torch_gflops": flops / (strict * 1e6),
                     "torch_tf32_ms": tf32, "torch_tf32_gflops": flops / (tf32 * 1e6)})
        print(f"torch nn.LSTM batch {batch:4d}: float32 {strict:9.3f} ms {flops / (strict * 1e6):8.1f} GFLOP/s"
              f" | default (TF32) {tf32:9.3f} ms {flops / (tf32 * 1e6):8.1f} GFLOP/s", flush=True)

    torch_bench.write_json(args.json, {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                                       "device": torch.cuda.get_device_name(0), "seq": args.seq,
                                       "layers": args.layers, "hidden": args.hidden, "input": args.input,
                                       "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
