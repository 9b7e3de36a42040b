#!/usr/bin/env python3
"""Side-by-side markdown report of dyngrad-perf and bench/torch_reference.py (issue 17's targets: PyTorch eager, CUDA-graph replay, torch.compile
and torch.compile + graph replay).

    python3 bench/compare_perf.py dyngrad.json torch.json \
        [--tta-dyngrad train.log --tta-torch torch_tta.json]... [--out report.md]

dyngrad.json comes from `dyngrad-perf --json`, torch.json from `torch_reference.py --json`; train.log is the
output of `dyngrad-train --target-accuracy ...` and torch_tta.json that of `torch_reference.py
--time-to-accuracy --json`. Standard library only. Exit status 0 (the report says which targets are missed),
2 for unreadable input.
"""
import argparse
import json
import math
import re
import statistics
import sys

# Issue 17's targets per (workload, dyngrad mode): (quantity, torch mode, bound, text). ratio = dyngrad ms /
# torch ms of that torch mode, speedup = its inverse, copy = dyngrad's share of the device copy bandwidth.
TARGETS = {
    ("lenet5_b64", "eager"): [("speedup", "eager", 5.0, ">= 5x torch eager")],
    ("lenet_b256", "eager"): [("speedup", "eager", 3.0, ">= 3x torch eager")],
    ("mlp784_b64", "eager"): [("speedup", "eager", 7.0, ">= 7x torch eager")],
    ("mlp4096_fp32", "eager"): [("ratio", "eager", 1.0, "<= 1.0x torch eager")],
    ("mlp4096_tf32", "eager"): [("ratio", "eager", 1.0, "<= 1.0x torch eager")],
    ("mul64m", "eager"): [("copy", None, 0.95, ">= 95% of copy BW")],
    ("mul64m", "captured"): [("ratio", "compiled_captured", 0.9, "<= 0.9x compile+graph"),
                             ("copy", None, 0.95, ">= 95% of copy BW")],
}
CAPTURED_TARGET = [("ratio", "compiled_captured", 0.9, "<= 0.9x compile+graph")]
TORCH_MODES = ("eager", "captured", "compiled", "compiled_captured")
HOST_TARGET_US = 1.0
TTA_TARGET_SPEEDUP = 3.0


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        sys.exit(f"compare_perf.py: cannot read {path}: {error}")


def targets(workload, mode):
    return TARGETS.get((workload, mode), CAPTURED_TARGET if mode == "captured" else [])


def met(quantity, bound, ratio, copy):
    if quantity == "speedup":
        return ratio is not None and 1.0 / ratio >= bound
    if quantity == "ratio":
        return ratio is not None and ratio <= bound
    return copy is not None and copy >= bound


def mib(value):
    return f"{value / 2**20:.1f}" if value is not None else "-"


def spread(row):
    """(max - min) / median of a row's repetition samples, in percent: how much that side varied in this run."""
    samples = row.get("samples_ms") or []
    return 100.0 * (max(samples) - min(samples)) / row["ms"] if samples and row.get("ms") else None


