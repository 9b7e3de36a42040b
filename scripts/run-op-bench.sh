#!/usr/bin/env bash
# Issue 13's op benchmark in one command, on a machine with a CUDA device and PyTorch: builds
# dyngrad-op-bench (Release, CUDA) into $DYNGRAD_BUILD_DIR (default build-perf/), runs it and
# bench/torch_ops.py on the same ops and float32 sizes (forward + backward, median of 50 after 10
# warm-up), and prints the side-by-side markdown table (bench/compare_ops.py).
#
#   scripts/run-op-bench.sh [OUT_DIR] [extra options for both, e.g. --op layer_norm,softmax --repetitions 20]
#
# OUT_DIR (default op-results/) receives ops.txt, ops.json, torch_ops.txt, torch_ops.json and report.md.
# Environment: PYTHON (default python3), DYNGRAD_JOBS (default nproc). DYNGRAD_RECORD=docs (scripts/lib.sh,
# dg_record): a run of every op at the default settings (no extra options) also writes performance/op-bench-GPU.md
# (report.md), performance/op-bench-GPU.json (ops.json) and performance/torch-ops-GPU.json (torch_ops.json).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
dg_bench_setup op-results dyngrad-op-bench "$@" || exit 1
shift || true
dg_bench_side dyngrad-op-bench "$out/ops.txt" "$build/bench/dyngrad-op-bench" --json "$out/ops.json" "$@"
dg_bench_side bench/torch_ops.py "$out/torch_ops.txt" \
    "$python" "$root/bench/torch_ops.py" --json "$out/torch_ops.json" "$@"
"$python" "$root/bench/compare_ops.py" "$out/ops.json" "$out/torch_ops.json" | tee "$out/report.md" || status=1
kind=$(dg_gpu_kind)
dg_records "$( (($# == 0)) || echo "options $* (records are of the default run)")" \
    "$out/report.md" "performance/op-bench-$kind.md" "$out/ops.json" "performance/op-bench-$kind.json" \
    "$out/torch_ops.json" "performance/torch-ops-$kind.json" || status=1
exit $status
