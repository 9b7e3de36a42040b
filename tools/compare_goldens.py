#!/usr/bin/env python3
"""Compares two sets of golden files (tools/make_goldens.py output), e.g. the committed tests/goldens/ with a
set made by another PyTorch version or machine: for every op, the largest relative-norm difference
|a - b| / max(|b|, tiny) over its outputs and gradients, and whether the files are identical byte for byte.
    python tools/compare_goldens.py DIR_A DIR_B
Exit status 1 when an op is missing from one side or a difference exceeds --tolerance (default 1e-12)."""
import argparse
import pathlib
import sys

import torch
from safetensors.torch import load_file


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--tolerance", type=float, default=1e-12)
    args = parser.parse_args()
    a_dir, b_dir = pathlib.Path(args.a), pathlib.Path(args.b)
    names = sorted({p.name for p in a_dir.glob("*.safetensors")} | {p.name for p in b_dir.glob("*.safetensors")})
    worst_overall, failed, identical = 0.0, False, 0
    for name in names:
        pa, pb = a_dir / name, b_dir / name
        if not pa.exists() or not pb.exists():
            print(f"{name}: only in {'B' if not pa.exists() else 'A'}")
            failed = True
            continue
        if pa.read_bytes() == pb.read_bytes():
            identical += 1
        ta, tb = load_file(str(pa)), load_file(str(pb))
        if ta.keys() != tb.keys():
            print(f"{name}: different tensors: {sorted(ta.keys() ^ tb.keys())}")
            failed = True
            continue
        worst, worst_key = 0.0, ""
        for key in ta:
            x, y = ta[key].double(), tb[key].double()
            if x.shape != y.shape:
                print(f"{name}: {key} has shapes {tuple(x.shape)} and {tuple(y.shape)}")
                failed = True
                continue
            err = (x - y).norm().item() / max(y.norm().item(), 1e-300)
            if err > worst:
                worst, worst_key = err, key
        worst_overall = max(worst_overall, worst)
        failed = failed or worst > args.tolerance
        print(f"{name}: max relative difference {worst:.3g}{' (' + worst_key + ')' if worst_key else ''}")
    print(f"{len(names)} ops, {identical} identical byte for byte, worst relative difference {worst_overall:.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
