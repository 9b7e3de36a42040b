#!/usr/bin/env python3
"""The report of scripts/run-gpt2-bench.sh: GPT-2 small trained by llm.c, PyTorch (eager, torch.compile) and dyngrad.

Reads what the script's phases left in OUT_DIR: llmc.txt (train_gpt2cu's log), torch.csv, torch_compile.csv and
dyngrad.csv (char_gpt's CSV columns), NAME.memory (the peak of nvidia-smi's used memory, MiB), NAME.samples
(nvidia-smi's samples: each engine's SM clock and power-cap share while busy), torch*.txt (`peak_memory_bytes=`),
llmc_build.txt (`cudnn=0|1`), compare_dyngrad.csv and compare_torch.csv (the curves from identical weights and
batches); for G GPUs (--gpus), llmc_multi.txt and dyngrad_multi.csv (each rank the one-GPU
micro-batch B: B·T·G tokens a step, tokens/s summed over the ranks); reproducible.txt (the reproducible phase's
key=value lines). Writes OUT_DIR/report.json and OUT_DIR/gpt2_loss_curves.png (with matplotlib), and prints the
Markdown report.

Throughput: tokens/s over the steps after --warmup-steps (every step holds B·T tokens, so the rate is their count over
the summed step times). MFU: tokens/s × (6N + 12·L·E·T) FLOPs per token (N: every parameter, embeddings included,
with the padded vocabulary, as llm.c counts them; 12·L·E·T: attention's score and value matmuls, forward and backward,
as nanoGPT's estimate) over the GPU's dense bf16 peak (GPU_PEAK_TFLOPS, default 989: H100/H200 SXM). G GPUs:
efficiency = multi-GPU tokens/s / (G × the same engine's one-GPU tokens/s).

Nothing here needs a GPU or torch: the functions are importable and tested on the CPU (tests/data/check_gpt2_bench.py).
"""
import argparse
import csv
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import padded_vocabulary  # noqa: E402  (importable without torch)

ENGINES = (("llmc", "llm.c train_gpt2cu"), ("torch", "PyTorch eager"), ("torch_compile", "PyTorch torch.compile"),
           ("dyngrad", "dyngrad (char_gpt --model gpt2)"),
           # --reduced-residual: the residual stream and LayerNorms in bf16 (llm.c's recipe) instead of autocast's f32
           ("torch_compile_reduced", "PyTorch torch.compile, reduced residual"),
           ("dyngrad_reduced", "dyngrad, reduced residual"),
           # the whole step as CUDA graphs: dyngrad's captured step, Inductor's reduce-overhead mode
           ("torch_compile_reduced_graphs", "PyTorch torch.compile reduce-overhead (CUDA graphs), reduced residual"),
           ("dyngrad_captured", "dyngrad, reduced residual, captured step (--capture)"))
# dyngrad's rows and the rows each is divided by in the report.
RATIOS = (("dyngrad", ("llmc", "torch_compile", "torch")),
          ("dyngrad_reduced", ("llmc", "torch_compile_reduced", "torch_compile", "torch")),
          ("dyngrad_captured", ("llmc", "torch_compile_reduced_graphs", "torch_compile_reduced", "torch_compile",
                                "torch")))
MULTI_ENGINES = (("llmc_multi", "llmc", "llm.c train_gpt2cu (mpirun)"),
                 ("dyngrad_multi", "dyngrad", "dyngrad (char_gpt --distributed, mpirun)"))
LLMC_STEP = re.compile(r"^step\s+(\d+)/(\d+) \|.*\| ([0-9.]+) ms \|")


def gpt2_parameters(layers, width, context, vocab):
    """Parameters of the tied GPT-2 (nn/transformer.h's gpt2_small() shape; llm.c's count, the padding included)."""
    return (padded_vocabulary(vocab) + context) * width + layers * (12 * width * width + 13 * width) + 2 * width


def flops_per_token(layers, width, context, vocab):
    return 6 * gpt2_parameters(layers, width, context, vocab) + 12 * layers * width * context


def rate_after_warmup(step_seconds, tokens_per_step, warmup_steps):
    """Tokens/s over the steps after the first warmup_steps; None when none is left."""
    timed = step_seconds[warmup_steps:]
    if not timed:
        return None
    return len(timed) * tokens_per_step / sum(timed)


def llmc_step_seconds(log_text):
    """Each training step's time from train_gpt2cu's `step k/n | ... | X ms | ...` lines, in step order."""
    return [float(m.group(3)) / 1000 for line in log_text.splitlines() if (m := LLMC_STEP.match(line.strip()))]


