#!/usr/bin/env python3
"""Markdown table of dyngrad-op-bench's JSON against bench/torch_ops.py's: op, size, dyngrad ms, PyTorch ms,
ratio (dyngrad / PyTorch: above 1, dyngrad is slower). Rows join on (op, size); a missing side shows '-'.

    python3 bench/compare_ops.py ops.json torch_ops.json
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    ours, theirs = (json.load(open(path)) for path in sys.argv[1:])
    torch_ms = {(r["op"], r["size"]): r["ms"] for r in theirs["rows"]}
    note = "" if theirs.get("native_rms_norm", True) else "; torch rms_norm written with torch ops"
    print(f"dyngrad: {ours['device']}; torch {theirs.get('torch', '?')} on {theirs['device']}{note}")
    print(f"float32 forward + backward, median of {ours['repetitions']} after {ours['warmup']} warm-up\n")
    print("| op | size | dyngrad ms | PyTorch ms | ratio |")
    print("|---|---|---:|---:|---:|")
    seen = set()
    for r in ours["rows"]:
        key = (r["op"], r["size"])
        seen.add(key)
        t = torch_ms.get(key)
        ratio = f"{r['ms'] / t:.2f}" if t else "-"
        print(f"| {r['op']} | {r['size']} | {r['ms']:.3f} | {t:.3f} | {ratio} |" if t else
              f"| {r['op']} | {r['size']} | {r['ms']:.3f} | - | - |")
    for (op, size), t in torch_ms.items():
        if (op, size) not in seen:
            print(f"| {op} | {size} | - | {t:.3f} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
