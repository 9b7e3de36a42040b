#!/usr/bin/env bash
# On a machine with a CUDA device: build with the CUDA backend, run every test, the verification bench,
# the samples (matmul_relu, custom_op, lenet_step), the performance floor and the Fashion-MNIST training
# runs (lenet, mlp, lstm); logs go to $1 (default gpu-results/), at most 8 files. DATA (default
# /usr/share/datasets/fashion-mnist) names the data set. The records in docs/verification.md and
# docs/training.md come from this script. The lent GPU has no apt: dependencies must be present.
# DYNGRAD_RECORD=docs (scripts/lib.sh, dg_record) also writes the records those pages cite:
# verification/verify-GPU.json, verification/perf-floor-GPU.json, training/lenet-cuda-GPU.csv and
# training/lstm-cuda-GPU.csv (the learning curves).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dg_command="scripts/gpu-checks.sh $*"
out=${1:-$root/gpu-results}
data=${DATA:-/usr/share/datasets/fashion-mnist}
mkdir -p "$out"
build=${DYNGRAD_BUILD_DIR:-$root/build-gpu}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
} > "$out/env.txt" 2>&1
. "$root/scripts/lib.sh"
cuda_architectures=$(dg_cuda_architectures_arg)
dg_configure_and_build "$build" --log "$build.log" -- -DCMAKE_BUILD_TYPE=Release -DDYNGRAD_CUDA=ON \
  ${cuda_architectures:+"$cuda_architectures"} || exit 1
grep -E "CUDA backend|Catch2" "$build.log" >> "$out/env.txt"
status=0
ctest --test-dir "$build" --output-on-failure -j4 > "$out/ctest.log" 2>&1 || status=1
tail -12 "$out/ctest.log"
"$build/tools/dyngrad-verify" --json "$out/verify.json" > "$out/verify.txt" 2>&1 || status=1
tail -8 "$out/verify.txt"
{
  echo "== matmul_relu"; "$build/samples/matmul_relu"
  echo "== custom_op --device cuda"; "$build/samples/custom_op" --device cuda
  echo "== lenet_step --device cuda"; "$build/samples/lenet_step" --device cuda --data "$data"
  echo "== dyngrad-perf-floor"; "$build/bench/dyngrad-perf-floor" --json "$out/perf_floor.json"
} > "$out/samples.txt" 2>&1 || status=1
grep -E "^==|Speedup|final loss|loss after|floor|GB/s|cuBLAS" "$out/samples.txt"
train="$build/samples/dyngrad-train"
{
  echo "== lenet, 10 epochs, cuda"
  timeout 240 "$train" --model lenet --epochs 10 --device cuda --data "$data" --csv "$out/lenet_curve.csv"
  echo "== mlp, 10 epochs, cuda"
  timeout 120 "$train" --model mlp --epochs 10 --device cuda --data "$data"
  echo "== lstm, 10 epochs, cuda"
  timeout 120 "$train" --model lstm --epochs 10 --device cuda --resident --data "$data" --csv "$out/lstm_curve.csv"
  echo "== lenet, 1 epoch, cuda, shadow verification every 100 steps"
  timeout 120 "$train" --model lenet --epochs 1 --device cuda --data "$data" --shadow 100
} > "$out/training.txt" 2>&1 || status=1
grep -E "^==|test_accuracy|epoch .*acc|shadow" "$out/training.txt" | tail -40
kind=$(dg_gpu_kind)
dg_records "" "$out/verify.json" "verification/verify-$kind.json" "$out/perf_floor.json" "verification/perf-floor-$kind.json" \
  "$out/lenet_curve.csv" "training/lenet-cuda-$kind.csv" "$out/lstm_curve.csv" "training/lstm-cuda-$kind.csv" || status=1
exit $status
