#!/usr/bin/env bash
# Issue 30's memory demonstration: a character GPT whose AdamW training state does not fit under a per-process
# memory cap (char_gpt --memory-limit-mib: cuda::set_memory_limit, as if each GPU were that small) trains under the
# same cap on N GPUs with ZeRO-3, and its training losses match the uncapped one-GPU run's from the same weights
# and batches (same seed; each rank takes 1/N of every step's windows) within 1e-4 relative at every step.
#   scripts/run-zero3-memory-demo.sh OUT [--gpus N] [--cap-mib M] [--plan]
# Three runs of build/samples/char_gpt (DYNGRAD_BUILD_DIR, default build-dist; built here unless DYNGRAD_CHAR_GPT
# names one): 1. one GPU, uncapped (its peak allocation and losses: OUT/single.csv); 2. one GPU under the cap: must
# fail with OutOfMemory naming the limit; 3. `mpirun -np N char_gpt --distributed --zero 3 --zero-recompute` under
# the cap (OUT/zero3.csv). The cap defaults to 60% of run 1's peak. The model (12 layers, 16 heads, width 1024, context 128:
# 151.58 M parameters as char_gpt reported them on 2×H200; 16 bytes each of f32 weights, gradients and AdamW moments) is large against its activations
# (8 windows a step), so ZeRO-3's shards fit where one GPU's state does not. Data: DATA (default the fortunes
# corpus; without it, the repository's docs/ as text). OUT/report.md says what held; exit 1 unless all three did.
# DYNGRAD_RECORD=docs (scripts/lib.sh) writes it to performance/zero3-memory-<GPU>x<N>.md.
# Why --zero-recompute in run 3: ZeRO-3's default keeps each block's activations (one forward a step, as FSDP), which
# adds about 1/N of run 1's activations to each rank's peak. On 2×H200 run 1 peaked at 3384 MiB of which ~2313 MiB is
# the f32 training state, so the activations are ~1 GiB; the recorded ZeRO-3 run (recomputing, 1350 MiB) plus half
# of that lands within a few percent of the 2030 MiB cap — not a dependable demonstration. Recomputing keeps only the
# units' outputs, so the shards decide whether it fits, which is what this demonstrates. (The kept default on this
# model under the cap is unmeasured.)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dg_command="scripts/run-zero3-memory-demo.sh $*"
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
usage="usage: scripts/run-zero3-memory-demo.sh OUT [--gpus N] [--cap-mib M] [--plan]"
out=${1:?$usage}
shift
gpus=4
cap_mib=""
plan=0
while (($#)); do
    case $1 in
        --gpus) gpus=${2:?$usage}; shift 2 ;;
        --cap-mib) cap_mib=${2:?$usage}; shift 2 ;;
        --plan) plan=1; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
[[ "$gpus" =~ ^[1-9][0-9]*$ && "$gpus" -ge 2 ]] || { echo "--gpus: '$gpus' is not a count of 2 or more GPUs; $usage" >&2; exit 2; }
[[ -z "$cap_mib" || "$cap_mib" =~ ^[1-9][0-9]*$ ]] || { echo "--cap-mib: '$cap_mib' is not a number of MiB; $usage" >&2; exit 2; }
build=${DYNGRAD_BUILD_DIR:-build-dist}
program=${DYNGRAD_CHAR_GPT:-$build/samples/char_gpt}
data=${DATA:-/usr/share/games/fortunes}
mpi_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
model=(--layers 12 --heads 16 --width 1024 --context 128 --batch 8 --steps 20 --lr 3e-4 --warmup 2 --min-lr 3e-5
       --dropout 0 --weight-decay 0 --eval-every 1000 --eval-batches 1 --sample 0 --seed 7 --device cuda)
if ((plan)); then
    echo "1. $program --data DATA ${model[*]} --csv OUT/single.csv"
    echo "2. the same with --memory-limit-mib ${cap_mib:-CAP} (default CAP: 60% of the peak of run 1, in MiB): must fail with OutOfMemory"
    echo "3. mpirun -np $gpus ${mpi_flags[*]} -x NCCL_NVLS_ENABLE $program --data DATA ${model[*]} --memory-limit-mib ${cap_mib:-CAP} --distributed --zero 3 --zero-recompute --csv OUT/zero3.csv"
    echo "record: performance/zero3-memory-$(dg_gpu_kind)x$gpus.md"
    exit 0