def perf_table(ours, theirs, summary):
    torch_rows = {(r["workload"], r["mode"]): r for r in theirs.get("rows", [])}

    def torch_ms(workload, mode):
        r = torch_rows.get((workload, mode))
        return r["ms"] if r and "error" not in r else None

    lines = ["| workload | dyngrad mode | dyngrad ms | kernels/step | torch eager | torch graph | torch compile "
             "| torch compile+graph | vs same mode | vs compile+graph | target | met? | torch spread % "
             "| dyngrad peak MiB | torch peak MiB (same mode) | memory <= torch? |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|"]
    for row in ours.get("rows", []):
        key = (row["workload"], row["mode"])
        goals = targets(*key)
        target_text = "; ".join(g[3] for g in goals) or "-"
        same = torch_rows.get(key)
        if "error" in row:
            lines.append(f"| {key[0]} | {key[1]} | error: {row['error'].splitlines()[0][:80]} |" + " - |" * 13)
            if goals:
                summary.append((f"{key[0]} {key[1]} ({target_text})", False))
            continue
        columns = {m: torch_ms(key[0], m) for m in TORCH_MODES}
        copy = row.get("copy_fraction")
        verdicts = []
        for quantity, mode, bound, _ in goals:
            other = columns.get(mode) if mode else None
            verdicts.append(met(quantity, bound, row["ms"] / other if other else None, copy))
        verdict = ("yes" if all(verdicts) else "**no**") if goals else "-"
        if goals:
            summary.append((f"{key[0]} {key[1]} ({target_text})", all(verdicts)))
        same_ms = columns.get(key[1])
        vs_same = f"{row['ms'] / same_ms:.3f}" if same_ms else "-"
        anchor = columns.get("compiled_captured")
        vs_anchor = f"{row['ms'] / anchor:.3f}" if anchor else "-"
        memory = "-"
        if same and "error" not in same:
            memory_ok = row["peak_bytes"] <= same["peak_bytes"]
            summary.append((f"{key[0]} {key[1]} peak memory <= torch {key[1]}", memory_ok))
            memory = "yes" if memory_ok else "**no**"
        spreads = [spread(torch_rows[(key[0], m)]) for m in TORCH_MODES
                   if (key[0], m) in torch_rows and "error" not in torch_rows[(key[0], m)]]
        spreads = [x for x in spreads if x is not None]
        spread_text = f"{min(spreads):.1f}-{max(spreads):.1f}" if spreads else "-"
        extra = f" ({100 * copy:.1f}% of copy)" if copy is not None else ""
        kernels = row.get("graph_kernels", "-") if key[1] == "captured" else "-"

        def ms(value):
            return f"{value:.4f}" if value else "-"

        lines.append(f"| {key[0]} | {key[1]} | {row['ms']:.4f}{extra} | {kernels} | {ms(columns['eager'])} "
                     f"| {ms(columns['captured'])} | {ms(columns['compiled'])} | {ms(columns['compiled_captured'])} "
                     f"| {vs_same} | {vs_anchor} | {target_text} | {verdict} | {spread_text} "
                     f"| {mib(row['peak_bytes'])} | {mib(same.get('peak_bytes')) if same else '-'} | {memory} |")
    errors = [f"- torch {r['workload']} {r['mode']}: {r['error'].splitlines()[0][:120]}"
              for r in theirs.get("rows", []) if "error" in r]
    if errors:
        lines += ["", "PyTorch rows that failed:"] + errors
    return lines


def floor_lines(ours):
    floors = ours.get("floors")
    rows = [r for r in ours.get("rows", []) if r.get("mode") == "captured" and "floor_launch_ms" in r]
    if not floors or not rows:
        return []
    lines = ["", f"Distance to the floors (dyngrad captured steps). Floors measured in the same run: "
                 f"{floors['us_per_graph_kernel_node']:.3f} µs per kernel node of a replayed graph, "
                 f"{floors['copy_gbs']:.1f} GB/s device copy, cuBLAS 8192³ GEMM {floors['gemm_tflops_f32']:.1f} "
                 f"TFLOP/s f32 / {floors['gemm_tflops_tf32']:.1f} TFLOP/s TF32:", "",
             "| workload | kernels | memsets | launch floor ms | memory floor ms | compute floor ms | measured ms "
             "| × the highest floor | bound by |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        floor = max(r["floor_launch_ms"], r["floor_memory_ms"], r["floor_compute_ms"])
        lines.append(f"| {r['workload']} | {r['graph_kernels']} | {r['graph_memsets']} | {r['floor_launch_ms']:.4f} "
                     f"| {r['floor_memory_ms']:.4f} | {r['floor_compute_ms']:.4f} | {r['ms']:.4f} "
                     f"| {r['ms'] / floor:.2f} | {r['bound_by']} |")
    return lines


def host_lines(ours, theirs, summary):
    h, t = ours.get("host_overhead"), theirs.get("host_overhead") or {}
    if not h:
        return []
    ok = h["cpu_record_us_per_op"] <= HOST_TARGET_US
    summary.append((f"host overhead <= {HOST_TARGET_US} us/op (CPU tensors, engine alone)", ok))

    def value(d, k):
        return f"{d[k]:.3f}" if k in d else "-"

    return ["", f"Host overhead per recorded op (chain of {h['chain']} adds on 1-element tensors, median µs; "
                f"target <= {HOST_TARGET_US} µs/op on the CPU figure, the engine alone):", "",
            "| figure | dyngrad | torch |", "|---|---:|---:|",
            f"| (a) record + dispatch, CPU tensors, µs/op | {value(h, 'cpu_record_us_per_op')} "
            f"| {value(t, 'cpu_record_us_per_op')} |",
            f"| backward, CPU tensors, µs/node | {value(h, 'cpu_backward_us_per_node')} "
            f"| {value(t, 'cpu_backward_us_per_node')} |",
            f"| (b) record + dispatch, CUDA tensors, host µs/op | {value(h, 'cuda_record_host_us_per_op')} "
            f"| {value(t, 'cuda_record_host_us_per_op')} |",
            f"| backward, CUDA tensors, host µs/node | {value(h, 'cuda_backward_host_us_per_node')} "
            f"| {value(t, 'cuda_backward_host_us_per_node')} |",
            f"| one bare launch of an empty kernel, µs | {value(h, 'cuda_empty_launch_us')} | - |",
            "", f"(a) target met: {'yes' if ok else '**no**'}"]


def parse_train_log(path):
    values = {}
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"^(epochs_to_target|time_to_target_s|evaluation_s|test_accuracy)=([0-9.]+)\s*$", line)
                if m:
                    values[m.group(1)] = float(m.group(2))
    except OSError as error:
        sys.exit(f"compare_perf.py: cannot read {path}: {error}")
    if "time_to_target_s" not in values:
        sys.exit(f"compare_perf.py: {path} has no time_to_target_s= line (dyngrad-train --target-accuracy)")
    return values


