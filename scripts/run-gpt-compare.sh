#!/usr/bin/env bash
# Issue 16's side by side in one command: the character-level GPT trained by dyngrad (samples/char_gpt) and by
# its PyTorch twin (bench/torch_gpt.py), eager and through torch.compile, from the same initial weights and the
# same batches (both written by `torch_gpt.py --prepare`), dropout 0 so the runs can agree. Writes a report:
# the validation loss after N steps of each (target: dyngrad within 1% of PyTorch eager), tokens/s of each and
# the ratios (targets: >= 1.5x eager, >= 1.0x torch.compile), and a PNG of the loss curves (with matplotlib).
#
#   scripts/run-gpt-compare.sh OUT_DIR [--data DIR] [--steps N] [--device cuda|cpu] [--tiny] [--no-compile]
#                              [--precision f32|bf16|f16] [--capture] [-- extra options for both trainers, e.g. --batch 32]
#
#   --data DIR   the text (default /usr/share/games/fortunes; e.g. .data/fortunes, a copy of it)
#   --steps N    optimizer steps (default 300; --tiny: 30)
#   --tiny       a 2-layer, width-32, context-32 model with batch 8 (a CPU check of the script itself)
#   --no-compile skip the torch.compile run
#   --precision P f32 (default, TF32 off), or bf16 / f16: both trainers under autocast (f16 with loss scaling)
#   --capture    dyngrad's step as a CUDA graph (char_gpt --capture), with the fusion compiler (on in captured
#                steps unless DYNGRAD_FUSION=0), whose planning and NVRTC time char_gpt prints and the report sets
#                against torch.compile's one-time cost
# OUT_DIR receives prepared/ (init.safetensors, batch_order.txt), dyngrad.csv, torch_eager.csv,
# torch_compile.csv, the programs' logs, report.md, report.json and gpt_loss_curves.png.
# Environment: PYTHON (default python3; needs torch, and matplotlib for the PNG); CHAR_GPT (a
# char_gpt binary to use instead of building one: scripts/lib.sh's dg_build_bench builds it, with CUDA, into
# DYNGRAD_BUILD_DIR, default build-perf/); DYNGRAD_JOBS. DYNGRAD_RECORD=docs (scripts/lib.sh, dg_record): a run of
# the full model on cuda (not --tiny) also writes performance/gpt-compare-PRECISION-GPU.md (report.md) and .json
# (report.json), and performance/gpt-loss-curves-PRECISION-GPU.png.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dg_command="scripts/run-gpt-compare.sh $*"
out=${1:?usage: scripts/run-gpt-compare.sh OUT_DIR [--data DIR] [--steps N] [--device cuda|cpu] [--tiny] [--no-compile]}
shift
data=/usr/share/games/fortunes
steps=""
device=cuda
tiny=0
compile=1
capture=0
precision=f32
extra=()
while (($# > 0)); do
    case "$1" in
        --data) data=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        --tiny) tiny=1; shift ;;
        --no-compile) compile=0; shift ;;
        --capture) capture=1; shift ;;
        --precision) precision=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "run-gpt-compare.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ "$precision" =~ ^(f32|bf16|f16)$ ]] || { echo "run-gpt-compare.sh: --precision: f32, bf16 or f16, not '$precision'" >&2; exit 2; }
[[ -d "$data" ]] || { echo "run-gpt-compare.sh: --data: '$data' is not a directory" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}

# The comparison's configuration: char_gpt's defaults (nanoGPT's shakespeare_char model) with dropout 0 and a
# short schedule; the same options go to both trainers.
if ((tiny)); then
    config=(--layers 2 --heads 2 --width 32 --context 32 --batch 8 --steps "${steps:-30}" --lr 3e-3 --warmup 5
            --min-lr 3e-4 --eval-every 10 --eval-batches 4)
else
    config=(--layers 6 --heads 6 --width 384 --context 256 --batch 64 --steps "${steps:-300}" --lr 1e-3 --warmup 30
            --min-lr 1e-4 --eval-every 50 --eval-batches 10)
fi
config+=(--weight-decay 0.1 --clip 1.0 --dropout 0 --seed 0 --precision "$precision" --data "$data" "${extra[@]}")

if [[ -n "${CHAR_GPT:-}" ]]; then
    char_gpt=$CHAR_GPT
else
    . "$root/scripts/lib.sh"
    dg_build_bench char_gpt || exit 1
    char_gpt=$build/samples/char_gpt
fi

status=0
echo "==> initial weights and batch order (bench/torch_gpt.py --prepare)"
"$python" "$root/bench/torch_gpt.py" "${config[@]}" --prepare "$out/prepared" || exit 1
shared=(--init-weights "$out/prepared/init.safetensors" --batch-order "$out/prepared/batch_order.txt")