fi
mkdir -p "$out"
if [[ ! -d "$data" ]]; then  # a machine without the fortunes package: the repository's own prose
    data="$out/corpus"
    mkdir -p "$data"
    cp docs/*.md "$data/"
fi
if [[ -z "${DYNGRAD_CHAR_GPT:-}" ]]; then
    cuda_architectures=$(dg_cuda_architectures_arg)
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${cuda_architectures:+"$cuda_architectures"} >"$out/configure.log"
    cmake --build "$build" -j"$(nproc)" --target char_gpt >"$out/build.log"
fi
peak_of() { sed -n 's/^peak_memory_bytes=//p' "$1" | tail -1; }

echo "==> 1. one GPU, uncapped"
"$program" --data "$data" "${model[@]}" --csv "$out/single.csv" >"$out/single.txt" 2>&1
single_peak=$(peak_of "$out/single.txt")
[[ -n "$single_peak" ]] || { echo "run 1 printed no peak_memory_bytes (see $out/single.txt)" >&2; exit 1; }
[[ -n "$cap_mib" ]] || cap_mib=$((single_peak * 6 / 10 / 1048576))
echo "peak $single_peak bytes; cap $cap_mib MiB"

echo "==> 2. one GPU under the cap (must fail)"
capped_failed=0
if "$program" --data "$data" "${model[@]}" --memory-limit-mib "$cap_mib" >"$out/single_capped.txt" 2>&1; then
    echo "run 2 fit under the cap: the cap does not bind (see $out/single_capped.txt)" >&2
elif grep -q "memory limit" "$out/single_capped.txt"; then
    capped_failed=1
else
    echo "run 2 failed otherwise than by the memory limit (see $out/single_capped.txt)" >&2
fi

echo "==> 3. $gpus GPUs, ZeRO-3, under the cap"
zero3_ok=0
if mpirun -np "$gpus" "${mpi_flags[@]}" -x NCCL_NVLS_ENABLE "$program" --data "$data" "${model[@]}" \
        --memory-limit-mib "$cap_mib" --distributed --zero 3 --zero-recompute --csv "$out/zero3.csv" >"$out/zero3.txt" 2>&1; then
    zero3_ok=1
fi
zero3_peak=$(peak_of "$out/zero3.txt")
comparison="not compared"
match=0
if ((zero3_ok)); then
    # step, train_loss, ...: the relative difference of every step's training loss.
    comparison=$(paste -d, "$out/single.csv" "$out/zero3.csv" | awk -F, -v columns="$(head -1 "$out/single.csv" | awk -F, '{print NF}')" '
        NR > 1 { a = $2; b = $(2 + columns); d = a - b; if (d < 0) d = -d; r = d / (a < 0 ? -a : a);
                 if (r > worst) worst = r; ++n }
        END { printf "%d steps compared, worst relative difference %.3g", n, worst; exit !(n >= 20 && worst <= 1e-4) }') \
        && match=1
fi

{
    echo "# ZeRO-3 under a per-process memory cap (issue 30)"
    echo
    echo "Model: $(grep -m1 -o '[0-9.]*M parameters' "$out/single.txt" || echo '? parameters') (12 layers, 16 heads, width 1024, context 128), 8 windows a step, 20 steps, f32."
    echo
    echo "| run | GPUs | cap | peak allocation per GPU | outcome |"
    echo "| --- | --- | --- | --- | --- |"
    echo "| one GPU | 1 | none | $((single_peak / 1048576)) MiB | losses in single.csv |"
    echo "| one GPU, capped | 1 | $cap_mib MiB | - | $( ((capped_failed)) && echo 'OutOfMemory at the limit, as required' || echo '**did not fail at the limit**') |"
    echo "| ZeRO-3 | $gpus | $cap_mib MiB | ${zero3_peak:+$((zero3_peak / 1048576)) MiB (rank 0)} | $( ((zero3_ok)) && echo 'trained' || echo '**failed** (zero3.txt)') |"
    echo
    echo "Training losses, ZeRO-3 against one GPU: $comparison (required: every step within 1e-4 relative)."
    echo
    echo "The cap bounds dyngrad's allocations (cuda::memory_stats' bytes in use); cuBLAS and cuDNN workspaces and"
    echo "NCCL's buffers are outside it, as PyTorch's per-process memory fraction bounds only its caching allocator."
} >"$out/report.md"
cat "$out/report.md"
if ! ((capped_failed && zero3_ok && match)); then
    echo "run-zero3-memory-demo: not demonstrated (see $out/report.md); nothing recorded" >&2
    exit 1
fi
dg_record "$out/report.md" "performance/zero3-memory-$(dg_gpu_kind)x$gpus.md"
