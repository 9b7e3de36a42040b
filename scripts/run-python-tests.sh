#!/usr/bin/env bash
# The Python package's stage of scripts/run-tests.sh: a fresh virtual environment, the package built and
# installed into it by pip from python/ (linking the library of the CMake build instead of compiling it a
# second time: DYNGRAD_PREBUILT_DIR), then pytest on python/tests, which includes a one-epoch --limit CPU
# run of python/examples/train_fashion_mnist.py. GPU tests skip visibly without a device.
# Usage: scripts/run-python-tests.sh [build dir (default: build, as scripts/setup.sh builds)]
# Environment: DYNGRAD_PIP_ARGS  extra pip arguments (e.g. an index or --no-index --find-links for wheels).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-${DYNGRAD_BUILD_DIR:-build}}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
read -r -a pip_args <<<"${DYNGRAD_PIP_ARGS:-}"

[[ -e "$build_dir/CMakeCache.txt" ]] || { echo "run-python-tests: no CMake build in $build_dir (run scripts/setup.sh)"; exit 1; }
python=${PYTHON:-python3}
venv="$build_dir/python-venv"
prefix="$build_dir/python-prefix"

start=$SECONDS
rm -rf "$venv" "$prefix"
"$python" -m venv "$venv"
# The build requirements pinned in python/pyproject.toml, installed once here (no build isolation: the
# wheel's build then needs no network beyond this line).
"$venv/bin/pip" install --quiet "${pip_args[@]}" "scikit-build-core==0.10.7" "nanobind==2.4.0" numpy pytest
# The library, and the dist layer where the build has one (the package then installs both).
library_targets=(--target dyngrad)
[[ -d "$build_dir/CMakeFiles/dyngrad_dist.dir" ]] && library_targets+=(--target dyngrad_dist)
cmake --build "$build_dir" "${library_targets[@]}" -j"${DYNGRAD_JOBS:-$(nproc)}"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
DYNGRAD_PREBUILT_DIR="$prefix" "$venv/bin/pip" install --quiet --no-build-isolation "${pip_args[@]}" \
    -C build-dir="$build_dir/python-build" "$root/python"
echo "run-python-tests: package installed in $((SECONDS - start)) s"
# The training script's recipe is checked against the C++ dyngrad-train of the same build (when it was built).
[[ -x "$build_dir/samples/dyngrad-train" ]] && export DYNGRAD_TRAIN_BIN="$build_dir/samples/dyngrad-train"
# From outside the source tree, so that `import dyngrad` is the installed package.
cd "$build_dir"
"$venv/bin/python" -c "import dyngrad, sys; print('dyngrad', dyngrad.__version__, 'CUDA:', dyngrad.cuda_compiled(), 'from', dyngrad.__file__)"
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests"
echo "run-python-tests: done in $((SECONDS - start)) s"