def tta_compiled_lines(ours_logs, compiled_jsons):
    """Time to accuracy against torch.compile(model) (reported, no target): medians over the seeds."""
    ours = [parse_train_log(p) for p in ours_logs]
    theirs = [load(p) for p in compiled_jsons]
    ours_times = [o["time_to_target_s"] if o["epochs_to_target"] else math.inf for o in ours]
    theirs_times = [t["time_to_target_s"] if t.get("epochs_to_target") else math.inf for t in theirs]
    ours_median, theirs_median = statistics.median(ours_times), statistics.median(theirs_times)
    lines = ["", "| seed | torch.compile epochs | torch.compile s |", "|---:|---:|---:|"]
    lines += [f"| {t.get('seed')} | {t.get('epochs_to_target') or 'not reached'} | "
              f"{t['time_to_target_s']:.3f} |" if t.get("epochs_to_target") else
              f"| {t.get('seed')} | not reached | - |" for t in theirs]
    if math.isfinite(ours_median) and math.isfinite(theirs_median):
        lines += [f"median time to target against torch.compile(model): dyngrad {ours_median:.3f} s, torch.compile "
                  f"{theirs_median:.3f} s; speed-up {theirs_median / ours_median:.2f}x (compilation before the clock)"]
    return lines


def tta_lines(ours_logs, theirs_jsons, summary):
    """One row per seed (each seed: the same initial weights and epoch order on both sides), then the medians.

    Epochs to a threshold that lies on the accuracy plateau vary from seed to seed on either side (float
    rounding makes two runs from the same weights drift apart), so the target is judged on the median time.
    """
    rows, ours_times, theirs_times, ours_epoch_s, theirs_epoch_s = [], [], [], [], []
    target = batch = None
    for ours_log, theirs_json in zip(ours_logs, theirs_jsons):
        ours, theirs = parse_train_log(ours_log), load(theirs_json)
        target, batch = theirs.get("target_accuracy"), theirs.get("batch")
        ours_epochs, theirs_epochs = int(ours["epochs_to_target"]), int(theirs.get("epochs_to_target") or 0)
        theirs_seconds = [e["train_seconds"] for e in theirs.get("epochs", [])]
        # A run that never reached the target counts as infinitely slow: it can only raise the median.
        ours_times.append(ours["time_to_target_s"] if ours_epochs else math.inf)
        theirs_times.append(theirs["time_to_target_s"] if theirs_epochs else math.inf)
        if ours_epochs:
            ours_epoch_s.append(ours["time_to_target_s"] / ours_epochs)
        if theirs_seconds:
            theirs_epoch_s.append(sum(theirs_seconds) / len(theirs_seconds))
        ours_s = f"{ours['time_to_target_s']:.3f}" if ours_epochs else "-"
        theirs_s = f"{theirs['time_to_target_s']:.3f}" if theirs_epochs else "-"
        rows.append(f"| {theirs.get('seed')} | {ours_epochs or 'not reached'} | {ours_s} | "
                    f"{theirs_epochs or 'not reached'} | {theirs_s} |")
    lines = ["", f"Time to {target} test accuracy, lenet on Fashion-MNIST, Adam 1e-3, batch {batch}, data on the GPU; "
                 "per seed the same initial weights (lenet as PyTorch initialises it by default for that seed, saved by "
                 "torch_reference.py --save-default-init and loaded by both) and the "
                 "same epoch order (training seconds, evaluation excluded):", "",
             "| seed | dyngrad epochs | dyngrad s | torch epochs | torch s |", "|---:|---:|---:|---:|---:|"] + rows
    if ours_epoch_s and theirs_epoch_s:
        lines += ["", f"training seconds per epoch (mean over the runs): dyngrad {statistics.mean(ours_epoch_s):.3f}, "
                      f"torch {statistics.mean(theirs_epoch_s):.3f} "
                      f"({statistics.mean(theirs_epoch_s) / statistics.mean(ours_epoch_s):.2f}x)"]
    ours_median, theirs_median = statistics.median(ours_times), statistics.median(theirs_times)
    if math.isfinite(ours_median) and math.isfinite(theirs_median):
        speedup = theirs_median / ours_median
        ok = speedup >= TTA_TARGET_SPEEDUP
        lines += [f"median time to target over {len(rows)} seeds: dyngrad {ours_median:.3f} s, torch "
                  f"{theirs_median:.3f} s; speed-up {speedup:.2f}x (target >= {TTA_TARGET_SPEEDUP}x): "
                  f"{'met' if ok else '**not met**'}"]
        summary.append((f"time to accuracy >= {TTA_TARGET_SPEEDUP}x faster (median over {len(rows)} seeds)", ok))
    else:
        summary.append((f"time to accuracy >= {TTA_TARGET_SPEEDUP}x faster (the median run of a side did not reach "
                        "the target)", False))
    return lines


