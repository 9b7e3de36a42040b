#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer with leak detection:
#   1. configures and builds build-asan/ (CPU only, RelWithDebInfo at -O1 -g1, -DDYNGRAD_SANITIZE=address,undefined:
#      the library and every test, bench and sample are instrumented);
#   2. runs every CPU test through CTest, except the consumer tests (label consumer: they build uninstrumented
#      projects, against the instrumented library or with a library of their own) and the bench scripts' plumbing
#      checks (label script: gpt2_bench_tiny took 178 s under the sanitizers on 2 cores, and the programs it runs
#      are the ones the char_gpt tests run instrumented here);
#   3. trains lenet for 200 steps with dyngrad-soak on the CPU: heap in use after step 100 and after the
#      last step must be equal, and LeakSanitizer checks for leaks at exit.
# Any sanitizer finding fails the test or program that triggered it. Dependencies: scripts/setup.sh.
# Environment (optional): DYNGRAD_ASAN_BUILD_DIR (default build-asan), DYNGRAD_JOBS (default nproc),
# DYNGRAD_SOAK_STEPS (default 200: the 100 steps after the check point show a leak of a few bytes a step).
# Exit status: 0 when everything passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. "$root/scripts/lib.sh"
"$root/scripts/setup.sh" --deps-only

build_dir=${DYNGRAD_ASAN_BUILD_DIR:-build-asan}
jobs=${DYNGRAD_JOBS:-$(nproc)}
# allocator_may_return_null: a host allocation no machine can meet must reach the library as a null pointer,
# which it turns into OutOfMemory (tests/reliability/test_size_limits.cpp); ASan would otherwise abort the test there.
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
export ASAN_OPTIONS=$ASAN_OPTIONS:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

echo "==> $build_dir: AddressSanitizer + UndefinedBehaviorSanitizer, CPU only"
# -g1 (line tables only): a sanitizer report still names file and line of every frame, and the build takes about
# a third less time than with full debug information (variables and types), which only a debugger would read.
# Everything is built in one call, the libraries as unity units (DYNGRAD_UNITY_LIBRARY), the programs each file
# alone: a unity build of only the programs run here (one `--target` each) took 967 s instead of 638 s on a 2-core
# machine with Makefiles — they build listed targets one after another, and a program of one or two unity files
# keeps one core idle (docs/reliability.md, "CI time"); Ninja, where installed, schedules all files together.
# The test programs' own files at -O0 (DYNGRAD_TEST_OPTIMIZATION): instrumented, they compiled in half the time of
# -O1; the library they exercise stays at -O1.
dg_configure_and_build "$build_dir" -- -DCMAKE_BUILD_TYPE=RelWithDebInfo $(dg_launcher_args) -DDYNGRAD_UNITY_LIBRARY=ON \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DDYNGRAD_CUDA=OFF -DDYNGRAD_SANITIZE=address,undefined \
      -DDYNGRAD_TEST_OPTIMIZATION=-O0

echo "==> CPU tests under ASan + UBSan"
status=0
# The tests that mpirun launches, found from their commands (every test whose command names mpirun or mpiexec),
# so a new MPI test needs no list here.
mpi_launched=$(ctest --test-dir "$build_dir" --show-only=json-v1 | python3 -c '
import json, re, sys
tests = json.load(sys.stdin)["tests"]
names = [t["name"] for t in tests if any(re.search(r"mpi(run|exec)", part) for part in t.get("command", []))]
print("^(" + "|".join(re.escape(n) for n in names) + ")$" if names else "^$")')
ctest --test-dir "$build_dir" --output-on-failure -j"$jobs" -L cpu -LE "consumer|script" -E "$mpi_launched" || status=1
# The tests mpirun launches run with leak detection off: OpenMPI's runtime leaks its own buffers (calloc in
# MCA components it unloads, ompi_op_base_op_select), which LeakSanitizer reports with no dyngrad frame.
# Address and undefined-behaviour checks stay on.
ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} \
    ctest --test-dir "$build_dir" --output-on-failure -j"$jobs" -LE "consumer|script" -R "$mpi_launched" || status=1

echo "==> dyngrad-soak on the CPU under ASan + UBSan"
"$build_dir/bench/dyngrad-soak" --device cpu --steps "${DYNGRAD_SOAK_STEPS:-200}" || status=1
exit $status
