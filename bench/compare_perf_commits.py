#!/usr/bin/env python3
"""The report of scripts/run-perf-against.sh: dyngrad-perf of this tree (head) against a base commit's, from the
JSON of several alternating rounds per side. Per workload and mode: the median over rounds of each side's per-step
time, head/base, and the noise: the largest relative spread (max/min - 1) between rounds of the same side. A row is
"slower" when head/base - 1 exceeds both 3% and that noise, "faster" likewise the other way, "same" otherwise."""
import argparse
import json
import statistics
import sys


def load(paths):
    """{(workload, mode): [ms per round]}, plus the device name of the first file."""
    rows, device = {}, None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        device = device or data.get("device")
        for row in data.get("rows", []):
            if "ms" in row:
                rows.setdefault((row["workload"], row["mode"]), []).append(float(row["ms"]))
    return rows, device


def spread(values):
    return max(values) / min(values) - 1.0 if len(values) > 1 and min(values) > 0 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--head", nargs="+", required=True)
    parser.add_argument("--base", nargs="+", required=True)
    parser.add_argument("--base-name", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    head, device = load(args.head)
    base, _ = load(args.base)
    lines = [f"# dyngrad-perf: this tree against {args.base_name}", "",
             f"Device: {device}. {len(args.head)} rounds per side, run alternately (head, base, ...); ms per step is "
             "the median over rounds of each round's own median; noise is the largest spread between rounds of one "
             "side; a row is slower/faster when the ratio departs from 1 by more than 3% and more than the noise.", "",
             "| workload | mode | head ms | base ms | head/base | noise | verdict |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    slower = 0
    for key in sorted(set(head) | set(base)):
        h, b = head.get(key), base.get(key)
        if not h or not b:
            lines.append(f"| {key[0]} | {key[1]} | {statistics.median(h) if h else '–'} | "
                         f"{statistics.median(b) if b else '–'} | – | – | only one side |")
            continue
        hm, bm = statistics.median(h), statistics.median(b)
        ratio = hm / bm
        noise = max(spread(h), spread(b))
        verdict = "same"
        if ratio - 1 > max(0.03, noise):
            verdict, slower = "**slower**", slower + 1
        elif 1 - ratio > max(0.03, noise):
            verdict = "faster"
        lines.append(f"| {key[0]} | {key[1]} | {hm:.4f} | {bm:.4f} | {ratio:.3f} | {noise * 100:.1f}% | {verdict} |")
    lines += ["", f"Rows slower beyond noise: {slower}."]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
