#!/usr/bin/env bash
# What DDP's gradient compression (DDPOptions::compression, char_gpt --ddp-compression) costs the loss: the same
# character GPT trained three times by `mpirun -np N char_gpt --distributed` from the same weights on the same
# batches, the gradients averaged in float32, in bf16 and in f16, and the training and validation losses set side
# by side (OUT/report.md: the validation losses at each evaluation, the mean training loss of the last 50 steps,
# and each compressed run's relative difference from the float32 one).
#   scripts/run-ddp-compression.sh OUT [--ranks N] [--device cpu|cuda] [--steps S]
# Defaults: 2 ranks on the CPU (MPI sums the 16-bit buffers with a user op; on CUDA NCCL averages them), 600 steps.
# The model: 4 layers, 4 heads, width 96, context 64, 16 windows a step (split over the ranks), AdamW 3e-3 with
# warm-up and cosine decay, dropout 0, seed 7, the fortunes corpus (DATA; without it the repository's docs/).
# build: DYNGRAD_BUILD_DIR (default build-cpu), built here unless DYNGRAD_CHAR_GPT names the program.
# DYNGRAD_RECORD=docs (scripts/lib.sh) writes OUT/report.md to performance/ddp-compression-<kind>.md (kind: the GPU,
# or "cpu").
dg_command="scripts/run-ddp-compression.sh $*"
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
usage="usage: scripts/run-ddp-compression.sh OUT [--ranks N] [--device cpu|cuda] [--steps S]"
out=${1:?$usage}
shift
ranks=2
device=cpu
steps=600
while (($#)); do
    case $1 in
        --ranks) ranks=${2:?$usage}; shift 2 ;;
        --device) device=${2:?$usage}; shift 2 ;;
        --steps) steps=${2:?$usage}; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
[[ "$ranks" =~ ^[1-9][0-9]*$ && "$ranks" -ge 2 ]] || { echo "--ranks: '$ranks' is not 2 or more; $usage" >&2; exit 2; }
[[ "$device" == cpu || "$device" == cuda ]] || { echo "--device: '$device' is not cpu or cuda; $usage" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ && "$steps" -ge 100 ]] || { echo "--steps: '$steps' is not 100 or more; $usage" >&2; exit 2; }
build=${DYNGRAD_BUILD_DIR:-build-cpu}
program=${DYNGRAD_CHAR_GPT:-$build/samples/char_gpt}
data=${DATA:-/usr/share/games/fortunes}
mkdir -p "$out"
if [[ ! -d "$data" ]]; then
    data="$out/corpus"
    mkdir -p "$data"
    cp docs/*.md "$data/"
fi
if [[ -z "${DYNGRAD_CHAR_GPT:-}" ]]; then
    cuda_architectures=""
    [[ "$device" == cuda ]] && cuda_architectures=$(dg_cuda_architectures_arg)
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${cuda_architectures:+"$cuda_architectures"} >"$out/configure.log"
    cmake --build "$build" -j"$(nproc)" --target char_gpt >"$out/build.log"
fi
mpi_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
eval_every=$((steps / 6))
model=(--layers 4 --heads 4 --width 96 --context 64 --batch 16 --steps "$steps" --lr 3e-3 --warmup 30 --min-lr 3e-4
       --dropout 0 --eval-every "$eval_every" --eval-batches 8 --sample 0 --seed 7 --device "$device" --distributed)
for way in f32 bf16 f16; do
    extra=()
    [[ "$way" == f32 ]] || extra=(--ddp-compression "$way")
    echo "==> $ranks ranks, gradients averaged in $way"
    mpirun -np "$ranks" "${mpi_flags[@]}" -x NCCL_NVLS_ENABLE=0 "$program" --data "$data" "${model[@]}" "${extra[@]}" \
        --csv "$out/$way.csv" >"$out/$way.txt" 2>&1 || { echo "the $way run failed (see $out/$way.txt)" >&2; exit 1; }
done

# step,train_loss,val_loss,...: validation losses at each evaluation, and the mean training loss of the last 50 steps.
summary() {
    awk -F, 'NR > 1 { if ($3 != "") printf "%s %s\n", $1, $3; t[NR] = $2; last = NR }
             END { s = 0; n = 0; for (i = last - 49; i <= last; ++i) if (i > 1) { s += t[i]; ++n } printf "train %.6f\n", s / n }' "$1"
}
{
    echo "# DDP gradient compression: what it costs the loss"
    echo
    echo "\`mpirun -np $ranks char_gpt --distributed\` on $device, the same weights (seed 7) and batches three times:"
    echo "4 layers, 4 heads, width 96, context 64, 16 windows a step, $steps steps, AdamW 3e-3 (warm-up 30, cosine to"
    echo "3e-4), dropout 0. The gradients averaged in float32 (DDP's default) and compressed to bf16 and f16"
    echo "(\`--ddp-compression\`: each rank's bucket rounded to 16 bits, averaged in 16 bits, converted back)."
    echo
    echo "| | float32 | bf16 | relative | f16 | relative |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    paste -d' ' <(summary "$out/f32.csv") <(summary "$out/bf16.csv") <(summary "$out/f16.csv") | awk '
        { rel_b = ($4 - $2) / $2; rel_h = ($6 - $2) / $2
          label = ($1 == "train") ? "training loss, mean of the last 50 steps" : "validation loss, step " $1
          printf "| %s | %.4f | %.4f | %+.4f%% | %.4f | %+.4f%% |\n", label, $2, $4, 100 * rel_b, $6, 100 * rel_h }'
    # The largest relative difference of a step's training loss from the float32 run's, over all steps.
    worst() {
        paste -d, "$out/f32.csv" "$1" | awk -F, -v columns="$(head -1 "$out/f32.csv" | awk -F, '{print NF}')" '
            NR > 1 { d = ($(2 + columns) - $2) / $2; if (d < 0) d = -d; if (d > w) { w = d; at = $1 } }
            END { printf "%.4f%% (step %d)", 100 * w, at }'
    }
    echo
    echo "Largest relative difference of a step's training loss from the float32 run's: bf16 $(worst "$out/bf16.csv"),"
    echo "f16 $(worst "$out/f16.csv")."
} >"$out/report.md"
cat "$out/report.md"
kind=$device
[[ "$device" == cuda ]] && kind=$(dg_gpu_kind)
dg_record "$out/report.md" "performance/ddp-compression-$kind.md"
