#!/usr/bin/env bash
# Builds dyngrad (scripts/setup.sh: dependencies, configure, build) and runs the test suite with CTest.
# GPU tests skip themselves on a machine without a CUDA device. Exit status: CTest's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"

build_dir=${DYNGRAD_BUILD_DIR:-build}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
exec ctest --test-dir "$build_dir" --output-on-failure -j"${DYNGRAD_JOBS:-$(nproc)}"
