"""The sample models of samples/models.cpp, re-expressed over dyngrad.nn with the same layers, the same
parameter names ("0.weight", "3.bias", ...: a fused ReLU keeps the index its separate layer would take, as
the C++ Sequential's skip_index() does) and the same initialisation, so checkpoints are interchangeable
with dyngrad-train's and with a torch.nn.Sequential twin (dyngrad.parity.torch_twin)."""
from __future__ import annotations

from collections import OrderedDict

from . import nn

CLASSES = 10
__all__ = ["make_model", "SimpleCNN", "LeNet", "LeNet5", "MLP", "MODELS"]


def _after_two_convs(size: int) -> int:
    return ((size - 4) // 2 - 4) // 2


def SimpleCNN(height=28, width=28):
    return nn.Sequential(OrderedDict([
        ("0", nn.Conv2d(1, 16, 3, padding=1, activation="relu")),
        ("2", nn.MaxPool2d(2)), ("3", nn.Flatten()),
        ("4", nn.Linear(16 * (height // 2) * (width // 2), CLASSES)),
    ]))


def LeNet(height=28, width=28):
    h2, w2 = _after_two_convs(height), _after_two_convs(width)
    return nn.Sequential(OrderedDict([
        ("0", nn.Conv2d(1, 20, 5)), ("1", nn.MaxPool2d(2)),
        ("2", nn.Conv2d(20, 50, 5)), ("3", nn.MaxPool2d(2)), ("4", nn.Flatten()),
        ("5", nn.Linear(50 * h2 * w2, 500, activation="relu")),
        ("7", nn.Linear(500, CLASSES)),
    ]))


def LeNet5(height=28, width=28):
    h2, w2 = _after_two_convs(height), _after_two_convs(width)
    return nn.Sequential(OrderedDict([
        ("0", nn.Conv2d(1, 6, 5, activation="relu")), ("2", nn.MaxPool2d(2)),
        ("3", nn.Conv2d(6, 16, 5, activation="relu")), ("5", nn.MaxPool2d(2)), ("6", nn.Flatten()),
        ("7", nn.Linear(16 * h2 * w2, 120, activation="relu")),
        ("9", nn.Linear(120, CLASSES)),
    ]))


def MLP(widths=(784, 500, CLASSES), flatten=True):
    """make_mlp / the "mlp" model: Linear+ReLU pairs, the last Linear plain."""
    layers = OrderedDict()
    index = 0
    if flatten:
        layers["0"] = nn.Flatten()
        index = 1
    for i in range(len(widths) - 1):
        last = i + 2 == len(widths)
        layers[str(index)] = nn.Linear(widths[i], widths[i + 1], activation=None if last else "relu")
        index += 1 if last else 2
    return nn.Sequential(layers)


MODELS = {"simplecnn": SimpleCNN, "lenet": LeNet, "lenet5": LeNet5, "mlp": MLP}


def make_model(name: str, height=28, width=28):
    if name not in MODELS:
        raise ValueError(f"make_model: unknown model '{name}' ({', '.join(MODELS)})")
    if name == "mlp":
        return MLP((height * width, 500, CLASSES))
    return MODELS[name](height, width)
