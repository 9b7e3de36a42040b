#!/usr/bin/env python3
"""The report of scripts/run-second-order-bench.sh, from OUT_DIR: dyngrad.json and torch.json (the H·v and PINN
timings), gpt-plain.{txt,csv} and gpt-checkpointed.{txt,csv} (char_gpt without and with --checkpoint-activations).
Writes OUT_DIR/report.json and prints the markdown report. Targets (issue 31): H·v and the PINN step at most 1.0x
PyTorch's double backward; checkpointing every block: the step's own memory at least 3x lower at most 30% more step
time. A missing input is reported as missing, never filled in."""
import csv
import json
import os
import re
import statistics
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rows_by_workload(data):
    return {r["workload"]: r for r in (data or {}).get("rows", [])}


def gpt_run(out, setting, warmup=10):
    """(median step seconds after warm-up, peak bytes, step bytes), None where absent."""
    seconds = None
    try:
        with open(os.path.join(out, f"gpt-{setting}.csv")) as f:
            rates = [float(r["tokens_per_second"]) for r in csv.DictReader(f)]
        tokens = None
        text = open(os.path.join(out, f"gpt-{setting}.txt")).read()
        m = re.search(r"batch (\d+), steps", text)
        ctx = re.search(r"context (\d+)", text)
        if m and ctx and len(rates) > warmup:
            tokens = int(m.group(1)) * int(ctx.group(1))
            seconds = statistics.median(tokens / r for r in rates[warmup:])
    except (OSError, ValueError, KeyError):
        text = ""
    values = {k: int(v) for k, v in re.findall(r"^(peak_memory_bytes|step_memory_bytes)=(\d+)", text, re.M)}
    return seconds, values.get("peak_memory_bytes"), values.get("step_memory_bytes")


def main():
    out = sys.argv[1]
    ours, theirs = rows_by_workload(load_json(os.path.join(out, "dyngrad.json"))), rows_by_workload(
        load_json(os.path.join(out, "torch.json")))
    torch_meta = load_json(os.path.join(out, "torch.json")) or {}
    ours_meta = load_json(os.path.join(out, "dyngrad.json")) or {}
    report = {"device": ours_meta.get("device"), "torch": torch_meta.get("torch"), "second_order": [], "checkpointing": {}}
    lines = ["# Second-order gradients and activation checkpointing against PyTorch", "",
             f"Device: {ours_meta.get('device')}; PyTorch {torch_meta.get('torch')}. Float32, TF32 off; ms per "
             "iteration, the median over repetitions (bench/second_order_bench.cpp, bench/torch_second_order.py).", "",
             "| workload | dyngrad ms | PyTorch double backward ms | ratio | torch.func ms | ratio | target ≤ 1.0 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    pairs = [("hvp_mlp", "hvp_mlp", "hvp_mlp_func"), ("hvp_mlp_api", "hvp_mlp", "hvp_mlp_func"),
             ("pinn_step", "pinn_step", None)]
    for mine, double, func in pairs:
        a = ours.get(mine, {}).get("ms")
        b = theirs.get(double, {}).get("ms")
        c = theirs.get(func, {}).get("ms") if func else None
        ratio = a / b if a and b else None
        ratio_func = a / c if a and c else None
        report["second_order"].append({"workload": mine, "dyngrad_ms": a, "torch_double_backward_ms": b,
                                       "torch_func_ms": c, "ratio": ratio, "ratio_func": ratio_func})
        fmt = lambda v, spec=".4f": "–" if v is None else format(v, spec)  # noqa: E731
        verdict = "–" if ratio is None else ("met" if ratio <= 1.0 else "**missed**")
        lines.append(f"| {mine} | {fmt(a)} | {fmt(b)} | {fmt(ratio, '.2f')} | {fmt(c)} | {fmt(ratio_func, '.2f')} | {verdict} |")
    plain, checkpointed = gpt_run(out, "plain"), gpt_run(out, "checkpointed")
    lines += ["", "Activation checkpointing, char GPT in bf16 (char_gpt, the same run without and with "
              "--checkpoint-activations; step time: median after 10 warm-up steps; step memory: the largest step's "
              "peak allocation over what was in use when it began — its activations, gradients and temporaries):", "",
              "| setting | step ms | peak allocated MiB | step memory MiB |", "| --- | ---: | ---: | ---: |"]
    for name, (seconds, peak, step) in (("plain", plain), ("every block checkpointed", checkpointed)):
        fmt_ms = "–" if seconds is None else f"{seconds * 1e3:.2f}"
        fmt_mib = lambda v: "–" if v is None else f"{v / 2**20:.1f}"  # noqa: E731
        lines.append(f"| {name} | {fmt_ms} | {fmt_mib(peak)} | {fmt_mib(step)} |")
    memory_ratio = plain[2] / checkpointed[2] if plain[2] and checkpointed[2] else None
    time_ratio = checkpointed[0] / plain[0] if plain[0] and checkpointed[0] else None
    report["checkpointing"] = {"plain": plain, "checkpointed": checkpointed, "step_memory_ratio": memory_ratio,
                               "step_time_ratio": time_ratio}
    if memory_ratio and time_ratio:
        lines += ["", f"Step memory {memory_ratio:.2f}x lower (target ≥ 3: {'met' if memory_ratio >= 3 else 'missed'}) "
                      f"at {100 * (time_ratio - 1):+.1f}% step time (target ≤ +30%: "
                      f"{'met' if time_ratio <= 1.3 else 'missed'})."]
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
