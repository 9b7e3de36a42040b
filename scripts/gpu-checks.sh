#!/usr/bin/env bash
# On a machine with a CUDA device: build with the CUDA backend, run every test, the verification bench,
# the matmul_relu demo and the performance floor; logs go to $1 (default gpu-results/).
# Used for the records in docs/verification.md (the lent GPU has no apt: dependencies must be present).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/gpu-results}
mkdir -p "$out"
build=${DYNGRAD_BUILD_DIR:-$root/build-gpu}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
} > "$out/env.txt" 2>&1
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDYNGRAD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  > "$out/build.log" 2>&1 && cmake --build "$build" -j"$(nproc)" >> "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
status=0
ctest --test-dir "$build" --output-on-failure -j4 > "$out/ctest.log" 2>&1 || status=1
tail -15 "$out/ctest.log"
"$build/bench/dyngrad-verify" --json "$out/verify.json" > "$out/verify.txt" 2>&1 || status=1
tail -12 "$out/verify.txt"
{ "$build/samples/matmul_relu"; "$build/bench/dyngrad-perf-floor" --json "$out/perf_floor.json"; } \
  > "$out/demo_and_floor.txt" 2>&1 || status=1
cat "$out/demo_and_floor.txt" | tail -30
exit $status
