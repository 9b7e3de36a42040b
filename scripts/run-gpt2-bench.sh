#!/usr/bin/env bash
# Issue 32's side by side: GPT-2 small (124M, llm.c's `-e d12` shape) trained from random initialisation by llm.c
# (train_gpt2cu), PyTorch (bench/torch_gpt.py --model gpt2: eager and torch.compile) and dyngrad (samples/char_gpt
# --model gpt2) on the same token files (llm.c's format, written by dyngrad-tokens from the fortunes text), with
# the same micro-batch B x 1024 in bf16. Records tokens/s after warm-up, MFU, peak GPU memory, and the loss curves
# of dyngrad and PyTorch from identical weights and batches (bench/torch_gpt.py --prepare writes both), as
# OUT_DIR/report.json, report.md and gpt2_loss_curves.png (bench/gpt2_report.py; matplotlib for the PNG).
#
#   LLMC_DIR=/path/to/llm.c scripts/run-gpt2-bench.sh OUT_DIR [--phase NAME]... [--batch 32] [--steps 60]
#                                                     [--compare-steps 300] [--gpus 4] [--tiny]
#
# Phases, in this order when none is named (each sized for one command of at most 10 minutes on an H100/H200;
# a later phase reads what the earlier ones left in OUT_DIR, so run them one by one on a lent machine):
#   build-dyngrad  char_gpt and dyngrad-tokens with CUDA (scripts/lib.sh's dg_build_bench; DYNGRAD_BUILD_DIR)
#   build-llmc     train_gpt2cu in LLMC_DIR: with cuDNN attention when CUDNN_FRONTEND_PATH names cudnn-frontend's
#                  include directory and that build succeeds, else without; OUT_DIR/llmc_build.txt says which.
#                  CUDA 13 changed cudaMemAdvise's last argument: the carried copy is patched (docs in
#                  /work/shared/docs/peers.md); LLMC_DIR is llm.c's source fetched by the lead, never the project's.
#                  One GPU: built with NO_MULTI_GPU=1.
#   build-llmc-multi  the same as LLMC_DIR/train_gpt2cu_multi with NCCL and MPI (OPENMPI_DIR, default Debian's
#                  /usr/lib/x86_64-linux-gnu/openmpi; NCCL_INCLUDE_DIR, default /usr/include): -DMULTI_GPU and -lnccl
#                  given whether or not llm.c's Makefile finds NCCL through dpkg; OUT_DIR/llmc_multi_build.txt.
#   tokens         OUT_DIR/tokens/{train,val}.bin: the fortunes text (--text, default /usr/share/games/fortunes)
#                  as the 256 bytes + the 50001 most frequent words of the same text (vocabulary <= 50257, GPT-2's);
#                  the later phases only read those two files, so on a GPU machine without the text (the lent
#                  ones have none) run this phase where the text is and carry OUT_DIR/tokens over
#   llmc           train_gpt2cu -e d12 -b B -t 1024, --steps steps (its bf16, master weights, AdamW 0.9/0.95)
#   llmc-multi     train_gpt2cu_multi under `mpirun --allow-run-as-root -np G` (G: --gpus), each rank micro-batch B
#                  (llm.c's total batch B x 1024 x G): its throughput is summed over the ranks
#   torch          bench/torch_gpt.py --model gpt2, eager then --compile, --steps steps each
#   dyngrad        char_gpt --model gpt2 --device cuda, --steps steps
#   dyngrad-multi  char_gpt --model gpt2 --distributed (DDP over NCCL) under `mpirun --allow-run-as-root -np G`,
#                  --batch B x G (each rank takes B windows a step, as in the one-GPU run)
#   reproducible   char_gpt as the dyngrad phase, three times: --deterministic, without, --deterministic again
#                  (the same seed); OUT_DIR/reproducible.txt says whether the two --deterministic runs' loss fields
#                  (train_loss, val_loss of their CSVs, compared as text) are identical, whether their final
#                  parameters are (char_gpt's parameters_fnv1a= hash of their bytes), and each run's tokens/s
#   compare        torch_gpt.py --prepare (weights + batch order), then dyngrad and PyTorch eager from them for
#                  --compare-steps steps (bf16 both): the curves
#   torch-reduced  torch.compile with --reduced-residual (the residual stream and LayerNorms in bf16, as llm.c; the
#                  phases above run PyTorch's autocast recipe: both in f32, a cast into and out of every Linear)
#   dyngrad-reduced  char_gpt --reduced-residual, as the dyngrad phase
#   dyngrad-captured  char_gpt --reduced-residual --capture: the whole step one CUDA graph, replayed (not --tiny)
#   torch-reduced-graphs  torch.compile(mode="reduce-overhead") with --reduced-residual: Inductor's CUDA graphs, the
#                  twin of dyngrad-captured (PyTorch's optimizer step stays outside them; not --tiny)
#   compare-reduced  char_gpt --reduced-residual from compare's weights and batches: its curve against PyTorch eager's
#   report         bench/gpt2_report.py: report.json, report.md, gpt2_loss_curves.png; a G-GPU table
#                  (efficiency: multi / (G x one GPU)) and the reproducible mode's section when their files exist
#
# --batch B      the micro-batch (default 32; llm.c's published runs use 64 on 80 GB)
# --steps N      the throughput runs' steps (default 60); the first 10 are warm-up, not timed
# --gpus G       the ranks of the -multi phases (default 4), one GPU each
# --tiny         a 2-layer, width-64, context-64 model with batch 4 on the CPU (dyngrad and PyTorch only: a check
#                of this script's plumbing; llm.c's phases are skipped; dyngrad-multi runs 2 CPU ranks over MPI,
#                skipped when mpirun is missing)
# Environment: PYTHON (default python3, with torch; matplotlib for the PNG), LLMC_DIR, CUDNN_FRONTEND_PATH,
# CHAR_GPT / DYNGRAD_TOKENS (binaries to use instead of building), GPU_PEAK_TFLOPS (default 989: H100/H200 dense bf16),
# MPIRUN (default mpirun), OPENMPI_DIR, NCCL_INCLUDE_DIR, NCCL_LIB_DIR (build-llmc-multi). NCCL_NVLS_ENABLE=0 is
# exported (NVLink SHARP multicast stays off on the lent machines).
# shellcheck disable=SC2317  # the phase functions are called by name ("phase_${phase//-/_}")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: scripts/run-gpt2-bench.sh OUT_DIR [--phase NAME]... [--batch B] [--steps N] [--compare-steps N] [--gpus G] [--tiny] [--text PATH]"
out=${1:?$usage}
shift
phases=()
batch=32
steps=60
compare_steps=300
gpus=4
tiny=0
text=/usr/share/games/fortunes
while (($# > 0)); do
    case "$1" in
        --phase) phases+=("$2"); shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --compare-steps) compare_steps=$2; shift 2 ;;
        --gpus) gpus=$2; shift 2 ;;
        --tiny) tiny=1; shift ;;
        --text) text=$2; shift 2 ;;
        *) echo "run-gpt2-bench.sh: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
    esac
