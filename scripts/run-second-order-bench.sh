#!/usr/bin/env bash
# Issue 31's measurements in one command on a machine with a CUDA device and PyTorch:
#   1. builds dyngrad-second-order-bench and char_gpt (scripts/lib.sh's dg_build_bench; DYNGRAD_BUILD_DIR);
#   2. the Hessian-vector product of an MLP (4 layers, width 1024, batch 256) and a PINN training step: dyngrad
#      (bench/second_order_bench.cpp) against PyTorch's double backward and torch.func (bench/torch_second_order.py);
#   3. activation checkpointing on the character-level GPT in bf16 (char_gpt's default model, 6 layers, width 384,
#      context 256, batch 64): the same run without and with --checkpoint-activations, each STEPS steps on a text
#      made of this repository's docs and sources (the lent machines have no corpus); peak memory and the step's own
#      memory from char_gpt's key=value lines, step time as the median over the steps after the 10th;
#   4. OUT_DIR/report.md (bench/second_order_report.py).
#
#   scripts/run-second-order-bench.sh [OUT_DIR] [--steps 60] [--quick]
#
# --quick: small sizes and few repetitions, a check of the plumbing (runs on the CPU when there is no GPU; not
# recorded). DYNGRAD_PREBUILT=DIR: use DIR's programs instead of building. DYNGRAD_RECORD=docs writes performance/second-order-GPU.md and .json (scripts/lib.sh, dg_record).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
dg_command="scripts/run-second-order-bench.sh $*"
out_arg=second-order-results
if (($# > 0)) && [[ "$1" != --* ]]; then out_arg=$1; shift; fi
steps=60
quick=0
while (($# > 0)); do
    case "$1" in
        --steps) steps=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "run-second-order-bench.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ "$steps" =~ ^[0-9]+$ ]] && ((steps > 10)) || { echo "run-second-order-bench.sh: --steps must exceed 10" >&2; exit 2; }
dg_out_dir "$out_arg" || exit 1
status=0
if [[ -n "${DYNGRAD_PREBUILT:-}" ]]; then
    build=$DYNGRAD_PREBUILT  # a build that has both programs already (e.g. the tests' CPU build, for --quick)
else
    dg_build_bench dyngrad-second-order-bench char_gpt || exit 1
fi
device=cpu
dg_gpu_visible && device=cuda
sizes=()
gpt_model=()
if ((quick)); then
    sizes=(--quick --width 64 --batch 16 --points 128 --hidden 16 --repetitions 3)
    gpt_model=(--layers 2 --heads 2 --width 64 --context 64 --batch 8)
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} > "$out/env.txt" 2>&1

dg_bench_side "dyngrad: H·v and the PINN step" "$out/dyngrad.txt" \
    "$build/bench/dyngrad-second-order-bench" --device "$device" "${sizes[@]}" --json "$out/dyngrad.json"
dg_bench_side "PyTorch: double backward, torch.func, the PINN step" "$out/torch.txt" \
    "$python" "$root/bench/torch_second_order.py" --device "$device" "${sizes[@]}" --json "$out/torch.json"

mkdir -p "$out/text"
cat "$root"/docs/*.md "$root"/ops/*.cpp "$root"/ops/*.h "$root"/nn/*.cpp "$root"/graph/*.cpp > "$out/text/corpus.txt"
for setting in plain checkpointed; do
    extra=()
    [[ $setting == checkpointed ]] && extra=(--checkpoint-activations)
    dg_bench_side "char GPT, bf16, $setting" "$out/gpt-$setting.txt" \
        "$build/samples/char_gpt" --data "$out/text" --device "$device" --precision bf16 --steps "$steps" \
        --warmup 5 --eval-every "$steps" --eval-batches 2 --sample 0 --seed 0 "${gpt_model[@]}" "${extra[@]}" \
        --csv "$out/gpt-$setting.csv"
done

"$python" "$root/bench/second_order_report.py" "$out" > "$out/report.md" || status=1
cat "$out/report.md"
why_not=""
((quick)) && why_not="--quick"
[[ $device == cuda ]] || why_not="no GPU"
kind=$(dg_gpu_kind)
dg_records "$why_not" "$out/report.md" "performance/second-order-$kind.md" \
    "$out/report.json" "performance/second-order-$kind.json" || status=1
exit $status
