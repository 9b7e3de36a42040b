#!/usr/bin/env bash
# Prepares a fresh Debian/Ubuntu machine and builds dyngrad:
#   1. installs the build dependencies, the Fashion-MNIST data set (dyngrad-train's default) and the fortunes
#      text (char_gpt's default corpus) that are missing, with apt-get (as root, or through sudo);
#   2. configures (Release) and builds into build/ (not with --deps-only).
# The CUDA backend is compiled when nvcc and cuDNN are found; without them the build is CPU-only.
# Environment (all optional):
#   DYNGRAD_BUILD_DIR       build directory, relative to the repository root or absolute (default: build)
#   DYNGRAD_CMAKE_ARGS      extra configure arguments, e.g. "-DDYNGRAD_CUDA=OFF"
#   DYNGRAD_JOBS            parallel build jobs (default: nproc)
#   DYNGRAD_EXTRA_PACKAGES  more packages to install, e.g. "clang-14 libclang-rt-14-dev" (scripts/run-fuzz.sh)
#   DYNGRAD_CUDA_ARCHITECTURES  CUDA architectures (default: "native" where nvidia-smi sees a GPU, else
#                           CMakeLists.txt's default; scripts/lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

# python3-venv and python3-dev: the Python package's stage (scripts/run-python-tests.sh);
# libopenmpi-dev and openmpi-bin: the dist/ layer (MPI launch, NCCL-id exchange, CPU collectives);
# fortunes: the text samples/char_gpt trains on.
packages=(build-essential cmake libeigen3-dev catch2 zlib1g-dev pkg-config dataset-fashion-mnist python3-venv python3-dev
          libopenmpi-dev openmpi-bin fortunes)
read -r -a extra_packages <<<"${DYNGRAD_EXTRA_PACKAGES:-}"
packages+=("${extra_packages[@]}")
dg_install_packages "${packages[@]}"

[[ "${1:-}" == "--deps-only" ]] && exit 0

read -r -a cmake_args <<<"${DYNGRAD_CMAKE_ARGS:-}"
cuda_architectures=$(dg_cuda_architectures_arg)
dg_configure_and_build "${DYNGRAD_BUILD_DIR:-build}" -- -DCMAKE_BUILD_TYPE=Release \
    ${cuda_architectures:+"$cuda_architectures"} "${cmake_args[@]}"
