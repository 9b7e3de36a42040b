#!/usr/bin/env bash
# Data-parallel scaling on one host's GPUs (issues 18, 30): builds dyngrad-dist-bench and, for every GPU count,
# runs it (mpirun) and bench/torch_ddp.py (torchrun, PyTorch over NCCL) on the same workloads: the MLP 4096x4 in
# f32 and TF32, lenet b256 and the character GPT in bf16 under DDP, then the sharded rows (dyngrad: DDP with AdamW
# and ZeRO-1/2, --zero 0,1,2, and ZeRO-3 in runs of their own, --zero 3, --zero 3 --no-zero-prefetch and --zero 3 --zero-recompute; PyTorch: DDP with AdamW and FSDP2, --fsdp). bench/dist_report.py writes
# OUT/report.md: per row and GPU count the step time, throughput, scaling efficiency samples/s(N) / (N x
# samples/s(1)), dyngrad's step time against PyTorch's, the time without overlapping the all-reduce; the all-reduce
# bus bandwidth of both by message size per count; step time and peak memory of DDP, ZeRO-1/2/3 and FSDP2; the
# DDP step captured into a CUDA graph (--capture, a run of its own: its time, efficiency and ratio to the eager
# step); and OUT/scaling.png (efficiency against N) when matplotlib imports. DDP runs with gradient_as_bucket_view on both
# sides (each gradient a view into its all-reduced bucket: no copy back).
#   scripts/run-dist-bench.sh OUT [--gpus "1 2 4"] [--plan]
#       (default counts: 1, 2 and the machine's GPU count from nvidia-smi when larger; --plan prints the counts
#        and the runs, and stops; environment: DYNGRAD_BUILD_DIR (default build-dist), PYTHON, STEPS, RUN_TIMEOUT,
#        DYNGRAD_DIST_BENCH: a dyngrad-dist-bench already built, used as it is: nothing configured or built)
# A failed run (one engine, one count; or one still running after RUN_TIMEOUT seconds, default 300: a hung
# collective) is reported and the others go on; the script then exits 1 and records nothing.
# DYNGRAD_RECORD=docs (scripts/lib.sh, dg_record) writes performance/dist-bench-<GPU>x<largest count>.md (report.md)
# and the PNG beside it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dg_command="scripts/run-dist-bench.sh $*"
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
usage="usage: scripts/run-dist-bench.sh OUT [--gpus \"1 2 4\"] [--plan]"
out=${1:?$usage}
shift
counts=""
plan=0
while (($#)); do
    case $1 in
        --gpus) counts=${2:?$usage}; shift 2 ;;
        --plan) plan=1; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
if [[ -z "$counts" ]]; then
    counts="1 2"
    available=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | wc -l)
    ((available > 2)) && counts+=" $available"
fi
for n in $counts; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "--gpus: '$n' is not a GPU count; $usage" >&2; exit 2; }
done
largest=$(tr ' ' '\n' <<<"$counts" | sort -n | tail -1)
build=${DYNGRAD_BUILD_DIR:-build-dist}
python=${PYTHON:-python3}
steps=${STEPS:-30}
run_timeout=${RUN_TIMEOUT:-300}
mpi_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
bench=${DYNGRAD_DIST_BENCH:-$build/bench/dyngrad-dist-bench}
if ((plan)); then
    echo "counts: $counts"
    for n in $counts; do
        echo "dyngrad_$n, dyngrad_zero_$n (--zero 0,1,2), dyngrad_zero3_$n (--zero 3), dyngrad_zero3np_$n (--zero 3 --no-zero-prefetch), dyngrad_zero3r_$n (--zero 3 --zero-recompute), dyngrad_capture_$n (--capture): mpirun -np $n ${mpi_flags[*]} -x NCCL_NVLS_ENABLE $bench --steps $steps --gradient-as-bucket-view"
        echo "torch_$n, torch_fsdp_$n (--fsdp): $python -m torch.distributed.run --standalone --nproc-per-node $n bench/torch_ddp.py --steps $steps --gradient-as-bucket-view"
    done
    echo "record: performance/dist-bench-$(dg_gpu_kind)x$largest.md"
    exit 0
fi
mkdir -p "$out"

if [[ -z "${DYNGRAD_DIST_BENCH:-}" ]]; then
    cuda_architectures=$(dg_cuda_architectures_arg)
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${cuda_architectures:+"$cuda_architectures"} >"$out/configure.log"
    cmake --build "$build" -j"$(nproc)" --target dyngrad-dist-bench >"$out/build.log"
fi

failed=()
# One run into OUT/NAME.txt; a failure or a time-out is noted and the others go on.
run() {
    local name=$1
    shift
    echo "==> $name"
    if ! timeout --kill-after=10 "$run_timeout" "$@" 2>&1 | tee "$out/$name.txt"; then
        failed+=("$name")
        mv "$out/$name.txt" "$out/$name.failed.txt"
    fi
}
for n in $counts; do
    dyngrad=(mpirun -np "$n" "${mpi_flags[@]}" -x NCCL_NVLS_ENABLE "$bench" --steps "$steps" --gradient-as-bucket-view)
    torch=("$python" -m torch.distributed.run --standalone --nproc-per-node "$n" bench/torch_ddp.py --steps "$steps"
           --gradient-as-bucket-view)
    run "dyngrad_$n" "${dyngrad[@]}"
    run "torch_$n" "${torch[@]}"
    run "dyngrad_zero_$n" "${dyngrad[@]}" --zero 0,1,2
    run "dyngrad_zero3_$n" "${dyngrad[@]}" --zero 3
    run "dyngrad_zero3np_$n" "${dyngrad[@]}" --zero 3 --no-zero-prefetch
    run "dyngrad_zero3r_$n" "${dyngrad[@]}" --zero 3 --zero-recompute
    run "torch_fsdp_$n" "${torch[@]}" --fsdp
    run "dyngrad_capture_$n" "${dyngrad[@]}" --capture
done

# shellcheck disable=SC2086  # the counts are separate arguments
"$python" bench/dist_report.py "$out" $counts
if ((${#failed[@]})); then
    echo "run-dist-bench: failed: ${failed[*]} (their output: $out/NAME.failed.txt); nothing recorded" >&2
    exit 1
fi
record="performance/dist-bench-$(dg_gpu_kind)x$largest"
dg_record "$out/report.md" "$record.md"
[[ -f "$out/scaling.png" ]] && dg_record "$out/scaling.png" "$record.png"
exit 0
