"""A physics-informed network (PINN) for the 1-D Poisson problem, the Python twin of samples/pinn_poisson.cpp:

    u''(x) = f(x) = -pi^2 sin(pi x)  on (0, 1),   u(0) = u(1) = 0,   exact solution u(x) = sin(pi x)

The network u(x) (1 -> 32 -> 32 -> 1, tanh) is trained so that its second derivative matches f at collocation
points: u' and u'' come from dg.autograd.grad(..., create_graph=True), and the loss on the residual u'' - f is
back-propagated through them into the weights. Prints the loss and the maximum error against sin(pi x) on a test
grid; exits 1 when that error is above --tolerance. --device cuda trains the same float32 network on the GPU (the
weights, the collocation points and f there); without a usable CUDA device it prints dyngrad's DeviceError and
exits 1.

    python pinn_poisson.py [--device cpu|cuda] [--steps N] [--points N] [--lr LR] [--tolerance E] [--seed S]
"""
import argparse
import math
import sys

import numpy as np

import dyngrad as dg


class Network(dg.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = dg.nn.Linear(1, 32), dg.nn.Linear(32, 32), dg.nn.Linear(32, 1)

    def forward(self, x):  # x (N,1) -> u (N,1)
        return self.fc3(self.fc2(self.fc1(x).tanh()).tanh())


def grid(n, lo, hi):
    """n evenly spaced points of [lo, hi] as a column (n,1), in NumPy."""
    return np.linspace(lo, hi, n).reshape(n, 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--points", type=int, default=48)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--tolerance", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    try:
        return train(args)
    except dg.DeviceError as e:  # --device cuda without a CUDA device, or a build without the CUDA backend
        print(f"pinn_poisson: {e}", file=sys.stderr)
        return 1


def train(args):
    def on_device(array):  # float32, as the C++ sample
        return dg.tensor(array, dtype=dg.float32, device=args.device)

    dg.manual_seed(args.seed)
    u = Network().to(args.device)  # before the optimizer, which holds the parameters
    optimizer = dg.optim.Adam(u.parameters(), lr=args.lr)
    # f from the float32 points, as before the option existed
    x_points = grid(args.points, 0.02, 0.98).astype(np.float32)
    x_inner = on_device(x_points)
    f_inner = on_device(-math.pi ** 2 * np.sin(math.pi * x_points))
    x_boundary = on_device(grid(2, 0.0, 1.0))

    for step in range(args.steps):
        x = x_inner.clone().requires_grad_()
        u_x = u(x)
        # Each u(x_i) depends on x_i alone: the gradient of sum(u) is the pointwise u'(x), that of sum(u') is u''.
        (du,) = dg.autograd.grad(u_x.sum(), x, create_graph=True)
        (d2u,) = dg.autograd.grad(du.sum(), x, create_graph=True)
        residual = d2u - f_inner
        boundary = u(x_boundary)
        loss = (residual * residual).mean() + 100.0 * (boundary * boundary).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 250 == 0 or step + 1 == args.steps:
            print(f"step {step:5d}  loss {loss.item():.6g}")

    # The error against the exact solution on a finer grid, boundaries included.
    x_test = grid(101, 0.0, 1.0).astype(np.float32)
    with dg.no_grad():
        predicted = u(on_device(x_test)).cpu().numpy()
    worst = float(np.max(np.abs(predicted - np.sin(math.pi * x_test))))
    print(f"max |u - sin(pi x)| on 101 points: {worst:.4g} (tolerance {args.tolerance:.3g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
