"""A Fashion-MNIST CNN written as a PyTorch user writes it (issue 29, item 3).

This is the PyTorch program; `python port.py fashion_mnist_cnn` runs it on dyngrad with only its import lines
rewritten (docs/python.md, "Ported PyTorch scripts"; python/tests/test_ported_scripts.py checks the rewrite and
runs both). Data: the IDX files of /usr/share/datasets/fashion-mnist, read with NumPy.

    python fashion_mnist_cnn_torch.py --quick      # 4,000 training and 1,000 test images, one epoch (CPU)
    python fashion_mnist_cnn_torch.py --epochs 5   # the whole data set
    python port.py fashion_mnist_cnn --quick       # the same on dyngrad
"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # of the training pixels


def read_idx(path):
    """An IDX file (gzip): magic (2 zero bytes, type, rank), the sizes big-endian, then uint8 data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(shape)


def load_split(data_dir, split, limit):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))[:limit]
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))[:limit]
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 255.0
    x = (x - MEAN) / STD
    y = torch.tensor(labels, dtype=torch.int64)
    return TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


def train_epoch(model, loader, criterion, optimizer):
    model.train()
    total_loss, correct, seen, first_loss = 0.0, 0, 0, None
    for images, labels in loader:
        optimizer.zero_grad()
        logits = model(images)
        loss = criterion(logits, labels)
        loss.backward()
        optimizer.step()
        # The usual train-accuracy line, after backward: logits stay readable.
        correct += (logits.argmax(dim=1) == labels).sum().item()
        total_loss += loss.item() * labels.size(0)
        seen += labels.size(0)
        if first_loss is None:
            first_loss = loss.item()
    return first_loss, total_loss / seen, correct / seen


def evaluate(model, loader):
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            seen += labels.size(0)
    return correct / seen


def main(argv=None):
    parser = argparse.ArgumentParser(description="Fashion-MNIST CNN")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--limit", type=int, default=None, help="the first N images of each split")
    parser.add_argument("--quick", action="store_true", help="4,000/1,000 images, one epoch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=DATA_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.limit = 1, 4000

    torch.manual_seed(args.seed)
    train_set = load_split(args.data, "train", args.limit)
    test_set = load_split(args.data, "t10k", args.limit // 4 if args.limit else None)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=256)

    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    results = {"first_loss": None}
    for epoch in range(1, args.epochs + 1):
        first_loss, train_loss, train_acc = train_epoch(model, train_loader, criterion, optimizer)
        test_acc = evaluate(model, test_loader)
        if results["first_loss"] is None:
            results["first_loss"] = first_loss
        results.update(train_loss=train_loss, train_acc=train_acc, test_acc=test_acc)
        print(f"epoch {epoch}: train loss {train_loss:.4f}, train accuracy {train_acc:.4f}, "
              f"test accuracy {test_acc:.4f}")
    return results


if __name__ == "__main__":
    main()
