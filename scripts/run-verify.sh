#!/usr/bin/env bash
# The main job: builds the library and dyngrad-verify alone (scripts/setup.sh --target dyngrad-verify: the
# CUDA backend only where a GPU is seen or DYNGRAD_CUDA=ON asks for it) and runs dyngrad-verify, which checks
# every op of the op table by finite differences, float32 against float64 and, on a CUDA device, GPU against CPU.
# Arguments go to dyngrad-verify, e.g.  scripts/run-verify.sh --json verify.json   (--help lists them).
# Exit status: dyngrad-verify's (0 all checks passed, 1 a check failed, 2 usage error).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --target dyngrad-verify >&2  # keep stdout for the report

build_dir=${DYNGRAD_BUILD_DIR:-build}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
exec "$build_dir/tools/dyngrad-verify" "$@"
