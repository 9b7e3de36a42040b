"""Trains SimpleCNN or LeNet (samples/models.cpp, dyngrad.models) on Fashion-MNIST from Python.

    python python/examples/train_fashion_mnist.py --model lenet --epochs 10 --device cuda
    python python/examples/train_fashion_mnist.py --model simplecnn --epochs 1 --limit 2000   # a short CPU run

Data: the IDX files of Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), normalised by
the training pixels' mean and deviation. The recipe is dyngrad-train's (samples/train.cpp), option for
option, so both reach the same accuracy: Adam (lr 1e-3, no weight decay; 0.01 for adamw, lr 0.01 and
momentum 0.9 for sgd), batch 64, a cosine schedule over the epochs stepped once per epoch, PyTorch's
initialisation from the seed's generator (dg.models: the same layers in the same order as
samples/models.cpp), shuffling by the seed, no augmentation, --limit N keeping the first N images of
each split. The recipe is printed at the start. Prints a progress bar, the loss and the test accuracy per
epoch, and writes a checkpoint (model, optimizer, schedule) after each epoch that --resume continues from.
"""
import argparse
import os
import sys
import time

import numpy as np

import dyngrad as dg
import dyngrad.functional as F


def progress(epoch, epochs, done, total, loss, started, width=30):
    filled = int(width * done / max(total, 1))
    rate = done / max(time.perf_counter() - started, 1e-9)
    bar = "#" * filled + "." * (width - filled)
    tty = sys.stdout.isatty()
    end = "\n" if done == total or not tty else ""
    sys.stdout.write(f"{chr(13) if tty else ''}epoch {epoch}/{epochs} [{bar}] {done}/{total} loss {loss:.4f} {rate:.0f} batch/s{end}")
    sys.stdout.flush()


def evaluate(model, loader):
    model.eval()
    correct = seen = 0
    loader.start_epoch(0)
    with dg.no_grad():
        while (batch := loader.next()) is not None:
            images, labels = batch
            predicted = F.argmax(model(images), 1).cpu().numpy()
            correct += int((predicted == labels.cpu().numpy()).sum())
            seen += labels.shape[0]
    model.train()
    return correct / max(seen, 1)


def make_optimizer(args, parameters):
    """dyngrad-train's make_optimizer: the same defaults per optimizer."""
    if args.optimizer == "sgd":
        args.lr = 0.01 if args.lr is None else args.lr
        args.weight_decay = args.weight_decay or 0.0
        return dg.optim.SGD(parameters, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    args.lr = 1e-3 if args.lr is None else args.lr
    if args.optimizer == "adamw":
        args.weight_decay = 0.01 if args.weight_decay is None else args.weight_decay
        return dg.optim.AdamW(parameters, lr=args.lr, weight_decay=args.weight_decay)
    args.weight_decay = args.weight_decay or 0.0
    return dg.optim.Adam(parameters, lr=args.lr, weight_decay=args.weight_decay)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["simplecnn", "lenet", "lenet5", "mlp"], default="lenet")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--device", default="cuda" if dg.cuda_is_available() else "cpu")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N images of each split")
    parser.add_argument("--batch-size", "--batch", type=int, default=64)
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    parser.add_argument("--lr", type=float, default=None, help="default 1e-3 for adam/adamw, 0.01 for sgd")
    parser.add_argument("--momentum", type=float, default=0.9, help="sgd momentum")
    parser.add_argument("--weight-decay", type=float, default=None,
                        help="L2 for sgd/adam, decoupled for adamw (default 0; 0.01 for adamw)")
    parser.add_argument("--schedule", choices=["none", "cosine"], default="cosine",
                        help="learning rate per epoch (cosine annealing over --epochs, as dyngrad-train)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=dg.data.DEFAULT_MNIST_DIRECTORY)
    parser.add_argument("--checkpoint", default="fashion_mnist_checkpoint.safetensors")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--min-accuracy", type=float, default=0.0, help="exit 1 below this final test accuracy")
    args = parser.parse_args(argv)

    dg.manual_seed(args.seed)
    data = dg.load_mnist(args.data)
    train_x, train_y = data["train_images"], data["train_labels"]
    test_x, test_y = data["test_images"], data["test_labels"]
    if args.limit:
        train_x, train_y = train_x[: args.limit], train_y[: args.limit]
        test_x, test_y = test_x[: args.limit], test_y[: args.limit]
    on_gpu = args.device.startswith("cuda")
    train_loader = dg.BatchLoader(train_x, train_y, batch_size=args.batch_size, shuffle=True, seed=args.seed,
                                  device=args.device, resident=on_gpu)
    test_loader = dg.BatchLoader(test_x, test_y, batch_size=1000, shuffle=False, device=args.device, resident=on_gpu)

    height, width = train_x.shape[2], train_x.shape[3]
    model = dg.models.make_model(args.model, height, width).to(args.device)
    optimizer = make_optimizer(args, model.parameters())
    scheduler = dg.optim.CosineAnnealingLR(optimizer, args.epochs) if args.schedule == "cosine" and args.epochs else None
    print(f"recipe (dyngrad-train's): {args.optimizer} lr {optimizer.lr:g}, weight decay {args.weight_decay:g}"
          f"{f', momentum {args.momentum:g}' if args.optimizer == 'sgd' else ''}, {args.schedule} schedule over "
          f"{args.epochs} epochs, batch {args.batch_size}, seed {args.seed}, torch init, "
          f"inputs normalised by mean {data['mean']:.4f} std {data['std']:.4f}, no augmentation")
    first_epoch = 0
    if args.resume and os.path.exists(args.checkpoint):
        dg.load_checkpoint(args.checkpoint, model, optimizer, scheduler)
        first_epoch = optimizer.step_count(0) // max(len(train_loader), 1)
        print(f"resumed from {args.checkpoint} at epoch {first_epoch}")
    print(f"{args.model} on {args.device}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{train_x.shape[0]} training images, {len(train_loader)} batches of {args.batch_size}")

    accuracy = 0.0
    for epoch in range(first_epoch, args.epochs):
        train_loader.start_epoch(epoch)
        started = time.perf_counter()
        total = len(train_loader)
        shown_every = max(total // (50 if sys.stdout.isatty() else 5), 1)
        loss_value, done = float("nan"), 0
        while (batch := train_loader.next()) is not None:
            images, labels = batch
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done % shown_every == 0 or done == total:
                loss_value = loss.item()  # a host sync on a GPU: only when the bar moves
                progress(epoch + 1, args.epochs, done, total, loss_value, started)
        seconds = time.perf_counter() - started
        lr = optimizer.lr
        if scheduler is not None:
            scheduler.step()
        accuracy = evaluate(model, test_loader)
        print(f"epoch {epoch + 1}: loss {loss_value:.4f}, test accuracy {accuracy:.4f}, lr {lr:.3g}, {seconds:.1f} s")
        dg.save_checkpoint(args.checkpoint, model, optimizer, scheduler)
    print(f"final test accuracy {accuracy:.4f} ({args.model}, {args.epochs} epochs, {args.device}); "
          f"checkpoint {args.checkpoint}")
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
