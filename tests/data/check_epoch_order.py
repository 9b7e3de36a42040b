#!/usr/bin/env python3
"""bench/torch_reference.py's epoch_permutation() must give dyngrad's epoch order (core/dataset.cpp) exactly,
so the time-to-accuracy runs of PyTorch and dyngrad-train see the same batches. Runs the C++ side through
tests/epoch_order_dump and compares whole permutations.

    python3 tests/data/check_epoch_order.py BUILD/tests/epoch_order_dump
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from torch_reference import epoch_permutation  # noqa: E402  (works without torch)

# (n, seed, epoch): Fashion-MNIST's training set for seed 0, epochs 0 and 1 (dyngrad-train's defaults);
# sizes around seed_seq's and the shuffle's edge cases; seeds and epochs that use the high 32 bits.
CASES = [(60000, 0, 0), (60000, 0, 1), (0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 5, 0), (10, 0, 0), (10, 0, 1),
         (1000, 1, 3), (4097, 123456789, 9), (37, 2**33 + 5, 2**32 + 7), (64, 2**64 - 1, 0)]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    args = [str(v) for case in CASES for v in case]
    lines = subprocess.run([sys.argv[1], *args], check=True, capture_output=True, text=True).stdout.splitlines()
    if len(lines) != len(CASES):
        sys.exit(f"epoch_order_dump printed {len(lines)} lines for {len(CASES)} cases")
    failures = 0
    for (n, seed, epoch), line in zip(CASES, lines):
        head, _, body = line.partition(":")
        cpp = [int(v) for v in body.split()]
        python = epoch_permutation(n, seed, epoch)
        if head != f"{n} {seed} {epoch}" or cpp != python:
            first = next((i for i, (a, b) in enumerate(zip(cpp, python)) if a != b), min(len(cpp), len(python)))
            print(f"MISMATCH n={n} seed={seed} epoch={epoch} at position {first}: "
                  f"C++ {cpp[first:first + 5]} vs Python {python[first:first + 5]}")
            failures += 1
        elif n == 60000:
            print(f"seed {seed} epoch {epoch}, first 20 of {n}: {python[:20]} (C++ and Python equal)")
    print(f"{len(CASES) - failures} of {len(CASES)} permutations equal")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