echo "==> dyngrad (char_gpt, $device)"
dyngrad_only=()
((capture)) && dyngrad_only=(--capture)
"$char_gpt" "${config[@]}" "${shared[@]}" "${dyngrad_only[@]}" --device "$device" --csv "$out/dyngrad.csv" --sample 300 \
    2>&1 | tee "$out/dyngrad.txt" || status=1
echo "==> PyTorch eager"
PYTHONUNBUFFERED=1 "$python" "$root/bench/torch_gpt.py" "${config[@]}" "${shared[@]}" --device "$device" \
    --csv "$out/torch_eager.csv" 2>&1 | tee "$out/torch_eager.txt" || status=1
if ((compile)); then
    echo "==> PyTorch torch.compile"
    PYTHONUNBUFFERED=1 "$python" "$root/bench/torch_gpt.py" "${config[@]}" "${shared[@]}" --device "$device" \
        --compile --csv "$out/torch_compile.csv" 2>&1 | tee "$out/torch_compile.txt" || status=1
fi

echo "==> report"
"$python" - "$out" "$device" "${config[*]}" "$precision" "$capture" "${DYNGRAD_FUSION:-captured}" <<'PY' | tee "$out/report.md" || status=1
import csv, datetime, json, os, platform, re, statistics, sys

out, device, config, precision = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
captured, fused = sys.argv[5] == "1", sys.argv[6] not in ("0", "off")  # DYNGRAD_FUSION (unset: captured)
runs = {}
for name, label in (("dyngrad", "dyngrad"), ("torch_eager", "PyTorch eager"), ("torch_compile", "torch.compile")):
    path = f"{out}/{name}.csv"
    if os.path.exists(path):
        rows = list(csv.DictReader(open(path)))
        if rows:
            runs[name] = (label, rows)
if "dyngrad" not in runs or "torch_eager" not in runs:
    sys.exit("run-gpt-compare.sh: the dyngrad or the PyTorch eager curve is missing")

