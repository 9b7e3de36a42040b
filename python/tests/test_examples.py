"""The training script runs a short CPU epoch (the full 10-epoch LeNet run is scripts/gpu-python.sh's)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dyngrad as dg

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_train_fashion_mnist_one_short_cpu_epoch(tmp_path):
    if not os.path.exists(os.path.join(dg.data.DEFAULT_MNIST_DIRECTORY, "train-labels-idx1-ubyte.gz")):
        pytest.skip("Fashion-MNIST is not installed (apt install dataset-fashion-mnist)")
    checkpoint = tmp_path / "ck.safetensors"
    result = subprocess.run([sys.executable, str(EXAMPLES / "train_fashion_mnist.py"), "--model", "simplecnn",
                             "--epochs", "1", "--limit", "3000", "--device", "cpu", "--checkpoint", str(checkpoint),
                             "--min-accuracy", "0.6"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test accuracy" in result.stdout and checkpoint.exists()
    resumed = subprocess.run([sys.executable, str(EXAMPLES / "train_fashion_mnist.py"), "--model", "simplecnn",
                              "--epochs", "1", "--limit", "3000", "--device", "cpu", "--checkpoint", str(checkpoint),
                              "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stdout + resumed.stderr


def _dyngrad_train():
    """dyngrad-train of the CMake build the package was installed from (scripts/run-python-tests.sh exports it)."""
    path = os.environ.get("DYNGRAD_TRAIN_BIN", "")
    return path if path and os.access(path, os.X_OK) else None


def test_train_fashion_mnist_matches_dyngrad_train(tmp_path):
    """Same recipe as dyngrad-train (optimizer, cosine schedule, init, data order, limit): the same test accuracy
    after every epoch, to the printed digit, on the CPU (deterministic)."""
    if not os.path.exists(os.path.join(dg.data.DEFAULT_MNIST_DIRECTORY, "train-labels-idx1-ubyte.gz")):
        pytest.skip("Fashion-MNIST is not installed (apt install dataset-fashion-mnist)")
    train = _dyngrad_train()
    if train is None:
        pytest.skip("DYNGRAD_TRAIN_BIN does not name a dyngrad-train binary (scripts/run-python-tests.sh sets it)")
    common = ["--model", "lenet5", "--epochs", "3", "--limit", "1500", "--device", "cpu"]
    cpp = subprocess.run([train, *common], capture_output=True, text=True, timeout=600)
    assert cpp.returncode == 0, cpp.stdout + cpp.stderr
    cpp_accuracy = re.findall(r"test loss \S+ acc ([0-9.]+)%", cpp.stdout)
    py = subprocess.run([sys.executable, str(EXAMPLES / "train_fashion_mnist.py"), *common,
                         "--checkpoint", str(tmp_path / "ck.safetensors")], capture_output=True, text=True, timeout=600)
    assert py.returncode == 0, py.stdout + py.stderr
    assert "recipe (dyngrad-train's): adam lr 0.001" in py.stdout
    py_accuracy = [f"{100 * float(a):.2f}" for a in re.findall(r"test accuracy ([0-9.]+), lr", py.stdout)]
    assert len(cpp_accuracy) == 3 and py_accuracy == cpp_accuracy, (cpp.stdout, py.stdout)
