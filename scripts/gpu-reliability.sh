#!/usr/bin/env bash
# On a machine with a CUDA device: build with CUDA, run the GPU soak (10,000 lenet steps, device memory
# after step 100 == after step 10,000) and compute-sanitizer's memcheck, racecheck, initcheck and
# synccheck over the GPU tests; logs go to $1 (default gpu-results/). The records in
# docs/reliability.md come from this script. TOOL_TIMEOUT (default 110 s) bounds each sanitizer run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/gpu-results}
data=${DATA:-/usr/share/datasets/fashion-mnist}
mkdir -p "$out"
build=${DYNGRAD_BUILD_DIR:-$root/build-gpu}
. "$root/scripts/lib.sh"
cuda_architectures=$(dg_cuda_architectures_arg)
dg_configure_and_build "$build" --log "$build.log" -- -DCMAKE_BUILD_TYPE=Release -DDYNGRAD_CUDA=ON \
  ${cuda_architectures:+"$cuda_architectures"} || exit 1
status=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; compute-sanitizer --version | tail -1; } \
  > "$out/sanitizer.txt" 2>&1
"$build/bench/dyngrad-soak" --device cuda --steps 10000 --data "$data" > "$out/soak.txt" 2>&1 || status=1
tail -5 "$out/soak.txt"
# The op-table cases exercise every kernel; the large cases are left out (minutes under the tools).
for tool in memcheck racecheck initcheck synccheck; do
  extra=""
  [ "$tool" = memcheck ] && extra="--leak-check full"
  echo "== $tool" >> "$out/sanitizer.txt"
  timeout "${TOOL_TIMEOUT:-110}" compute-sanitizer --tool "$tool" $extra --error-exitcode 3 \
    "$build/tests/test_gpu" "[table],[deterministic],[device]" >> "$out/sanitizer.txt" 2>&1
  rc=$?
  echo "== $tool exit $rc" >> "$out/sanitizer.txt"
  [ $rc -eq 0 ] || status=1
done
grep -E "^== |ERROR SUMMARY|All tests passed|test cases" "$out/sanitizer.txt"
exit $status
