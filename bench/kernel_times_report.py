#!/usr/bin/env python3
"""scripts/run-kernel-times.sh's report: dyngrad-perf --kernel-times beside torch_reference.py --kernel-counts.

    kernel_times_report.py DYNGRAD_TXT TORCH_TXT [--env ENV_TXT] [--out REPORT_MD]

Both outputs hold lines "kernels NAME MODE: N per step, X us of kernel time, busy B us, span S us, idle I us (...)"
(bench/kernel_trace.cpp print_kernel_times, torch_reference.py kernel_times_line), each followed by its kernels
("    D us  NAME"). The report: one table of the step figures, then per workload the captured step's kernels
beside torch.compile's.
"""
import argparse
import re
import sys

LINE = re.compile(r"^kernels (\S+) (\S+): (\d+) per step, ([\d.]+) us of kernel time, busy ([\d.]+) us, "
                  r"span ([\d.]+) us, idle (-?[\d.]+) us")
KERNEL = re.compile(r"^\s+([\d.]+) us  (.*)$")


def parse(path):
    """{(workload, mode): {"kernels", "kernel_us", "busy_us", "span_us", "idle_us", "list": [(us, name)]}}"""
    rows, current = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                current = {"kernels": int(m[3]), "kernel_us": float(m[4]), "busy_us": float(m[5]),
                           "span_us": float(m[6]), "idle_us": float(m[7]), "list": []}
                rows[(m[1], m[2])] = current
                continue
            k = KERNEL.match(line)
            if k and current is not None:
                current["list"].append((float(k[1]), k[2].strip()))
            elif not line.startswith(" "):
                current = None
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dyngrad")
    parser.add_argument("torch")
    parser.add_argument("--env")
    parser.add_argument("--out")
    args = parser.parse_args()
    ours, theirs = parse(args.dyngrad), parse(args.torch)
    if not ours or not theirs:
        sys.exit(f"kernel_times_report.py: no 'kernels' lines in {args.dyngrad if not ours else args.torch}")
    workloads = list(dict.fromkeys(name for name, _ in list(ours) + list(theirs)))
    out = ["# Per-kernel device times of one training step: dyngrad against PyTorch", ""]
    if args.env:
        with open(args.env, encoding="utf-8") as f:
            out += ["```", f.read().strip(), "```", ""]
    out += ["Each figure is the median over the profiled steps, each step run alone on an idle device (CUPTI's activity "
            "records on both sides: dyngrad-perf --kernel-times, torch.profiler). *kernel µs*: the kernels' durations "
            "summed; *busy*: the union of the kernels' and memsets' intervals (side lanes overlap); *span*: first "
            "start to last end; *idle*: span − busy, the device waiting between kernels inside the step. A step's "
            "wall time adds the launch of its first kernel and the synchronisation. The device time to compare is "
            "*busy*: a span also holds the host's time between launches that a profiled step spends, and "
            "PyTorch's compiled step launches from Python (its optimizer after the graph), which the profiler "
            "slows by milliseconds; dyngrad's captured step is its input copies and one graph launch. Kernels "
            "that run side by side (dyngrad's weight gradients on a side lane) each last longer than alone: "
            "their durations add up to more than *busy*.", "",
            "| workload | dyngrad mode | kernels | kernel µs | busy µs | span µs | idle µs | torch mode | kernels | "
            "kernel µs | busy µs | span µs | idle µs | busy dyngrad/torch |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    fields = ("kernels", "kernel_us", "busy_us", "span_us", "idle_us")

    def cells(row):
        if row is None:
            return ["-"] * len(fields)
        return [str(row["kernels"])] + [f"{row[f]:.1f}" for f in fields[1:]]

    for name in workloads:
        for mine, other in (("eager", "eager"), ("captured", "compiled")):
            a, b = ours.get((name, mine)), theirs.get((name, other))
            ratio = f"{a['busy_us'] / b['busy_us']:.2f}" if a and b and b["busy_us"] > 0 else "-"
            out.append("| " + " | ".join([name, mine] + cells(a) + [other] + cells(b) + [ratio]) + " |")
    for name in workloads:
        a, b = ours.get((name, "captured")), theirs.get((name, "compiled"))
        if not a or not b or not (a["list"] or b["list"]):
            continue
        out += ["", f"## {name}: the captured step's kernels beside torch.compile's (µs, launch order)", "", "```"]
        width = 72
        for i in range(max(len(a["list"]), len(b["list"]))):
            left = f"{a['list'][i][0]:7.2f}  {a['list'][i][1][:width - 9]}" if i < len(a["list"]) else ""
            right = f"{b['list'][i][0]:7.2f}  {b['list'][i][1][:width - 9]}" if i < len(b["list"]) else ""
            out.append(f"{left:<{width}} | {right}")
        out.append(f"{'sum ' + format(a['kernel_us'], '.1f'):<{width}} | sum {b['kernel_us']:.1f}")
        out.append("```")
    text = "\n".join(out) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