def main():
    parser = argparse.ArgumentParser(description="dyngrad-perf vs torch_reference.py, as markdown")
    parser.add_argument("dyngrad_json")
    parser.add_argument("torch_json")
    parser.add_argument("--tta-dyngrad", action="append", default=[],
                        help="output of dyngrad-train --target-accuracy (once per seed)")
    parser.add_argument("--tta-torch", action="append", default=[],
                        help="JSON of torch_reference.py --time-to-accuracy (once per seed, same order)")
    parser.add_argument("--tta-torch-compiled", action="append", default=[],
                        help="JSON of torch_reference.py --time-to-accuracy --compile (once per seed, same order)")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    ours, theirs = load(args.dyngrad_json), load(args.torch_json)
    summary = []
    # "fusion": the mode ("off", "captured", "all"; older records: true/false for all/off)
    fusion = {True: ", fusion compiler on (DYNGRAD_FUSION=1)", False: ", fusion compiler off",
              "off": ", fusion compiler off", "captured": ", fusion compiler on in captured steps (the default)",
              "all": ", fusion compiler on in captured and eager steps (DYNGRAD_FUSION=1)"}.get(ours.get("fusion"), "")
    lines = [f"dyngrad: {ours.get('device', '?')}{fusion}", "",
             f"torch: {theirs.get('device', '?')}, torch {theirs.get('torch', '?')}, CUDA {theirs.get('cuda', '?')}, "
             f"cuDNN {theirs.get('cudnn', '?')}, cudnn.benchmark {theirs.get('cudnn_benchmark', '?')}", "",
             "ms per training step: median of repetitions of K steps, each timed from a synchronised device to the "
             "end of a device synchronisation; peak = absolute peak bytes allocated during one step "
             "(parameters, optimizer state and inputs included). PyTorch's figure includes its cuBLAS/cuBLASLt "
             "workspaces (tens of MiB, allocated through its caching allocator); cuBLAS allocates dyngrad's itself, "
             "outside dyngrad's allocator. A replay allocates nothing: in captured mode both count the tensors alive "
             "across the step, not the graph's private working memory.", ""]
    if "copy_bandwidth_gbs" in ours:
        lines += [f"device-to-device copy bandwidth: dyngrad run {ours['copy_bandwidth_gbs']:.1f} GB/s, "
                  f"torch run {theirs.get('copy_bandwidth_gbs', 0):.1f} GB/s (read + write)", ""]
    lines += perf_table(ours, theirs, summary)
    lines += floor_lines(ours)
    lines += host_lines(ours, theirs, summary)
    if len(args.tta_dyngrad) != len(args.tta_torch):
        sys.exit("compare_perf.py: give --tta-dyngrad and --tta-torch the same number of times (one per seed)")
    if args.tta_dyngrad:
        lines += tta_lines(args.tta_dyngrad, args.tta_torch, summary)
        if args.tta_torch_compiled:
            if len(args.tta_torch_compiled) != len(args.tta_dyngrad):
                sys.exit("compare_perf.py: give --tta-torch-compiled once per seed, as --tta-dyngrad")
            lines += tta_compiled_lines(args.tta_dyngrad, args.tta_torch_compiled)
    missed = [name for name, ok in summary if not ok]
    lines += ["", f"targets met: {len(summary) - len(missed)} of {len(summary)}"]
    lines += [f"- not met: {name}" for name in missed]
    report = "\n".join(lines) + "\n"
    sys.stdout.write(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
