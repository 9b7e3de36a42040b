#!/usr/bin/env bash
# Prepares a fresh Debian/Ubuntu machine and builds dyngrad:
#   1. installs the build dependencies, the Fashion-MNIST data set (dyngrad-train's default) and the fortunes
#      text (char_gpt's default corpus) that are missing, with apt-get (as root, or through sudo);
#   2. configures (Release) and builds into build/ (not with --deps-only): everything, or only the targets named
#      with --target (scripts/run-verify.sh builds the library and dyngrad-verify alone).
# Usage: scripts/setup.sh [--deps-only | --target NAME...]
# The CUDA backend is compiled where nvidia-smi sees a GPU (and nvcc and cuDNN are found), or where
# DYNGRAD_CUDA=ON asks for it; elsewhere the build is CPU-only, as compiling the kernels for a machine that
# cannot run them is most of the build's time (scripts/lib.sh, dg_cuda_arg).
# Environment (all optional):
#   DYNGRAD_BUILD_DIR       build directory, relative to the repository root or absolute (default: build)
#   DYNGRAD_CUDA            ON, OFF or AUTO (CMake's own: whenever nvcc and cuDNN are found); default: ON where a
#                           GPU is seen, else OFF
#   DYNGRAD_CMAKE_ARGS      extra configure arguments, e.g. "-DDYNGRAD_BUILD_SAMPLES=OFF"
#   DYNGRAD_JOBS            parallel build jobs (default: nproc)
#   DYNGRAD_EXTRA_PACKAGES  more packages to install, e.g. "clang-14 libclang-rt-14-dev" (scripts/run-fuzz.sh)
#   DYNGRAD_CUDA_ARCHITECTURES  CUDA architectures (default: "native" where nvidia-smi sees a GPU, else
#                           CMakeLists.txt's default; scripts/lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

deps_only=0
targets=()
while (($# > 0)); do
    case "$1" in
        --deps-only) deps_only=1; shift ;;
        --target) [[ $# -ge 2 ]] || { echo "setup.sh: --target needs a name" >&2; exit 2; }
                  targets+=(--target "$2"); shift 2 ;;
        *) echo "setup.sh: unknown argument '$1' (usage: setup.sh [--deps-only | --target NAME...])" >&2; exit 2 ;;
    esac
done

# python3-venv and python3-dev: the Python package's stage (scripts/run-python-tests.sh);
# libopenmpi-dev and openmpi-bin: the distributed/ layer (MPI launch, NCCL-id exchange, CPU collectives);
# fortunes: the text samples/char_gpt trains on; ccache: rebuilds (the consumer tests' libraries, a second
# checkout) reuse what was compiled once; ninja-build: the generator (scripts/lib.sh, dg_configure_and_build).
packages=(build-essential cmake libeigen3-dev catch2 zlib1g-dev pkg-config dataset-fashion-mnist python3-venv python3-dev
          libopenmpi-dev openmpi-bin fortunes ccache ninja-build)
read -r -a extra_packages <<<"${DYNGRAD_EXTRA_PACKAGES:-}"
packages+=("${extra_packages[@]}")
dg_install_packages "${packages[@]}"

((deps_only)) && exit 0

read -r -a cmake_args <<<"${DYNGRAD_CMAKE_ARGS:-}"
build_dir=${DYNGRAD_BUILD_DIR:-build}
cuda_arg=$(dg_cuda_arg)
cuda_architectures=$(dg_cuda_architectures_arg)
dg_configure_and_build "$build_dir" --estimate "${targets[@]}" -- -DCMAKE_BUILD_TYPE=Release "$cuda_arg" \
    $(dg_launcher_args) ${cuda_architectures:+"$cuda_architectures"} "${cmake_args[@]}"
