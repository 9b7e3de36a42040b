#!/usr/bin/env bash
# The test suite, in five stages (all of them run; see README.md):
#   0. scripts/check-layers.sh: no file includes a folder above its own (docs/architecture.md); and
#      scripts/check-sizes.sh: no library file over 800 lines, each over 600 says why;
#   1. scripts/setup.sh (dependencies, Release build in build/), then every test through CTest; GPU tests
#      skip themselves on a machine without a CUDA device;
#   2. scripts/run-sanitized-tests.sh: the CPU tests again under ASan + UBSan with leak detection, and a
#      CPU soak of lenet (build-asan/);
#   3. scripts/run-fuzz.sh 60: each libFuzzer target for 60 s from its seed corpus (build-fuzz/);
#   4. scripts/run-python-tests.sh: the Python package pip-installed into a fresh virtual environment (over the
#      library of stage 1's build), then pytest, a one-epoch CPU run of the Fashion-MNIST script included.
# Exit status: 0 when every stage passed, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

build_dir=${DYNGRAD_BUILD_DIR:-build}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"

passed=0
failed=0
stage() {
    local name=$1
    shift
    local start=$SECONDS
    echo "===== stage: $name"
    if "$@"; then
        passed=$((passed + 1))
        echo "===== $name: passed ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1))
        echo "===== $name: FAILED ($((SECONDS - start)) s)"
    fi
}
tests() {
    "$root/scripts/setup.sh" && ctest --test-dir "$build_dir" --output-on-failure -j"${DYNGRAD_JOBS:-$(nproc)}"
}

structure_checks() {
    local status=0
    "$root/scripts/check-layers.sh" || status=1
    "$root/scripts/check-sizes.sh" || status=1
    return $status
}
stage "structure checks" structure_checks
stage "tests" tests
stage "sanitized tests" "$root/scripts/run-sanitized-tests.sh"
stage "fuzz smoke run" "$root/scripts/run-fuzz.sh" 60
stage "python" "$root/scripts/run-python-tests.sh" "$build_dir"
echo "stages: $passed passed, $failed failed"
((failed == 0))
