#!/usr/bin/env bash
# Issue 32's side by side: GPT-2 small (124M, llm.c's `-e d12` shape) trained from random initialisation by llm.c
# (train_gpt2cu), PyTorch (bench/torch_gpt.py --model gpt2: eager and torch.compile) and dyngrad (samples/char_gpt
# --model gpt2) on the same token files (llm.c's format, written by dyngrad-tokens from the fortunes text), with
# the same micro-batch B x 1024 in bf16. Records tokens/s after warm-up, MFU, peak GPU memory, and the loss curves
# of dyngrad and PyTorch from identical weights and batches (bench/torch_gpt.py --prepare writes both), as
# OUT_DIR/report.json, report.md and gpt2_loss_curves.png (bench/gpt2_report.py; matplotlib for the PNG).
#
#   LLMC_DIR=/path/to/llm.c scripts/run-gpt2-bench.sh OUT_DIR [--phase NAME]... [--batch 32] [--steps 60]
#                                                     [--compare-steps 300] [--tiny]
#
# Phases, in this order when none is named (each sized for one command of at most 10 minutes on an H100/H200;
# a later phase reads what the earlier ones left in OUT_DIR, so run them one by one on a lent machine):
#   build-dyngrad  char_gpt and dyngrad-tokens with CUDA (scripts/lib.sh's dg_build_bench; DYNGRAD_BUILD_DIR)
#   build-llmc     train_gpt2cu in LLMC_DIR: with cuDNN attention when CUDNN_FRONTEND_PATH names cudnn-frontend's
#                  include directory and that build succeeds, else without; OUT_DIR/llmc_build.txt says which.
#                  CUDA 13 changed cudaMemAdvise's last argument: the carried copy is patched (docs in
#                  /work/shared/docs/peers.md); LLMC_DIR is llm.c's source fetched by the lead, never the project's.
#   tokens         OUT_DIR/tokens/{train,val}.bin: the fortunes text (--text, default /usr/share/games/fortunes)
#                  as the 256 bytes + the 50001 most frequent words of the same text (vocabulary <= 50257, GPT-2's)
#   llmc           train_gpt2cu -e d12 -b B -t 1024, --steps steps (its bf16, master weights, AdamW 0.9/0.95)
#   torch          bench/torch_gpt.py --model gpt2, eager then --compile, --steps steps each
#   dyngrad        char_gpt --model gpt2 --device cuda, --steps steps
#   compare        torch_gpt.py --prepare (weights + batch order), then dyngrad and PyTorch eager from them for
#                  --compare-steps steps (bf16 both): the curves
#   report         bench/gpt2_report.py: report.json, report.md, gpt2_loss_curves.png
#
# --batch B      the micro-batch (default 32; llm.c's published runs use 64 on 80 GB)
# --steps N      the throughput runs' steps (default 60); the first 10 are warm-up, not timed
# --tiny         a 2-layer, width-64, context-64 model with batch 4 on the CPU (dyngrad and PyTorch only: a check
#                of this script's plumbing; llm.c's phases are skipped)
# Environment: PYTHON (default python3, with torch; matplotlib for the PNG), LLMC_DIR, CUDNN_FRONTEND_PATH,
# CHAR_GPT / DYNGRAD_TOKENS (binaries to use instead of building), GPU_PEAK_TFLOPS (default 989: H100/H200 dense bf16).
# shellcheck disable=SC2317  # the phase functions are called by name ("phase_${phase//-/_}")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: scripts/run-gpt2-bench.sh OUT_DIR [--phase NAME]... [--batch B] [--steps N] [--compare-steps N] [--tiny] [--text PATH]"
out=${1:?$usage}
shift
phases=()
batch=32
steps=60
compare_steps=300
tiny=0
text=/usr/share/games/fortunes
while (($# > 0)); do
    case "$1" in
        --phase) phases+=("$2"); shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --compare-steps) compare_steps=$2; shift 2 ;;
        --tiny) tiny=1; shift ;;
        --text) text=$2; shift 2 ;;
        *) echo "run-gpt2-bench.sh: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
    esac
