"""The seed's custom-op example from Python: L = Σ(a² + b²) as a custom op whose forward and backward are
NumPy functions, recorded and replay-verified like a built-in op, trained to 0 with SGD.

    python python/examples/custom_op.py [--steps 100]
"""
import argparse
import sys

import numpy as np

import dyngrad as dg


def sum_of_squares_forward(a, b):
    return np.sum(a * a + b * b)


def sum_of_squares_backward(grad, a, b):
    return 2.0 * a * grad, 2.0 * b * grad


sum_of_squares = dg.custom_op("sum_of_squares", 2, sum_of_squares_forward, sum_of_squares_backward,
                              infer=lambda shapes, dtypes: ())  # a scalar


def train(steps: int = 100, lr: float = 0.1, seed: int = 7) -> float:
    dg.manual_seed(seed)
    a = dg.randn(3, 4, requires_grad=True)
    b = dg.randn(3, 4, requires_grad=True)
    optimizer = dg.optim.SGD([a, b], lr=lr)
    first = None
    for step in range(steps):
        loss = sum_of_squares(a, b)
        if step == 0:
            # The first step's graph replayed in float64 on the CPU: value and gradients of every node.
            report = dg.verify(loss)
            assert report.passed, report.summary()
            first = loss.item()
        else:
            optimizer.zero_grad()
            loss.backward()
        optimizer.step()
    final = sum_of_squares(a, b).item()
    print(f"L = sum(a^2 + b^2): {first:.6f} -> {final:.3e} after {steps} SGD steps")
    return final


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    sys.exit(0 if train(args.steps) < 1e-6 else 1)
