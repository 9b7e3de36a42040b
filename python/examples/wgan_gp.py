"""A WGAN-GP critic on Fashion-MNIST, the Python twin of samples/wgan_gp.cpp (Gulrajani et al. 2017).

A generator and a critic are trained with the Wasserstein loss plus the gradient penalty
lambda * E[(|grad_x D(x_hat)| - 1)^2] at random interpolates x_hat of real and generated images. The penalty's
gradient with respect to the critic's weights is a second-order gradient: grad_x D comes from
dg.autograd.grad(..., create_graph=True) and the critic's loss is back-propagated through it.

Prints, per generator step, the critic's Wasserstein estimate and the mean deviation |norm - 1| of the critic's
input-gradient norm. --check-penalty also trains the same models from the same initialisation and batches with
lambda = 0 and exits 1 unless the penalty kept the norm closer to 1.

--device cuda trains the same float32 models on the GPU: the weights and the training images live there; the batches'
positions, the noise and the interpolation weights are drawn by NumPy (the same draws as a CPU run) and copied over.
Without a usable CUDA device it prints dyngrad's DeviceError and exits 1.

    python wgan_gp.py [--device cpu|cuda] [--data DIR] [--steps N] [--critic-iters K] [--batch B] [--lambda L]
                      [--lr LR] [--seed S] [--check-penalty]
"""
import argparse
import sys

import numpy as np

import dyngrad as dg

PIXELS, NOISE = 28 * 28, 32


class Critic(dg.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = dg.nn.Linear(PIXELS, 128), dg.nn.Linear(128, 1)

    def forward(self, x):  # (B,784) -> (B,1)
        return self.fc2(dg.nn.functional.leaky_relu(self.fc1(x), 0.2))


class Generator(dg.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = dg.nn.Linear(NOISE, 128), dg.nn.Linear(128, PIXELS)

    def forward(self, z):  # (B,32) -> (B,784) in (-1, 1)
        return self.fc2(self.fc1(z).relu()).tanh()


def train(args, lam, real_images, verbose):
    """Trains with penalty weight `lam` on args.device, where `real_images` (a dyngrad tensor) are; returns the mean
    |norm - 1| over the first and the last fifth of the critic steps."""
    dg.manual_seed(args.seed)
    critic, generator = Critic().to(args.device), Generator().to(args.device)  # before the optimizers
    critic_optimizer = dg.optim.Adam(critic.parameters(), lr=args.lr, betas=(0.5, 0.9))
    generator_optimizer = dg.optim.Adam(generator.parameters(), lr=args.lr, betas=(0.5, 0.9))
    draws = np.random.default_rng(args.seed + 1)  # batches, noise, interpolation weights: the same for every lambda
    n, batch = real_images.shape[0], args.batch
    deviations = []

    def noise():
        return dg.tensor(draws.standard_normal((batch, NOISE)), dtype=dg.float32, device=args.device)

    for step in range(args.steps):
        for _ in range(args.critic_iters):
            start = int(draws.integers(0, n - batch))
            real = real_images[start:start + batch]
            with dg.no_grad():  # the critic's step does not train the generator
                fake = generator(noise())
            eps = dg.tensor(draws.uniform(size=(batch, 1)), dtype=dg.float32, device=args.device)
            mixed = (eps * real + (1 - eps) * fake).detach().requires_grad_()
            (gradient,) = dg.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
            norm = ((gradient * gradient).sum(1) + 1e-12).sqrt()
            penalty = ((norm - 1) * (norm - 1)).mean()
            wasserstein = critic(real).mean() - critic(fake).mean()
            loss = lam * penalty - wasserstein
            critic_optimizer.zero_grad()
            loss.backward()
            critic_optimizer.step()
            deviations.append(float(np.abs(norm.cpu().numpy() - 1).mean()))
        generator_loss = -critic(generator(noise())).mean()
        generator_optimizer.zero_grad()
        critic_optimizer.zero_grad()
        generator_loss.backward()
        generator_optimizer.step()
        if verbose and (step % 20 == 0 or step + 1 == args.steps):
            print(f"step {step:4d}  wasserstein {wasserstein.item():.4f}  |grad norm - 1| {deviations[-1]:.4f}")
    window = max(1, len(deviations) // 5)
    return float(np.mean(deviations[:window])), float(np.mean(deviations[-window:]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--data", default=dg.data.DEFAULT_MNIST_DIRECTORY)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--critic-iters", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lambda", dest="lam", type=float, default=10.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-penalty", action="store_true")
    args = parser.parse_args(argv)

    data = dg.load_mnist(args.data)
    images = data["train_images"].numpy().reshape(-1, PIXELS)
    pixels = (images * (2 * data["std"]) + (2 * data["mean"] - 1)).astype(np.float32)  # pixels in [-1, 1]
    try:
        real_images = dg.tensor(pixels, device=args.device)
    except dg.DeviceError as e:  # --device cuda without a CUDA device, or a build without the CUDA backend
        print(f"wgan_gp: {e}", file=sys.stderr)
        return 1
    print(f"wgan_gp: {real_images.shape[0]} images on {args.device}, lambda {args.lam:g}, {args.steps} generator "
          f"steps x {args.critic_iters} critic steps, batch {args.batch}")
    first, last = train(args, args.lam, real_images, True)
    print(f"mean |grad norm - 1|: first fifth of critic steps {first:.4f}, last fifth {last:.4f}")
    if not args.check_penalty:
        return 0
    first_free, last_free = train(args, 0.0, real_images, False)
    print(f"without the penalty (lambda 0): first fifth {first_free:.4f}, last fifth {last_free:.4f}")
    used = last < last_free
    print("the penalty kept the critic's gradient norm closer to 1" if used
          else "FAILED: the penalty did not pull the critic's gradient norm toward 1")
    return 0 if used else 1


if __name__ == "__main__":
    sys.exit(main())