done
all_phases=(build-dyngrad build-llmc tokens llmc torch dyngrad compare report)
((${#phases[@]})) || phases=("${all_phases[@]}")
for phase in "${phases[@]}"; do
    [[ " ${all_phases[*]} " == *" $phase "* ]] || { echo "run-gpt2-bench.sh: unknown phase '$phase' (${all_phases[*]})" >&2; exit 2; }
done
for number in "$batch" "$steps" "$compare_steps"; do
    [[ "$number" =~ ^[1-9][0-9]*$ ]] || { echo "run-gpt2-bench.sh: '$number' is not a positive integer" >&2; exit 2; }
done
((steps > 10)) || { echo "run-gpt2-bench.sh: --steps must exceed the 10 warm-up steps" >&2; exit 2; }
mkdir -p "$out/tokens"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
build=${DYNGRAD_BUILD_DIR:-build-perf}
[[ "$build" == /* ]] || build="$root/$build"
char_gpt=${CHAR_GPT:-$build/samples/char_gpt}
tokens_tool=${DYNGRAD_TOKENS:-$build/samples/dyngrad-tokens}

# The model and schedule every engine trains: GPT-2 small (--tiny: a CPU-sized one), llm.c's AdamW (lr 6e-4,
# betas 0.9/0.95, weight decay 0.1, clip 1), no dropout, bf16 autocast with f32 master weights.
if ((tiny)); then
    device=cpu
    model=(--layers 2 --heads 2 --width 64 --context 64)
    batch=4
    context=64
else
    device=cuda
    model=(--layers 12 --heads 12 --width 768 --context 1024)
    context=1024
fi
warmup=10
schedule=(--lr 6e-4 --min-lr 6e-5 --weight-decay 0.1 --clip 1 --dropout 0 --seed 0 --precision bf16)
data=(--train-tokens "$out/tokens/train.bin" --val-tokens "$out/tokens/val.bin" --vocab 50257)

# Runs a command with nvidia-smi sampling the GPU's used memory every 200 ms (when there is one): the peak, in MiB,
# goes to $out/NAME.memory; the command's output to $out/NAME.txt (and the terminal).
measured() {
    local name=$1 sampler="" status
    shift
    rm -f "$out/$name.samples"
    if command -v nvidia-smi >/dev/null && [[ $device == cuda ]]; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 >"$out/$name.samples" &
        sampler=$!
    fi
    PYTHONUNBUFFERED=1 "$@" 2>&1 | tee "$out/$name.txt"
    status=${PIPESTATUS[0]}
    if [[ -n $sampler ]]; then
        kill "$sampler" 2>/dev/null
        wait "$sampler" 2>/dev/null
        sort -n "$out/$name.samples" | tail -1 >"$out/$name.memory"
    fi
    return "$status"
}

phase_build_dyngrad() {
    . "$root/scripts/lib.sh"
    dg_build_bench char_gpt dyngrad-tokens
}

phase_build_llmc() {
    ((tiny)) && { echo "(--tiny: llm.c skipped)"; return 0; }
    [[ -n "${LLMC_DIR:-}" && -f "$LLMC_DIR/train_gpt2.cu" ]] ||
        { echo "run-gpt2-bench.sh: LLMC_DIR must name llm.c's source (train_gpt2.cu), got '${LLMC_DIR:-}'" >&2; return 1; }
    local cuda_major flags=(NVCC_LDFLAGS="-lcublas -lcublasLt -lnvidia-ml -lcudnn -lnvrtc -lcuda")
    cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    if ((cuda_major >= 13)) && grep -q "cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId" "$LLMC_DIR/llmc/cuda_utils.cuh"; then
        echo "==> patching the carried llm.c for CUDA $cuda_major (cudaMemAdvise takes a cudaMemLocation)"
        sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0}/' \
            "$LLMC_DIR/llmc/cuda_utils.cuh"
    fi
    (cd "$LLMC_DIR" && rm -f train_gpt2cu)
    # llm.c's Makefile enables cuDNN only when $HOME/cudnn-frontend/include or ./cudnn-frontend/include exists, whatever
    # CUDNN_FRONTEND_PATH says: give it a HOME whose cudnn-frontend/include is the carried one.
    local frontend_home=""
    if [[ -n "${CUDNN_FRONTEND_PATH:-}" && -f "$CUDNN_FRONTEND_PATH/cudnn_frontend.h" ]]; then
        frontend_home=$(mktemp -d)
        mkdir -p "$frontend_home/cudnn-frontend"
        ln -s "$(cd "$CUDNN_FRONTEND_PATH" && pwd)" "$frontend_home/cudnn-frontend/include"
    fi
    if [[ -n "$frontend_home" ]] &&
        (cd "$LLMC_DIR" && HOME="$frontend_home" make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 \
            CUDNN_FRONTEND_PATH="$frontend_home/cudnn-frontend/include" "${flags[@]}") \
            >"$out/llmc_build.log" 2>&1; then
        echo "cudnn=1" >"$out/llmc_build.txt"
    elif (cd "$LLMC_DIR" && make train_gpt2cu NO_MULTI_GPU=1 NVCC_LDFLAGS="-lcublas -lcublasLt -lnvidia-ml") \
            >>"$out/llmc_build.log" 2>&1; then
        echo "cudnn=0" >"$out/llmc_build.txt"
    else
        echo "run-gpt2-bench.sh: llm.c did not build (log: $out/llmc_build.log)" >&2
        return 1
    fi
    echo "==> train_gpt2cu built ($(cat "$out/llmc_build.txt"))"
}

phase_tokens() {
    "$tokens_tool" --text "$text" --out "$out/tokens/train.bin" --val-out "$out/tokens/val.bin" --vocab words \
        --words 50001 --reference "$text" | tee "$out/tokens.txt"
}

phase_llmc() {
    ((tiny)) && { echo "(--tiny: llm.c skipped)"; return 0; }
    # -v/-m: one validation batch at the start and the end only; -s 0: no sampling; -n 0: no checkpoints.
    measured llmc "$LLMC_DIR/train_gpt2cu" -i "$out/tokens/train.bin" -j "$out/tokens/val.bin" -e d12 -b "$batch" \
        -t "$context" -x "$steps" -l 6e-4 -u "$warmup" -q 0.1 -c 0.1 -v "$steps" -m 1 -s 0 -n 0
}

phase_torch() {
    local compiled
    for compiled in "" --compile; do
        measured "torch${compiled:+_compile}" "$python" "$root/bench/torch_gpt.py" --model gpt2 "${model[@]}" \
            "${data[@]}" "${schedule[@]}" --batch "$batch" --steps "$steps" --warmup "$warmup" --eval-every "$steps" \
            --eval-batches 1 --device "$device" --csv "$out/torch${compiled:+_compile}.csv" ${compiled:+"$compiled"} || return 1
    done
}

phase_dyngrad() {
    measured dyngrad "$char_gpt" --model gpt2 "${model[@]}" "${data[@]}" "${schedule[@]}" --batch "$batch" \
        --steps "$steps" --warmup "$warmup" --eval-every "$steps" --eval-batches 1 --device "$device" \
        --csv "$out/dyngrad.csv"
}

phase_compare() {
    local config=(--model gpt2 "${model[@]}" "${data[@]}" "${schedule[@]}" --batch "$batch" --steps "$compare_steps"
                  --warmup 30 --eval-every 50 --eval-batches 4)
    "$python" "$root/bench/torch_gpt.py" "${config[@]}" --prepare "$out/prepared" || return 1
    local shared=(--init-weights "$out/prepared/init.safetensors" --batch-order "$out/prepared/batch_order.txt")
    measured compare_dyngrad "$char_gpt" "${config[@]}" "${shared[@]}" --device "$device" \
        --csv "$out/compare_dyngrad.csv" || return 1
    measured compare_torch "$python" "$root/bench/torch_gpt.py" "${config[@]}" "${shared[@]}" --device "$device" \
        --csv "$out/compare_torch.csv"
}

phase_report() {
    local width=768 layers=12
    ((tiny)) && width=64 layers=2
    GPU_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-989} "$python" "$root/bench/gpt2_report.py" "$out" --batch "$batch" \
        --context "$context" --layers "$layers" --width "$width" --vocab 50257 --warmup-steps "$warmup" |
        tee "$out/report.md"
}

status=0
for phase in "${phases[@]}"; do
    echo "==> phase $phase"
    "phase_${phase//-/_}" || { echo "run-gpt2-bench.sh: phase $phase failed" >&2; status=1; }
done
exit $status
