"""The training script runs a short CPU epoch (the full 10-epoch LeNet run is scripts/gpu-python.sh's)."""
import os
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
