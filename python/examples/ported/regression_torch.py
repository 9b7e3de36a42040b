"""A regression with a custom Dataset, written as a PyTorch user writes it (issue 29, item 3).

This is the PyTorch program; `python port.py regression` runs it on dyngrad with only its import lines rewritten
(docs/python.md, "Ported PyTorch scripts"; python/tests/test_ported_scripts.py checks the rewrite and runs both).
A Dataset subclass (__len__/__getitem__) over NumPy data drawn from --seed, a DataLoader, an MLP, MSELoss, Adam
with StepLR, and a checkpoint: the state_dict saved, loaded into a fresh model, which must predict the same.

    python regression_torch.py --quick             # a few epochs on 2,000 samples (CPU)
    python port.py regression --quick              # the same on dyngrad
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class NoisyFunction(Dataset):
    """y = sin(2 x0) + 0.5 x1² − 0.3 x2 plus Gaussian noise, for x uniform in [−1.5, 1.5]³."""

    def __init__(self, n, seed, noise=0.05):
        rng = np.random.default_rng(seed)
        self.features = rng.uniform(-1.5, 1.5, size=(n, 3)).astype(np.float32)
        x0, x1, x2 = self.features.T
        target = np.sin(2 * x0) + 0.5 * x1 ** 2 - 0.3 * x2 + noise * rng.standard_normal(n)
        self.targets = target.astype(np.float32).reshape(n, 1)

    def __len__(self):
        return len(self.features)

    def __getitem__(self, index):
        return torch.from_numpy(self.features[index]), torch.from_numpy(self.targets[index])


def make_model():
    return nn.Sequential(nn.Linear(3, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def evaluate(model, loader, criterion):
    model.eval()
    total, seen = 0.0, 0
    with torch.no_grad():
        for features, targets in loader:
            total += criterion(model(features), targets).item() * len(features)
            seen += len(features)
    return total / seen


def main(argv=None):
    parser = argparse.ArgumentParser(description="regression with a custom Dataset")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--step-size", type=int, default=10, help="StepLR: halve the rate every N epochs")
    parser.add_argument("--quick", action="store_true", help="2,000 samples, 6 epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, help="where to save the state_dict (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.epochs, args.step_size = 2000, 6, 2

    torch.manual_seed(args.seed)
    train_set = NoisyFunction(args.samples, seed=args.seed)
    val_set = NoisyFunction(args.samples // 4, seed=args.seed + 1)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=256)

    model = make_model()
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.step_size, gamma=0.5)

    initial_val = evaluate(model, val_loader, criterion)
    print(f"before training: val MSE {initial_val:.4f}")
    for epoch in range(1, args.epochs + 1):
        model.train()
        total, seen = 0.0, 0
        for features, targets in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(features), targets)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(features)
            seen += len(features)
        scheduler.step()
        val = evaluate(model, val_loader, criterion)
        print(f"epoch {epoch}: train MSE {total / seen:.4f}, val MSE {val:.4f}, lr {scheduler.get_last_lr()[0]:.2e}")

    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or os.path.join(tmp, "regression.pt")
        torch.save(model.state_dict(), path)
        restored = make_model()
        restored.load_state_dict(torch.load(path))
    restored_val = evaluate(restored, val_loader, criterion)
    probe = torch.from_numpy(val_set.features[:8])
    with torch.no_grad():
        max_difference = (model(probe) - restored(probe)).abs().max().item()
    print(f"restored from the checkpoint: val MSE {restored_val:.4f}, largest prediction difference {max_difference}")
    return {"initial_val": initial_val, "val": val, "restored_val": restored_val, "max_difference": max_difference,
            "last_lr": scheduler.get_last_lr()[0]}


if __name__ == "__main__":
    main()
