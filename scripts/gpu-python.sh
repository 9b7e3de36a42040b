#!/usr/bin/env bash
# The Python package on the GPU machine (issue 14), for the lead: builds and installs the package over a
# CUDA build of the library, runs pytest (GPU tests included), trains LeNet on Fashion-MNIST for 10 epochs
# on cuda (the accuracy to record: >= 0.91), and runs the speed bench. Everything it prints is also logged
# under OUT. That machine has Python with torch, numpy, nanobind, scikit-build-core, pytest and cupy, and no
# network: pip runs with --no-build-isolation --no-deps.
#
# Usage: scripts/gpu-python.sh OUT [build] [test] [train] [bench]   (no phase: all four, in order)
# Each phase fits one device command (< 10 minutes); later phases reuse what `build` left in the build dir.
# Environment:
#   DYNGRAD_BUILD_DIR   a CUDA CMake build of the repository to reuse (default: build, when it is one);
#                       otherwise the library alone is built into build-gpu-python/lib
#   DYNGRAD_PERF_JSON   `dyngrad-perf --json` output of the same machine, for the C++ host-overhead figure
#   PYTHON              the interpreter (default: python3)
#   DYNGRAD_RECORD      a docs directory (scripts/lib.sh, dg_record): the bench phase also writes
#                       performance/python-bench-GPU.json there (bench_python.json)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dg_command="scripts/gpu-python.sh $*"
# The lent machine's default g++ (/opt/gcc) links libstdc++ statically into libdyngrad.so; inside Python, which has
# loaded the system libstdc++ already, two copies of the locale machinery then crash the first ostream (seen:
# segfault in describe_node). The distribution's compiler links the shared libstdc++ that Python uses too.
# (The machine's environment sets CXX to that compiler, so it is overridden; DYNGRAD_KEEP_CXX=1 keeps it.)
if [[ "${DYNGRAD_KEEP_CXX:-0}" != 1 && -x /usr/bin/g++ ]]; then
    export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
out=${1:?usage: scripts/gpu-python.sh OUT [build] [test] [train] [bench]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
phases=("$@")
((${#phases[@]})) || phases=(build test train bench)
python=${PYTHON:-python3}
work="$root/build-gpu-python"
site="$work/site"   # the installed package (pip --target), on PYTHONPATH for the later phases
mkdir -p "$work"

library_build() {
    local reuse=${DYNGRAD_BUILD_DIR:-build}
    [[ "$reuse" == /* ]] || reuse="$root/$reuse"
    if [[ -f "$reuse/CMakeCache.txt" ]] && grep -q '^CUDNN_LIBRARY:FILEPATH=/' "$reuse/CMakeCache.txt"; then
        echo "$reuse"
        return
    fi
    echo "$work/lib"
}

phase_build() {
    local lib start=$SECONDS
    lib=$(library_build)
    if [[ "$lib" == "$work/lib" ]]; then
        local launcher=()
        command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
        cmake -S "$root" -B "$lib" -DCMAKE_BUILD_TYPE=Release -DDYNGRAD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
            -DDYNGRAD_BUILD_TESTS=OFF -DDYNGRAD_BUILD_BENCH=OFF -DDYNGRAD_BUILD_SAMPLES=OFF "${launcher[@]}" || return 1
    fi
    echo "gpu-python: library build $lib"
    local targets=(--target dyngrad)
    [[ -d "$lib/CMakeFiles/dyngrad_dist.dir" ]] && targets+=(--target dyngrad_dist)
    cmake --build "$lib" "${targets[@]}" -j"$(nproc)" || return 1
    rm -rf "$work/prefix" "$site"
    cmake --install "$lib" --prefix "$work/prefix" >/dev/null || return 1
    DYNGRAD_PREBUILT_DIR="$work/prefix" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$python" -m pip install \
        --no-build-isolation --no-deps --target "$site" -C build-dir="$work/python-build" "$root/python" || return 1
    PYTHONPATH="$site" "$python" -c "import dyngrad as dg; print('dyngrad', dg.__version__, 'CUDA compiled:', \
dg.cuda_compiled(), 'devices:', dg.cuda_device_count(), dg.__file__)" || return 1
    echo "gpu-python: build + install $((SECONDS - start)) s"
}

phase_test() {
    (cd "$work" && PYTHONPATH="$site" "$python" -m pytest -rs -p no:cacheprovider --junitxml="$out/pytest.xml" \
        "$root/python/tests")
}

phase_train() {
    (cd "$work" && PYTHONPATH="$site" "$python" "$root/python/examples/train_fashion_mnist.py" --model lenet \
        --data "${DATA:-/usr/share/datasets/fashion-mnist}" --epochs 10 --device cuda --checkpoint "$work/lenet_fashion_mnist.safetensors" --min-accuracy 0.91)
}

phase_bench() {
    local cpp=()
    [[ -n "${DYNGRAD_PERF_JSON:-}" ]] && cpp=(--cpp-json "$DYNGRAD_PERF_JSON")
    (cd "$work" && PYTHONPATH="$site" "$python" "$root/python/bench/bench_python.py" --device cuda \
        --json "$out/bench_python.json" "${cpp[@]}") || return 1
    if [[ -n "${DYNGRAD_RECORD:-}" ]]; then
        . "$root/scripts/lib.sh"
        dg_record "$out/bench_python.json" "performance/python-bench-$(dg_gpu_kind).json"
    fi
}

failed=0
for phase in "${phases[@]}"; do
    case $phase in
        build | test | train | bench) ;;
        *) echo "gpu-python: unknown phase '$phase' (build, test, train, bench)"; exit 2 ;;
    esac
    echo "===== gpu-python: $phase"
    start=$SECONDS
    if "phase_$phase" 2>&1 | tee "$out/$phase.log"; then
        echo "===== $phase: passed ($((SECONDS - start)) s)" | tee -a "$out/$phase.log"
    else
        failed=$((failed + 1))
        echo "===== $phase: FAILED ($((SECONDS - start)) s)" | tee -a "$out/$phase.log"
    fi
done
((failed == 0))
