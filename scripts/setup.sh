#!/usr/bin/env bash
# Prepares a fresh Debian/Ubuntu machine and builds dyngrad:
#   1. installs the build dependencies and the Fashion-MNIST data set (dyngrad-train's default) that are
#      missing, with apt-get (as root, or through sudo);
#   2. configures (Release) and builds into build/ (not with --deps-only).
# The CUDA backend is compiled when nvcc and cuDNN are found; without them the build is CPU-only.
# Environment (all optional):
#   DYNGRAD_BUILD_DIR       build directory, relative to the repository root or absolute (default: build)
#   DYNGRAD_CMAKE_ARGS      extra configure arguments, e.g. "-DDYNGRAD_CUDA=OFF"
#   DYNGRAD_JOBS            parallel build jobs (default: nproc)
#   DYNGRAD_EXTRA_PACKAGES  more packages to install, e.g. "clang-14 libclang-rt-14-dev" (scripts/run-fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

packages=(build-essential cmake libeigen3-dev catch2 zlib1g-dev pkg-config dataset-fashion-mnist)
read -r -a extra_packages <<<"${DYNGRAD_EXTRA_PACKAGES:-}"
packages+=("${extra_packages[@]}")

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    echo "setup.sh: this script needs Debian or Ubuntu (dpkg-query and apt-get);" \
         "elsewhere install g++ >= 12, CMake >= 3.24, Eigen 3.4, Catch2, zlib and pkg-config yourself" >&2
    exit 1
fi

missing=()
for package in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$package")
done

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo env DEBIAN_FRONTEND=noninteractive "$@"
    else
        echo "setup.sh: installing ${missing[*]} needs root: run as root or install sudo" >&2
        exit 1
    fi
}

if ((${#missing[@]} > 0)); then
    echo "==> installing ${missing[*]}"
    as_root apt-get update
    as_root apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "==> build dependencies present: ${packages[*]}"
fi

[[ "${1:-}" == "--deps-only" ]] && exit 0

build_dir=${DYNGRAD_BUILD_DIR:-build}
read -r -a cmake_args <<<"${DYNGRAD_CMAKE_ARGS:-}"
echo "==> configuring $build_dir"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}"
echo "==> building $build_dir"
cmake --build "$build_dir" --parallel "${DYNGRAD_JOBS:-$(nproc)}"
