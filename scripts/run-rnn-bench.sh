#!/usr/bin/env bash
# Issue 6's benchmark in one command, on a machine with a CUDA device and PyTorch: builds
# dyngrad-rnn-bench (Release, CUDA) into $DYNGRAD_BUILD_DIR (default build-perf/), runs it and
# bench/torch_lstm.py on the same LSTM workload (sequence 512, 4 layers, hidden 512, input 512,
# batch 32..256 step 32, forward + backward), and prints the side-by-side table.
#
#   scripts/run-rnn-bench.sh [OUT_DIR] [extra dyngrad-rnn-bench options, e.g. --batches 32,64]
#
# OUT_DIR (default rnn-results/) receives rnn.txt, rnn.json, rnn_tf32.txt, rnn_tf32.json, torch_lstm.txt,
# torch_lstm.json and report.md. Environment: PYTHON (default python3), DYNGRAD_JOBS (default nproc).
# The build tools must be installed (scripts/setup.sh installs them on Debian/Ubuntu). DYNGRAD_RECORD=docs
# (scripts/lib.sh, dg_record): a run without --batches also writes performance/rnn-GPU.md (report.md),
# performance/rnn-GPU.json, performance/rnn-tf32-GPU.json and performance/torch-lstm-GPU.json.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
dg_bench_setup rnn-results dyngrad-rnn-bench "$@" || exit 1
shift || true
dg_bench_side "dyngrad-rnn-bench (float32)" "$out/rnn.txt" \
    "$build/bench/dyngrad-rnn-bench" --json "$out/rnn.json" "$@"
dg_bench_side "dyngrad-rnn-bench (TF32 allowed, cuDNN lstm only)" "$out/rnn_tf32.txt" \
    "$build/bench/dyngrad-rnn-bench" --tf32 --skip-composed --json "$out/rnn_tf32.json" "$@"
batches=$(grep -oE -- "--batches [0-9,]+" <<<"$*" | cut -d' ' -f2)
dg_bench_side bench/torch_lstm.py "$out/torch_lstm.txt" \
    "$python" "$root/bench/torch_lstm.py" --json "$out/torch_lstm.json" ${batches:+--batches "$batches"}

"$python" - "$out" <<'PY' | tee "$out/report.md" || status=1
import json, sys
out = sys.argv[1]
ours = json.load(open(f"{out}/rnn.json"))
tf32 = {r["batch"]: r for r in json.load(open(f"{out}/rnn_tf32.json"))["rows"]}
torch = json.load(open(f"{out}/torch_lstm.json"))
theirs = {r["batch"]: r for r in torch["rows"]}
print(f"dyngrad: {ours['device']}; torch {torch['torch']}, cuDNN {torch['cudnn']}")
print(f"LSTM sequence {ours['seq']}, {ours['layers']} layers, hidden {ours['hidden']}, input {ours['input']}, "
      f"forward + backward; composed-vs-cuDNN check: max relative difference {ours['composed_check']:.1e}\n")
print("| batch | (a) lstm ms | GFLOP/s | (b) composed ms | GFLOP/s | (a)/(b) time | torch ms | (a)/torch | "
      "(a) TF32 ms | torch default (TF32) ms | (a) TF32/torch |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in ours["rows"]:
    b, g = r["batch"], r["gflop"]
    t = theirs.get(b)
    s = tf32.get(b)
    comp = r["composed_ms"]
    cells = [b, f"{r['cudnn_ms']:.2f}", f"{g / (r['cudnn_ms'] * 1e-3):.0f}",
             f"{comp:.2f}" if comp else "-", f"{g / (comp * 1e-3):.0f}" if comp else "-",
             f"{r['cudnn_ms'] / comp:.3f}" if comp else "-",
             f"{t['torch_ms']:.2f}" if t else "-", f"{r['cudnn_ms'] / t['torch_ms']:.3f}" if t else "-",
             f"{s['cudnn_ms']:.2f}" if s else "-", f"{t['torch_tf32_ms']:.2f}" if t else "-",
             f"{s['cudnn_ms'] / t['torch_tf32_ms']:.3f}" if s and t else "-"]
    print("| " + " | ".join(str(c) for c in cells) + " |")
PY
kind=$(dg_gpu_kind)
dg_records "${batches:+a subset of the batch sizes}" \
    "$out/report.md" "performance/rnn-$kind.md" "$out/rnn.json" "performance/rnn-$kind.json" \
    "$out/rnn_tf32.json" "performance/rnn-tf32-$kind.json" "$out/torch_lstm.json" "performance/torch-lstm-$kind.json" ||
    status=1
exit $status
