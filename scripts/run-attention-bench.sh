#!/usr/bin/env bash
# Issue 16's attention benchmark in one command, on a machine with a CUDA device and PyTorch: builds
# dyngrad-attention-bench (Release, CUDA) into $DYNGRAD_BUILD_DIR (default build-perf/), runs it and
# bench/torch_attention.py on the same workload (B 8, H 8, D 64, T = S = 256, 1024, 4096, float32 unless
# --dtype bf16|f16, forward + backward, without and with is_causal), and writes the side-by-side table with the
# time ratios.
#
#   scripts/run-attention-bench.sh [OUT_DIR] [extra options for both programs, e.g. --lengths 256,1024]
#   TORCH_BACKEND=flash scripts/run-attention-bench.sh attention-bf16 --dtype bf16   # against PyTorch's flash kernel
#
# OUT_DIR (default attention-results/) receives attention.txt, attention.json, torch_attention.txt,
# torch_attention.json and report.md. Environment: PYTHON (default python3), DYNGRAD_JOBS (default nproc),
# TORCH_BACKEND (auto | flash | efficient | cudnn | math: PyTorch's SDPA backend; default auto, PyTorch chooses).
# DYNGRAD_RECORD=docs (scripts/lib.sh, dg_record): a run over the default sizes (no --lengths, --batch, --heads,
# --head-dim) also writes performance/attention-DTYPE[-deterministic]-GPU.md (report.md) and .json
# (attention.json), and performance/torch-attention-DTYPE-GPU.json, DTYPE f32, bf16 or f16.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
dg_bench_setup attention-results dyngrad-attention-bench "$@" || exit 1
shift || true
dg_bench_side dyngrad-attention-bench "$out/attention.txt" \
    "$build/bench/dyngrad-attention-bench" --json "$out/attention.json" "$@"
dg_bench_side bench/torch_attention.py "$out/torch_attention.txt" "$python" "$root/bench/torch_attention.py" \
    --json "$out/torch_attention.json" --backend "${TORCH_BACKEND:-auto}" "$@"

"$python" - "$out" <<'PY' | tee "$out/report.md" || status=1
import json, sys
out = sys.argv[1]
ours = json.load(open(f"{out}/attention.json"))
torch = json.load(open(f"{out}/torch_attention.json"))
theirs = {(r["length"], r["causal"]): r for r in torch["rows"]}
print(f"dyngrad: {ours['device']}; torch {torch['torch']} on {torch['device']}")
dtype = ours.get("dtype", "float32")
print(f"scaled_dot_product_attention forward + backward, B {ours['batch']}, H {ours['heads']}, D {ours['head_dim']}, "
      f"{dtype}{' (TF32 off)' if dtype == 'float32' else ''}; target: dyngrad/torch <= 1.2\n")
print("| T = S | causal | dyngrad ms | dyngrad path | GFLOP/s | torch ms | torch backend | dyngrad/torch | "
      "dyngrad peak MiB | torch peak MiB |")
print("|---:|:---:|---:|:---|---:|---:|:---|---:|---:|---:|")
for r in ours["rows"]:
    t = theirs.get((r["length"], r["causal"]))
    cells = [r["length"], "yes" if r["causal"] else "no", f"{r['ms']:.3f}", r.get("path", "kernels"), f"{r['gflop'] / (r['ms'] * 1e-3):.0f}",
             f"{t['ms']:.3f}" if t else "-", t["backend"] if t else "-", f"{r['ms'] / t['ms']:.2f}" if t else "-",
             f"{r['peak_mib']:.1f}", f"{t['peak_mib']:.1f}" if t else "-"]
    print("| " + " | ".join(str(c) for c in cells) + " |")
PY
# The records' names: the dtype (f32 unless --dtype), -deterministic with --deterministic, the GPU kind.
dtype=$(grep -oE -- "--dtype[ =](bf16|f16|f32|float32)" <<<"$*" | sed -E 's/--dtype[ =]//; s/float32/f32/')
dtype=${dtype:-f32}
name="attention-$dtype"
[[ " $* " == *" --deterministic "* ]] && name+="-deterministic"
kind=$(dg_gpu_kind)
why_not=""
[[ " $* " =~ \ --(lengths|batch|heads|head-dim)[\ =] ]] && why_not="a subset of the sizes"
dg_records "$why_not" "$out/report.md" "performance/$name-$kind.md" "$out/attention.json" "performance/$name-$kind.json" \
    "$out/torch_attention.json" "performance/torch-attention-$dtype-$kind.json" || status=1
exit $status
