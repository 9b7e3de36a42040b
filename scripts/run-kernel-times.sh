#!/usr/bin/env bash
# Per-kernel device times of the small training steps of issue 33, both sides in one call (a GPU and PyTorch):
#   1. builds dyngrad-perf (scripts/lib.sh's dg_build_bench; DYNGRAD_BUILD_DIR, default build-perf/);
#   2. `dyngrad-perf --kernel-times --verbose-kernels` (CUPTI's trace, bench/kernel_trace.h) and
#      `bench/torch_reference.py --kernel-counts --verbose-kernels` (torch.profiler, the same CUPTI records), the same
#      workloads, eager and captured / eager and torch.compile + CUDA graph, STEPS steps each, every step alone;
#   3. OUT_DIR/report.md (bench/kernel_times_report.py): per workload the kernels per step, their summed time, the
#      device's busy time, the span from the first kernel's start to the last one's end and the idle time in it.
#
#   scripts/run-kernel-times.sh [OUT_DIR] [--only NAME[,NAME...]] [--steps N]
#
# Default workloads: the captured rows of issue 33's table. DYNGRAD_PREBUILT=DIR: DIR/bench/dyngrad-perf instead
# of building. DYNGRAD_RECORD=docs writes performance/kernel-times-GPU.md (scripts/lib.sh, dg_record) for the
# default workloads and steps. Exit status: 0 when both sides and the report ran, 1 otherwise, 2 bad arguments.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
dg_command="scripts/run-kernel-times.sh $*"
out_arg=kernel-times-results
if (($# > 0)) && [[ "$1" != --* ]]; then out_arg=$1; shift; fi
only=lenet5_b1,lenet5_b64,lenet_b256,lenet5_b64_bf16,mlp4096_bf16,mlp784_b64,matmul_relu
steps=20
partial=0
while (($# > 0)); do
    case "$1" in
        --only) [[ $# -ge 2 && -n "$2" ]] || { echo "run-kernel-times.sh: --only needs a list" >&2; exit 2; }
                only=$2; partial=1; shift 2 ;;
        --steps) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "run-kernel-times.sh: --steps needs a positive count" >&2; exit 2; }
                 steps=$2; [[ "$steps" == 20 ]] || partial=1; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "run-kernel-times.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
dg_out_dir "$out_arg" || exit 1
status=0
if [[ -n "${DYNGRAD_PREBUILT:-}" ]]; then
    build=$DYNGRAD_PREBUILT
else
    dg_build_bench dyngrad-perf || exit 1
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
    echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "command: $dg_command"
} > "$out/env.txt"
dg_bench_side "dyngrad-perf --kernel-times" "$out/dyngrad.txt" \
    "$build/bench/dyngrad-perf" --kernel-times --verbose-kernels --kernel-steps "$steps" --only "$only"
dg_bench_side "torch_reference.py --kernel-counts" "$out/torch.txt" \
    "$python" "$root/bench/torch_reference.py" --kernel-counts --verbose-kernels --kernel-steps "$steps" \
    --modes eager,compiled --only "$only"
"$python" "$root/bench/kernel_times_report.py" "$out/dyngrad.txt" "$out/torch.txt" --env "$out/env.txt" \
    --out "$out/report.md" || status=1
((partial)) || dg_record "$out/report.md" "performance/kernel-times-$(dg_gpu_kind).md" || status=1
exit $status