def summary(rows):
    # Throughput over the steps after the first 10% (at least 3): cuBLAS/cuDNN set-up and torch.compile's
    # compilation happen in the first steps. Every step holds the same tokens, so the rate over the timed steps
    # is their count over the sum of 1 / each step's rate (a harmonic mean).
    skip = max(3, len(rows) // 10) if len(rows) > 6 else 0
    timed = rows[skip:]
    rate = len(timed) / sum(1.0 / float(r["tokens_per_second"]) for r in timed)
    vals = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    # One-time cost: the first two steps (dyngrad --capture: the eager warm-up with the fusion pass and NVRTC,
    # then the capture; torch.compile: tracing and compiling, then its first compiled step) less two typical steps.
    tokens = int(re.search(r"--batch (\d+)", config).group(1)) * int(re.search(r"--context (\d+)", config).group(1))
    seconds = [tokens / float(r["tokens_per_second"]) for r in rows]
    one_time = sum(seconds[:2]) - 2 * statistics.median(seconds[skip:] or seconds) if len(seconds) > 2 else None
    return {"steps": len(rows), "final_val_loss": vals[-1][1], "final_train_loss": float(rows[-1]["train_loss"]),
            "tokens_per_second": rate, "timed_steps": len(timed), "val_curve": vals, "one_time_seconds": one_time}

results = {name: summary(rows) for name, (label, rows) in runs.items()}
ours, eager = results["dyngrad"], results["torch_eager"]
relative = abs(ours["final_val_loss"] - eager["final_val_loss"]) / eager["final_val_loss"]
try:
    import torch
    torch_version = torch.__version__
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else platform.processor() or "CPU"
except Exception:
    torch_version, gpu = "?", "?"
arithmetic = {"f32": "float32 (TF32 off)", "bf16": "bf16 autocast", "f16": "f16 autocast with loss scaling"}[precision]
print(f"# char GPT: dyngrad vs PyTorch, {arithmetic} ({datetime.date.today()}, {gpu}, torch {torch_version})\n")
print(f"Configuration (both trainers): `{config}`; same initial weights and batch order (bench/torch_gpt.py "
      f"--prepare), {arithmetic} on both sides. dyngrad's step: "
      + ("captured (`--capture`), fusion " + ("on" if fused else "off (DYNGRAD_FUSION=0)") if captured else "eager")
      + ".\n")
print("| run | steps | final train loss | final val loss | tokens/s (after warm-up) | dyngrad / this |")
print("|---|---:|---:|---:|---:|---:|")
for name, (label, _) in runs.items():
    r = results[name]
    ratio = ours["tokens_per_second"] / r["tokens_per_second"]
    print(f"| {label} | {r['steps']} | {r['final_train_loss']:.4f} | {r['final_val_loss']:.4f} | "
          f"{r['tokens_per_second']:.0f} | {ratio:.2f}x |")
verdict = "within" if relative <= 0.01 else "NOT within"
print(f"\nValidation loss after {ours['steps']} steps: dyngrad {ours['final_val_loss']:.4f}, PyTorch eager "
      f"{eager['final_val_loss']:.4f}: relative difference {100 * relative:.3f}% ({verdict} the 1% target).")
if "torch_compile" in results:
    c = results["torch_compile"]
    rc = abs(ours["final_val_loss"] - c["final_val_loss"]) / c["final_val_loss"]
    print(f"Against torch.compile: {c['final_val_loss']:.4f}, {100 * rc:.3f}%.")
print(f"Throughput targets: >= 1.5x PyTorch eager (measured {ours['tokens_per_second'] / eager['tokens_per_second']:.2f}x)"
      + (f", >= 1.0x torch.compile (measured {ours['tokens_per_second'] / results['torch_compile']['tokens_per_second']:.2f}x)"
         if "torch_compile" in results else "") + ".")
print("\nOne-time cost, the first two steps less two median steps (cuBLAS/cuDNN set-up on both sides; dyngrad "
      "--capture: the warm-up and the capture; torch.compile: tracing and compilation):\n")
print("| run | one-time cost s |")
print("|---|---:|")
for name, (label, _) in runs.items():
    cost = results[name]["one_time_seconds"]
    print(f"| {label} | {'-' if cost is None else f'{cost:.3f}'} |")
fusion = None
if os.path.exists(f"{out}/dyngrad.txt"):
    for line in open(f"{out}/dyngrad.txt", errors="replace"):  # the sample may hold any bytes
        if line.startswith("fusion: "):
            fusion = {k: float(v) for k, v in (item.split("=") for item in line.split()[1:])}
if fusion is not None:
    print(f"\nFusion (dyngrad): {fusion['groups_compiled']:.0f} groups compiled ({fusion['groups_from_cache']:.0f} from "
          f"the disk cache, {fusion['groups_dropped']:.0f} dropped), {fusion['launches_saved']:.0f} launches saved per "
          f"captured step; {fusion.get('chains_compiled', 0):.0f} backward chains compiled; planning, generation, "
          f"NVRTC and loading {fusion['prepare_ms']:.1f} ms, of it NVRTC "
          f"{fusion['nvrtc_ms']:.1f} ms.")
    compile_cost = results.get("torch_compile", {}).get("one_time_seconds")
    if compile_cost:
        share = fusion["prepare_ms"] / 1000 / compile_cost
        print(f"Against torch.compile's one-time cost ({compile_cost:.1f} s): {100 * share:.2f}% (target <= 10%).")
json.dump({"date": str(datetime.date.today()), "device": gpu, "precision": precision, "torch": torch_version, "config": config,
           "captured": captured, "fusion": fusion,
           "val_relative_difference": relative, "runs": results}, open(f"{out}/report.json", "w"), indent=1)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("\n(matplotlib is not installed: no gpt_loss_curves.png)")
else:
    figure, axes = plt.subplots(figsize=(8, 5))
    styles = {"dyngrad": "-", "torch_eager": "--", "torch_compile": ":"}
    for name, (label, rows) in runs.items():
        axes.plot([int(r["step"]) for r in rows], [float(r["train_loss"]) for r in rows], styles[name],
                  linewidth=1, alpha=0.7, label=f"{label} train")
        steps, vals = zip(*results[name]["val_curve"])
        axes.plot(steps, vals, styles[name], marker="o", label=f"{label} validation")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats per byte)")
    axes.set_title(f"char GPT on fortunes: dyngrad vs PyTorch, {precision} ({gpu})")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(f"{out}/gpt_loss_curves.png", dpi=120)
    print(f"\nLoss curves: {out}/gpt_loss_curves.png")
PY
. "$root/scripts/lib.sh"
why_not=""
((tiny)) || [[ "$device" != cuda* ]] && why_not="records are of the full model on cuda"
kind=$(dg_gpu_kind)
curves=()
[[ -f "$out/gpt_loss_curves.png" ]] && curves=("$out/gpt_loss_curves.png" "performance/gpt-loss-curves-$precision-$kind.png")
dg_records "$why_not" "$out/report.md" "performance/gpt-compare-$precision-$kind.md" \
    "$out/report.json" "performance/gpt-compare-$precision-$kind.json" "${curves[@]}" || status=1
exit $status