def csv_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def csv_step_seconds(rows, tokens_per_step):
    """char_gpt's and torch_gpt.py's CSVs give tokens_per_second per step: the step times."""
    return [tokens_per_step / float(r["tokens_per_second"]) for r in rows]


def peak_memory_mib(out, name):
    """(nvidia-smi's peak used MiB, the framework's own peak allocation in MiB), None where not recorded."""
    sampled = own = None
    path = os.path.join(out, f"{name}.memory")
    if os.path.exists(path) and open(path).read().strip():
        sampled = float(open(path).read().split()[0])
    log = os.path.join(out, f"{name}.txt")
    if os.path.exists(log):
        found = re.findall(r"^peak_memory_bytes=(\d+)", open(log).read(), re.M)
        if found:
            own = int(found[-1]) / 2**20
    return sampled, own


def gpu_clocks(out, name):
    """The SM clock while the run was busy, from NAME.samples (nvidia-smi every 200 ms: used MiB, SM MHz, power W,
    clock event reasons): the samples drawing at least half the run's peak power (the idle and compiling seconds
    around the steps excluded), their median and lowest SM clock, the share of them with the software power cap's
    reason (bit 0x4), and the peak power. None without such samples (no GPU, an older driver)."""
    path = os.path.join(out, f"{name}.samples")
    if not os.path.exists(path):
        return None
    samples = []
    for line in open(path):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        try:
            samples.append((float(fields[1]), float(fields[2]), int(fields[3], 16)))
        except ValueError:  # "[N/A]" and the like
            continue
    if not samples:
        return None
    peak_power = max(power for _, power, _ in samples)
    busy = sorted((clock, reasons) for clock, power, reasons in samples if power >= 0.5 * peak_power)
    return {"busy_samples": len(busy), "sm_clock_median_mhz": busy[len(busy) // 2][0],
            "sm_clock_lowest_mhz": busy[0][0], "power_capped_share": sum(1 for _, r in busy if r & 0x4) / len(busy),
            "peak_power_w": peak_power}


def step_seconds(out, name, tokens_per_step):
    """A run's step times: from llm.c's log (NAME.txt) for llm.c's runs, else from char_gpt's or torch_gpt.py's CSV;
    None when the run left neither."""
    log, table = os.path.join(out, f"{name}.txt"), os.path.join(out, f"{name}.csv")
    if name.startswith("llmc"):
        return llmc_step_seconds(open(log).read()) if os.path.exists(log) else None
    return csv_step_seconds(csv_rows(table), tokens_per_step) if os.path.exists(table) else None


def multi_gpu(out, engines, tokens_per_step, gpus, warmup_steps):
    """The G-GPU runs: tokens/s (over all ranks), efficiency against G × the one-GPU run, dyngrad / llm.c."""
    runs = {}
    for name, single, label in MULTI_ENGINES:
        seconds = step_seconds(out, name, tokens_per_step * gpus)
        rate = rate_after_warmup(seconds, tokens_per_step * gpus, warmup_steps) if seconds else None
        if rate is None:
            continue
        one = engines.get(single, {}).get("tokens_per_second")
        runs[name] = {"label": label, "timed_steps": len(seconds) - warmup_steps, "tokens_per_second": rate,
                      "efficiency": rate / (gpus * one) if one else None}
    if "dyngrad_multi" in runs and "llmc_multi" in runs:
        runs["dyngrad_multi"]["ratio_to_llmc_multi"] = (runs["dyngrad_multi"]["tokens_per_second"]
                                                        / runs["llmc_multi"]["tokens_per_second"])
    return runs or None


def reproducible(out):
    """reproducible.txt's key=value lines (the reproducible phase), with the deterministic runs' tokens/s relative to
    the normal run's; None without the file."""
    path = os.path.join(out, "reproducible.txt")
    if not os.path.exists(path):
        return None
    fields = dict(line.strip().split("=", 1) for line in open(path) if "=" in line and not line.startswith("#"))
    rates = {run: float(fields[f"tokens_per_second_{run}"]) if fields.get(f"tokens_per_second_{run}") else None
             for run in ("deterministic_1", "deterministic_2", "normal")}
    deterministic = [r for run, r in rates.items() if run != "normal" and r]
    relative = (sum(deterministic) / len(deterministic) / rates["normal"]
                if deterministic and rates["normal"] else None)
    return {"identical": fields.get("identical") == "yes", "parameters_identical": fields.get("parameters_identical") == "yes",
            "steps": int(fields.get("steps") or 0),
            "first_differing_step": int(fields["first_differing_step"]) if fields.get("first_differing_step") else None,
            "tokens_per_second": rates, "relative_to_normal": relative}


def curve_agreement(ours, theirs):
    """The largest relative difference of the training losses step by step, and of the final validation losses."""
    steps = min(len(ours), len(theirs))
    if steps == 0:
        return None
    train = max(abs(float(a["train_loss"]) - float(b["train_loss"])) / abs(float(b["train_loss"]))
                for a, b in zip(ours[:steps], theirs[:steps]))
    vals = [(float(a["val_loss"]), float(b["val_loss"])) for a, b in zip(ours, theirs) if a["val_loss"] and b["val_loss"]]
    final = abs(vals[-1][0] - vals[-1][1]) / vals[-1][1] if vals else None
    return {"steps": steps, "max_train_relative": train, "final_val_relative": final,
            "final_val": {"dyngrad": vals[-1][0], "torch": vals[-1][1]} if vals else None}


def summarise(out, batch, context, layers, width, vocab, warmup_steps, peak_tflops, gpus=4):
    tokens_per_step = batch * context
    per_token = flops_per_token(layers, width, context, vocab)
    engines = {}
    for name, label in ENGINES:
        seconds = step_seconds(out, name, tokens_per_step)
        if not seconds:
            continue
        rate = rate_after_warmup(seconds, tokens_per_step, warmup_steps)
        sampled, own = peak_memory_mib(out, name)
        engines[name] = {"label": label, "steps": len(seconds), "timed_steps": max(0, len(seconds) - warmup_steps),
                         "tokens_per_second": rate,
                         "mfu": rate * per_token / (peak_tflops * 1e12) if rate else None,
                         "peak_gpu_memory_mib": sampled, "peak_allocated_mib": own, "clocks": gpu_clocks(out, name)}
    build = os.path.join(out, "llmc_build.txt")
    llmc_cudnn = open(build).read().strip() == "cudnn=1" if os.path.exists(build) else None
    comparisons = {}
    for ours in ("dyngrad", "dyngrad_reduced"):
        paths = [os.path.join(out, f"compare_{side}.csv") for side in (ours, "torch")]
        if all(os.path.exists(p) for p in paths):
            comparisons[ours] = curve_agreement(csv_rows(paths[0]), csv_rows(paths[1]))
    comparison = comparisons.get("dyngrad")
    return {"date": str(datetime.date.today()), "batch": batch, "context": context, "layers": layers, "width": width,
            "vocab": vocab, "parameters": gpt2_parameters(layers, width, context, vocab),
            "flops_per_token": per_token, "peak_tflops": peak_tflops, "warmup_steps": warmup_steps,
            "llmc_cudnn_attention": llmc_cudnn, "engines": engines, "comparison": comparison,
            "comparison_reduced": comparisons.get("dyngrad_reduced"), "gpus": gpus,
            "multi_gpu": multi_gpu(out, engines, tokens_per_step, gpus, warmup_steps), "reproducible": reproducible(out)}


def markdown(summary):
    lines = [f"# GPT-2 ({summary['layers']} layers, width {summary['width']}, {summary['parameters']:,} parameters): "
             f"llm.c, PyTorch and dyngrad ({summary['date']})", "",
             f"Micro-batch {summary['batch']} x {summary['context']}, bf16; tokens/s over the steps after the first "
             f"{summary['warmup_steps']}; MFU by {summary['flops_per_token']:,} FLOPs per token against "
             f"{summary['peak_tflops']:g} TFLOP/s. llm.c's attention: "
             + {True: "cuDNN", False: "its own kernels (no cuDNN)", None: "not built"}[summary["llmc_cudnn_attention"]]
             + ".", "",
             "| engine | timed steps | tokens/s | MFU | peak GPU memory (nvidia-smi, MiB) | peak allocated (MiB) |",
             "|---|---:|---:|---:|---:|---:|"]
    fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    for e in summary["engines"].values():
        lines.append(f"| {e['label']} | {e['timed_steps']} | {fmt(e['tokens_per_second'], ',.0f')} | "
                     f"{fmt(e['mfu'], '.1%')} | {fmt(e['peak_gpu_memory_mib'], '.0f')} | "
                     f"{fmt(e['peak_allocated_mib'], '.0f')} |")
    clocked = [e for e in summary["engines"].values() if e.get("clocks")]
    if clocked:
        lines += ["", "GPU 0 while each engine ran (nvidia-smi every 200 ms; the samples at half the run's peak power "
                  "or more):", "",
                  "| engine | busy samples | SM clock median (MHz) | lowest (MHz) | at the power cap | peak power (W) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for e in clocked:
            c = e["clocks"]
            lines.append(f"| {e['label']} | {c['busy_samples']} | {c['sm_clock_median_mhz']:.0f} | "
                         f"{c['sm_clock_lowest_mhz']:.0f} | {c['power_capped_share']:.0%} | {c['peak_power_w']:.0f} |")
    engines = summary["engines"]
    for ours, others in RATIOS:
        if ours not in engines or not engines[ours]["tokens_per_second"]:
            continue
        for other in others:
            if other in engines and engines[other]["tokens_per_second"]:
                ratio = engines[ours]["tokens_per_second"] / engines[other]["tokens_per_second"]
                lines.append(f"\n{engines[ours]['label']} / {engines[other]['label']}: {ratio:.2f}x")
    for key, who in (("comparison", "dyngrad"), ("comparison_reduced", "dyngrad with a reduced residual stream")):
        c = summary.get(key)
        if c:
            lines.append(f"\nFrom identical weights and batches over {c['steps']} steps, {who}: training losses within "
                         f"{100 * c['max_train_relative']:.3f}% of PyTorch eager (autocast's recipe) at every step"
                         + (f"; final validation loss {c['final_val']['dyngrad']:.4f} vs {c['final_val']['torch']:.4f} "
                            f"({100 * c['final_val_relative']:.3f}%)" if c["final_val"] else "") + ".")
    multi = summary.get("multi_gpu")
    if multi:
        gpus = summary["gpus"]
        lines += ["", f"## {gpus} GPUs (mpirun -np {gpus}, data parallel)", "",
                  f"Each rank trains the one-GPU micro-batch {summary['batch']} x {summary['context']}: "
                  f"{gpus * summary['batch']} x {summary['context']} tokens a step, tokens/s summed over the ranks. "
                  f"Efficiency: tokens/s / ({gpus} x the same engine's one-GPU tokens/s).", "",
                  "| engine | timed steps | tokens/s | efficiency | / llm.c's multi-GPU run |", "|---|---:|---:|---:|---:|"]
        for run in multi.values():
            lines.append(f"| {run['label']} | {run['timed_steps']} | {fmt(run['tokens_per_second'], ',.0f')} | "
                         f"{fmt(run['efficiency'], '.3f')} | {fmt(run.get('ratio_to_llmc_multi'), '.2f')} |")
    r = summary.get("reproducible")
    if r:
        rates = r["tokens_per_second"]
        lines += ["", "## Reproducible mode (char_gpt --deterministic)", "",
                  f"Two --deterministic runs from the same seed, {r['steps']} steps: losses identical (the CSVs' loss "
                  f"fields as text): " + ("yes" if r["identical"] else f"no (first at step {r['first_differing_step']})")
                  + "; final parameters bit for bit identical: " + ("yes" if r["parameters_identical"] else "no")
                  + f". tokens/s: {fmt(rates['deterministic_1'], ',.0f')} and {fmt(rates['deterministic_2'], ',.0f')} "
                  f"deterministic, {fmt(rates['normal'], ',.0f')} without the flag: "
                  f"{fmt(r['relative_to_normal'], '.3f')} of the normal run."]
    return "\n".join(lines)


def plot(out):
    """gpt2_loss_curves.png from the comparison's CSVs; False without matplotlib or the CSVs."""
    paths = {side: os.path.join(out, f"compare_{side}.csv") for side in ("dyngrad", "torch", "dyngrad_reduced")}
    if not os.path.exists(paths["torch"]) or not any(os.path.exists(paths[s]) for s in ("dyngrad", "dyngrad_reduced")):
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(8, 5))
    for (side, path), style, label in zip(paths.items(), ("-", "--", ":"),
                                          ("dyngrad", "PyTorch eager", "dyngrad, reduced residual")):
        if not os.path.exists(path):
            continue
        rows = csv_rows(path)
        axes.plot([int(r["step"]) for r in rows], [float(r["train_loss"]) for r in rows], style, linewidth=1,
                  label=f"{label} train")
        vals = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
        if vals:
            axes.plot(*zip(*vals), style, marker="o", label=f"{label} validation")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats per token)")
    axes.set_title("GPT-2 from identical weights and batches: dyngrad vs PyTorch (bf16)")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(os.path.join(out, "gpt2_loss_curves.png"), dpi=120)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=4, help="the ranks of llmc_multi and dyngrad_multi")
    args = parser.parse_args(argv)
    peak = float(os.environ.get("GPU_PEAK_TFLOPS", "989"))
    summary = summarise(args.out, args.batch, args.context, args.layers, args.width, args.vocab, args.warmup_steps, peak,
                        args.gpus)
    if not summary["engines"]:
        sys.exit(f"gpt2_report.py: no runs found in {args.out}")
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(markdown(summary))
    print(f"\nLoss curves: {os.path.join(args.out, 'gpt2_loss_curves.png')}" if plot(args.out)
          else "\n(no gpt2_loss_curves.png: matplotlib or the comparison's CSVs missing)")


if __name__ == "__main__":
    main()