done
all_phases=(build-dyngrad build-llmc build-llmc-multi tokens llmc llmc-multi torch dyngrad dyngrad-multi reproducible
            compare torch-reduced dyngrad-reduced dyngrad-captured torch-reduced-graphs compare-reduced report)
((${#phases[@]})) || phases=("${all_phases[@]}")
for phase in "${phases[@]}"; do
    [[ " ${all_phases[*]} " == *" $phase "* ]] || { echo "run-gpt2-bench.sh: unknown phase '$phase' (${all_phases[*]})" >&2; exit 2; }
done
for number in "$batch" "$steps" "$compare_steps" "$gpus"; do
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
mpirun=${MPIRUN:-mpirun}
export NCCL_NVLS_ENABLE=0

# The model and schedule every engine trains: GPT-2 small (--tiny: a CPU-sized one), llm.c's AdamW (lr 6e-4,
# betas 0.9/0.95, weight decay 0.1, clip 1), no dropout, bf16 autocast with f32 master weights.
if ((tiny)); then
    device=cpu
    model=(--layers 2 --heads 2 --width 64 --context 64)
    batch=4
    context=64
    gpus=2  # CPU ranks (MPI) for dyngrad-multi
else
    device=cuda
    model=(--layers 12 --heads 12 --width 768 --context 1024)
    context=1024
fi
warmup=10
schedule=(--lr 6e-4 --min-lr 6e-5 --weight-decay 0.1 --clip 1 --dropout 0 --seed 0 --precision bf16)
data=(--train-tokens "$out/tokens/train.bin" --val-tokens "$out/tokens/val.bin" --vocab 50257)
# char_gpt's throughput runs (dyngrad, dyngrad-multi, reproducible), less --batch (the multi-rank run's differs).
dyngrad_run=(--model gpt2 "${model[@]}" "${data[@]}" "${schedule[@]}" --steps "$steps" --warmup "$warmup"
             --eval-every "$steps" --eval-batches 1 --device "$device")
# `mpirun -np G` as root (the lent machines); --tiny's 2 CPU ranks may outnumber the cores. Shared-memory single
# copy off: containers refuse the cross-memory attach it needs.
multi_rank=("$mpirun" --allow-run-as-root -np "$gpus")
((tiny)) && multi_rank+=(--oversubscribe)
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

# Runs a command with nvidia-smi sampling GPU 0 every 200 ms (when there is one): used memory, SM clock, power draw
# and the clock event reasons (an H100/H200 at its power limit lowers the clock: bench/gpt2_report.py reports each
# engine's clocks from these samples) into $out/NAME.samples; the peak memory, in MiB, goes to $out/NAME.memory; the
# command's output to $out/NAME.txt (and the terminal).
measured() {
    local name=$1 sampler="" status fields=memory.used,clocks.sm,power.draw,clocks_event_reasons.active
    shift
    rm -f "$out/$name.samples"
    if command -v nvidia-smi >/dev/null && [[ $device == cuda ]]; then
        # A driver without clocks_event_reasons (older ones name it clocks_throttle_reasons): the memory alone.
        nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -i 0 >/dev/null 2>&1 || fields=memory.used
        nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -i 0 -lms 200 >"$out/$name.samples" &
        sampler=$!
    fi
    PYTHONUNBUFFERED=1 "$@" 2>&1 | tee "$out/$name.txt"
    status=${PIPESTATUS[0]}
    if [[ -n $sampler ]]; then
        kill "$sampler" 2>/dev/null
        wait "$sampler" 2>/dev/null
        cut -d, -f1 "$out/$name.samples" | sort -n | tail -1 >"$out/$name.memory"
    fi
    return "$status"
}

phase_build_dyngrad() {
    . "$root/scripts/lib.sh"
    dg_build_bench char_gpt dyngrad-tokens
}

# Builds llm.c's train_gpt2cu in LLMC_DIR as BINARY (a name in LLMC_DIR; CUDA_OUTPUT_FILE names it, so the one-GPU
# and multi-GPU builds sit side by side), with cuDNN where CUDNN_FRONTEND_PATH is given and that build succeeds:
# OUT_DIR/NAME.txt says cudnn=0|1, OUT_DIR/NAME.log holds make's output. LDFLAGS: more of NVCC_LDFLAGS (given on
# the command line, it replaces what the Makefile adds to it); the rest: more make variables.
build_llmc() {
    local name=$1 binary=$2 ldflags=$3
    shift 3
    [[ -n "${LLMC_DIR:-}" && -f "$LLMC_DIR/train_gpt2.cu" ]] ||
        { echo "run-gpt2-bench.sh: LLMC_DIR must name llm.c's source (train_gpt2.cu), got '${LLMC_DIR:-}'" >&2; return 1; }
    local cuda_major make_vars=(CUDA_OUTPUT_FILE="-o $binary" "$@")
    cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    if ((cuda_major >= 13)) && grep -q "cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId" "$LLMC_DIR/llmc/cuda_utils.cuh"; then
        echo "==> patching the carried llm.c for CUDA $cuda_major (cudaMemAdvise takes a cudaMemLocation)"
        sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0}/' \
            "$LLMC_DIR/llmc/cuda_utils.cuh"
    fi
    (cd "$LLMC_DIR" && rm -f "$binary")
    : >"$out/$name.log"
    # llm.c's Makefile enables cuDNN only when $HOME/cudnn-frontend/include or ./cudnn-frontend/include exists, whatever
    # CUDNN_FRONTEND_PATH says: give it a HOME whose cudnn-frontend/include is the carried one.
    local frontend_home=""
    if [[ -n "${CUDNN_FRONTEND_PATH:-}" && -f "$CUDNN_FRONTEND_PATH/cudnn_frontend.h" ]]; then
        frontend_home=$(mktemp -d)
        mkdir -p "$frontend_home/cudnn-frontend"
        ln -s "$(cd "$CUDNN_FRONTEND_PATH" && pwd)" "$frontend_home/cudnn-frontend/include"
    fi
    if [[ -n "$frontend_home" ]] &&
        (cd "$LLMC_DIR" && HOME="$frontend_home" make train_gpt2cu USE_CUDNN=1 \
            CUDNN_FRONTEND_PATH="$frontend_home/cudnn-frontend/include" \
            NVCC_LDFLAGS="-lcublas -lcublasLt -lnvidia-ml -lcudnn -lnvrtc -lcuda $ldflags" "${make_vars[@]}") \
            >>"$out/$name.log" 2>&1; then
        echo "cudnn=1" >"$out/$name.txt"
    elif (cd "$LLMC_DIR" && make train_gpt2cu NVCC_LDFLAGS="-lcublas -lcublasLt -lnvidia-ml $ldflags" "${make_vars[@]}") \
            >>"$out/$name.log" 2>&1; then
        echo "cudnn=0" >"$out/$name.txt"
    else
        echo "run-gpt2-bench.sh: llm.c did not build (log: $out/$name.log)" >&2
        return 1
    fi
    echo "==> $binary built ($(cat "$out/$name.txt"))"
}

phase_build_llmc() {
    ((tiny)) && { echo "(--tiny: llm.c skipped)"; return 0; }
    build_llmc llmc_build train_gpt2cu "" NO_MULTI_GPU=1
}

# llm.c's Makefile turns multi-GPU on only when `dpkg -l` lists an nccl package and adds -L for MPI to NVCC_LDFLAGS,
# which build_llmc replaces: both are given here (PFLAGS carries the Makefile's default precision, bf16, with them).
phase_build_llmc_multi() {
    ((tiny)) && { echo "(--tiny: llm.c skipped)"; return 0; }
    local openmpi=${OPENMPI_DIR:-/usr/lib/x86_64-linux-gnu/openmpi} nccl_include=${NCCL_INCLUDE_DIR:-/usr/include}
    local nccl_lib=${NCCL_LIB_DIR:-}
    [[ -f "$openmpi/include/mpi.h" && -d "$openmpi/lib" ]] ||
        { echo "run-gpt2-bench.sh: no MPI at OPENMPI_DIR=$openmpi (include/mpi.h, lib/)" >&2; return 1; }
    [[ -f "$nccl_include/nccl.h" ]] ||
        { echo "run-gpt2-bench.sh: no nccl.h in NCCL_INCLUDE_DIR=$nccl_include" >&2; return 1; }
    [[ -n "$nccl_lib" ]] || nccl_lib=$(ldconfig -p 2>/dev/null | sed -n 's/.*libnccl\.so\.[0-9]* .*=> \(.*\)\/libnccl\.so.*/\1/p' | head -1)
    local pflags="-DENABLE_BF16 -DMULTI_GPU"
    [[ "$nccl_include" == /usr/include ]] || pflags+=" -I$nccl_include"  # -I/usr/include would break #include_next
    build_llmc llmc_multi_build train_gpt2cu_multi "-L$openmpi/lib${nccl_lib:+ -L$nccl_lib} -lnccl" \
        OPENMPI_DIR="$openmpi" PFLAGS="$pflags" || return 1
    # Not multi-GPU after all (llm.c would then train on one GPU per process): refuse it here.
    if ! ldd "$LLMC_DIR/train_gpt2cu_multi" | grep -q libnccl || ! ldd "$LLMC_DIR/train_gpt2cu_multi" | grep -q libmpi; then
        echo "run-gpt2-bench.sh: $LLMC_DIR/train_gpt2cu_multi does not link NCCL and MPI (log: $out/llmc_multi_build.log)" >&2
        return 1
    fi
}

phase_tokens() {
    "$tokens_tool" --text "$text" --out "$out/tokens/train.bin" --val-out "$out/tokens/val.bin" --vocab words \
        --words 50001 --reference "$text" | tee "$out/tokens.txt"
}

# train_gpt2cu's options for both llm.c runs. -v/-m: one validation batch at the start and the end only; -s 0: no
# sampling; -n 0: no checkpoints. -b is each process' micro-batch; the total batch defaults to B x T x processes.
llmc_run=(-i "$out/tokens/train.bin" -j "$out/tokens/val.bin" -e d12 -b "$batch" -t "$context" -x "$steps" -l 6e-4
          -u "$warmup" -q 0.1 -c 0.1 -v "$steps" -m 1 -s 0 -n 0)

phase_llmc() {
    ((tiny)) && { echo "(--tiny: llm.c skipped)"; return 0; }
    measured llmc "$LLMC_DIR/train_gpt2cu" "${llmc_run[@]}"
}

phase_llmc_multi() {
    ((tiny)) && { echo "(--tiny: llm.c skipped)"; return 0; }
    # llm.c's loader needs every file to hold at least ranks x B x T + 1 tokens (it asserts and aborts otherwise);
    # the fortunes validation split (72,670 tokens) is shorter than 4 x 32 x 1024: then llm.c validates on the
    # training file (its one validation batch is not part of the throughput compared).
    local multi_run=("${llmc_run[@]}") val_tokens=$(( ($(stat -c %s "$out/tokens/val.bin") - 1024) / 2 ))
    if ((val_tokens < gpus * batch * context + 1)); then
        multi_run[3]="$out/tokens/train.bin"
        echo "llm.c multi-GPU: val.bin holds $val_tokens tokens, fewer than $gpus x $batch x $context + 1: validating on train.bin" |
            tee "$out/llmc_multi_val_note.txt"
    fi
    measured llmc_multi "${multi_rank[@]}" "$LLMC_DIR/train_gpt2cu_multi" "${multi_run[@]}" || return 1
    # llm.c prints its process count; a build without MULTI_GPU would have run G one-GPU trainings instead.
    grep -q "num_processes=$gpus " "$out/llmc_multi.txt" ||
        { echo "run-gpt2-bench.sh: train_gpt2cu_multi did not run $gpus processes (see $out/llmc_multi.txt)" >&2; return 1; }
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
    measured dyngrad "$char_gpt" "${dyngrad_run[@]}" --batch "$batch" --csv "$out/dyngrad.csv"
}

# llm.c's mixed precision (--reduced-residual: the residual stream and LayerNorms in bf16, no activation casts) against
# PyTorch's autocast recipe (the residual stream and LayerNorm in f32) above: torch.compile and dyngrad both ways.
phase_torch_reduced() {
    measured torch_compile_reduced "$python" "$root/bench/torch_gpt.py" --model gpt2 "${model[@]}" "${data[@]}" \
        "${schedule[@]}" --batch "$batch" --steps "$steps" --warmup "$warmup" --eval-every "$steps" --eval-batches 1 \
        --device "$device" --csv "$out/torch_compile_reduced.csv" --compile --reduced-residual
}

phase_dyngrad_reduced() {
    measured dyngrad_reduced "$char_gpt" "${dyngrad_run[@]}" --batch "$batch" --csv "$out/dyngrad_reduced.csv" \
        --reduced-residual
}

phase_dyngrad_captured() {
    if ((tiny)); then
        echo "(--tiny: the CPU captures no CUDA graph, dyngrad-captured skipped)"
        return 0
    fi
    measured dyngrad_captured "$char_gpt" "${dyngrad_run[@]}" --batch "$batch" --csv "$out/dyngrad_captured.csv" \
        --reduced-residual --capture
}

phase_torch_reduced_graphs() {
    if ((tiny)); then
        echo "(--tiny: no CUDA graphs on the CPU, torch-reduced-graphs skipped)"
        return 0
    fi
    measured torch_compile_reduced_graphs "$python" "$root/bench/torch_gpt.py" --model gpt2 "${model[@]}" "${data[@]}" \
        "${schedule[@]}" --batch "$batch" --steps "$steps" --warmup "$warmup" --eval-every "$steps" --eval-batches 1 \
        --device "$device" --csv "$out/torch_compile_reduced_graphs.csv" --compile --compile-mode reduce-overhead \
        --reduced-residual
}

phase_dyngrad_multi() {
    if ((tiny)) && ! command -v "$mpirun" >/dev/null; then
        echo "(--tiny: no $mpirun here, dyngrad-multi skipped)"
        return 0
    fi
    measured dyngrad_multi "${multi_rank[@]}" "$char_gpt" "${dyngrad_run[@]}" --batch $((batch * gpus)) --distributed \
        --csv "$out/dyngrad_multi.csv" || return 1
    grep -q "^distributed: .*, $gpus ranks," "$out/dyngrad_multi.txt" ||
        { echo "run-gpt2-bench.sh: char_gpt --distributed did not run $gpus ranks (see $out/dyngrad_multi.txt)" >&2; return 1; }
}

# Tokens/s of a char_gpt CSV over the steps after the warm-up: every step holds the same tokens, so the rate is the
# number of timed steps over the sum of 1 / (each step's tokens_per_second), times those tokens: n / sum(1 / rate).
csv_rate() {
    awk -F, -v warmup="$warmup" 'NR > 1 + warmup { n++; inverse += 1 / $5 } END { if (n) printf "%.1f", n / inverse }' "$1"
}

# The reproducible mode and its cost: the normal run between the two --deterministic ones (the same seed and batches).
phase_reproducible() {
    local run mode runs=(deterministic_1 normal deterministic_2)
    for run in "${runs[@]}"; do
        mode=()
        [[ $run == deterministic_* ]] && mode=(--deterministic)
        measured "reproducible_$run" "$char_gpt" "${dyngrad_run[@]}" --batch "$batch" "${mode[@]}" \
            --csv "$out/reproducible_$run.csv" || return 1
    done
    local identical=no parameters_identical=no hashes
    cut -d, -f2,3 "$out/reproducible_deterministic_1.csv" >"$out/reproducible_1.losses"
    cut -d, -f2,3 "$out/reproducible_deterministic_2.csv" >"$out/reproducible_2.losses"
    cmp -s "$out/reproducible_1.losses" "$out/reproducible_2.losses" && identical=yes
    hashes=$(grep -h "^parameters_fnv1a=" "$out/reproducible_deterministic_1.txt" "$out/reproducible_deterministic_2.txt")
    [[ $(wc -l <<<"$hashes") == 2 && $(sort -u <<<"$hashes" | wc -l) == 1 ]] && parameters_identical=yes
    {
        echo "# char_gpt --deterministic twice (the same seed): identical compares their CSVs' train_loss and"
        echo "# val_loss fields as text, parameters_identical their final parameters' hashes (parameters_fnv1a=);"
        echo "# tokens/s after the $warmup warm-up steps, of each run"
        echo "identical=$identical"
        echo "parameters_identical=$parameters_identical"
        echo "steps=$(($(wc -l <"$out/reproducible_1.losses") - 1))"
        # diff's first hunk starts at the first differing line; line 1 is the header
        echo "first_differing_step=$(diff "$out/reproducible_1.losses" "$out/reproducible_2.losses" |
                                    awk 'NR == 1 { print $0 + 0 - 1 }')"
        for run in "${runs[@]}"; do
            echo "tokens_per_second_$run=$(csv_rate "$out/reproducible_$run.csv")"
        done
    } | tee "$out/reproducible.txt"
    rm -f "$out/reproducible_1.losses" "$out/reproducible_2.losses"
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

# dyngrad --reduced-residual from compare's weights and batches: its curve against PyTorch eager's (the f32 recipe).
phase_compare_reduced() {
    [[ -f "$out/prepared/init.safetensors" ]] || { echo "run-gpt2-bench.sh: compare-reduced needs the compare phase" >&2; return 1; }
    measured compare_dyngrad_reduced "$char_gpt" --model gpt2 "${model[@]}" "${data[@]}" "${schedule[@]}" \
        --batch "$batch" --steps "$compare_steps" --warmup 30 --eval-every 50 --eval-batches 4 \
        --init-weights "$out/prepared/init.safetensors" --batch-order "$out/prepared/batch_order.txt" \
        --device "$device" --csv "$out/compare_dyngrad_reduced.csv" --reduced-residual
}

phase_report() {
    local width=768 layers=12
    ((tiny)) && width=64 layers=2
    GPU_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-989} "$python" "$root/bench/gpt2_report.py" "$out" --batch "$batch" \
        --context "$context" --layers "$layers" --width "$width" --vocab 50257 --warmup-steps "$warmup" --gpus "$gpus" |
        tee "$out/report.md"
}

status=0
for phase in "${phases[@]}"; do
    echo "==> phase $phase"
    "phase_${phase//-/_}" || { echo "run-gpt2-bench.sh: phase $phase failed" >&2; status=1; }
done
exit $status
