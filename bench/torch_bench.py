"""What the PyTorch sides of the GPU benchmarks share (torch_ops.py, torch_lstm.py, torch_attention.py): the
command line's common options, PyTorch with its CUDA device, and the JSON the scripts/run-*-bench.sh reports read.
"""
import argparse
import json
import sys


def parser(doc, repetitions):
    """An argument parser described by the first line of `doc`, with --repetitions and --json."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--repetitions", type=int, default=repetitions)
    p.add_argument("--json", help="write the rows here")
    return p


def cuda_torch(program):
    """torch (imported here, so that --help works without it) and its CUDA device; without one, says so on stderr
    and exits 77 (skipped)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{program}: no CUDA device", file=sys.stderr)
        sys.exit(77)
    return torch, torch.device("cuda")


def write_json(path, result):
    """`result` as JSON in `path`, when the command line named one."""
    if path:
        with open(path, "w") as out:
            json.dump(result, out, indent=1)
