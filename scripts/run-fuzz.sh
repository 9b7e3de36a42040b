#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (fuzz_graph, fuzz_idx, fuzz_safetensors) with clang 14 in
# build-fuzz/ (CPU only; the library too is built with coverage, ASan and UBSan) and runs each for
# SECONDS (default 60), the three side by side, starting from its seed corpus tests/fuzz/corpus/<target>/. New inputs go to
# build-fuzz/corpus/<target>/, never into the repository; a crash, sanitizer finding, leak or timeout
# stops that target, leaves the input in build-fuzz/artifacts/ and fails the run.
# Usage: scripts/run-fuzz.sh [SECONDS]   Full logs: build-fuzz/<target>.log.
# Environment (optional): DYNGRAD_FUZZ_BUILD_DIR (default build-fuzz), DYNGRAD_JOBS (default nproc).
# Exit status: 0 when every target ran its time without a finding.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. "$root/scripts/lib.sh"
seconds=${1:-60}
DYNGRAD_EXTRA_PACKAGES="clang-14 libclang-rt-14-dev" "$root/scripts/setup.sh" --deps-only

build_dir=${DYNGRAD_FUZZ_BUILD_DIR:-build-fuzz}
targets=(fuzz_graph fuzz_idx fuzz_safetensors)
target_args=()
for target in "${targets[@]}"; do target_args+=(--target "$target"); done
echo "==> $build_dir: clang 14, libFuzzer + ASan + UBSan, CPU only"
# Only the fuzz targets and the library they link: not the distributed library (where MPI is found), which no
# target runs. A unity build, as scripts/run-sanitized-tests.sh's (docs/reliability.md, "CI time").
dg_configure_and_build "$build_dir" "${target_args[@]}" -- -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_UNITY_BUILD=ON \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo $(dg_launcher_args) \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DDYNGRAD_CUDA=OFF -DDYNGRAD_FUZZ=ON \
      -DBUILD_SHARED_LIBS=OFF -DDYNGRAD_BUILD_TESTS=OFF -DDYNGRAD_BUILD_BENCH=OFF -DDYNGRAD_BUILD_SAMPLES=OFF

export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The targets run side by side (the stage takes SECONDS, not three times that); each reports when all are done.
declare -A pids=()
mkdir -p "$build_dir/artifacts"
for target in "${targets[@]}"; do
    echo "==> $target for $seconds s"
    mkdir -p "$build_dir/corpus/$target"
    "$build_dir/tests/fuzz/$target" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/$target-" \
        "$build_dir/corpus/$target" "tests/fuzz/corpus/$target" > "$build_dir/$target.log" 2>&1 &
    pids[$target]=$!
done
status=0
for target in "${targets[@]}"; do
    log="$build_dir/$target.log"
    if wait "${pids[$target]}"; then
        # "#N DONE cov: ... corp: ..." and the run's totals
        echo "$target:"
        grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
    else
        status=1
        echo "$target FAILED (log: $log, input: $build_dir/artifacts/):"
        tail -n 60 "$log"
    fi
done
exit $status
