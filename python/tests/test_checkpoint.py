"""dyngrad.utils.checkpoint.checkpoint (graph/checkpoint.h): gradients equal to the plain call, bit for bit on the
CPU (dropout and autocast included), second order through a segment, the GPT's per-block option, typed errors; and
the Python PINN and WGAN-GP examples (python/examples/pinn_poisson.py, wgan_gp.py) run small, on the CPU and, where
dyngrad has a CUDA device, with --device cuda."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dyngrad as dg
from dyngrad.utils.checkpoint import checkpoint

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Block(dg.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2, self.drop = dg.nn.Linear(width, 2 * width), dg.nn.Linear(2 * width, width), dg.nn.Dropout(0.3)

    def forward(self, x):
        return self.fc2(self.drop(self.fc1(x).tanh()))


def _gradients(use_checkpoint, x_value, w_value, autocast=False):
    dg.manual_seed(5)
    blocks = [Block(6), Block(6)]
    x = dg.tensor(x_value, dtype=dg.float32, requires_grad=True)
    with dg.autocast("cpu", dtype=dg.bfloat16, enabled=autocast):
        h = x
        for block in blocks:
            h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
    (h.float() * dg.tensor(w_value, dtype=dg.float32)).sum().backward()
    return [x.grad.numpy()] + [p.grad.numpy() for b in blocks for p in b.parameters()]


@pytest.mark.parametrize("autocast", [False, True])
def test_checkpointed_gradients_equal_the_plain_ones_bit_for_bit(rng, autocast):
    x_value, w_value = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    plain = _gradients(False, x_value, w_value, autocast)
    checkpointed = _gradients(True, x_value, w_value, autocast)
    assert len(plain) == len(checkpointed) == 9
    for a, b in zip(plain, checkpointed):
        np.testing.assert_array_equal(a, b)


def test_second_order_through_a_checkpointed_segment(rng):
    a, v = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def hvp(use_checkpoint):
        dg.manual_seed(2)
        layer = dg.nn.Linear(4, 4)
        x = dg.tensor(a, dtype=dg.float32, requires_grad=True)
        y = checkpoint(lambda t: layer(t).tanh(), x) if use_checkpoint else layer(x).tanh()
        (gx,) = dg.autograd.grad((y * y).sum(), x, create_graph=True)
        (hx,) = dg.autograd.grad((gx * dg.tensor(v, dtype=dg.float32)).sum(), x)
        return gx.numpy(), hx.numpy()

    (g_plain, h_plain), (g_checkpointed, h_checkpointed) = hvp(False), hvp(True)
    np.testing.assert_array_equal(g_plain, g_checkpointed)  # first order: bitwise
    # Second order: the output marker sums the contributions that reach the segment's output before they meet the
    # segment's own, so float32 sums may group differently (an ulp or so).
    np.testing.assert_allclose(h_plain, h_checkpointed, rtol=1e-5, atol=1e-6)
    assert np.abs(h_plain).max() > 1e-3  # the second derivative is not trivially zero


def test_gpt_with_every_block_checkpointed_matches_the_plain_gpt(rng):
    tokens = dg.tensor(rng.integers(0, 11, size=(2, 7)), dtype=dg.int64)
    weights = rng.standard_normal((2, 7, 11))

    def run(use_checkpoint):
        dg.manual_seed(3)
        model = dg.nn.GPT(11, context=8, layers=2, heads=2, width=16, dropout=0.1, checkpoint=use_checkpoint)
        model.train()
        (model(tokens) * dg.tensor(weights, dtype=dg.float32)).sum().backward()
        return [p.grad.numpy() for p in model.parameters()]

    for plain, checkpointed in zip(run(False), run(True)):
        np.testing.assert_array_equal(plain, checkpointed)


def test_checkpoint_passes_other_arguments_and_returns_tuples(rng):
    x = dg.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    a, b = checkpoint(lambda t, scale, shift=0.0: (t * scale, t + shift), x, 3.0, shift=1.0)
    (a.sum() + b.sum()).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 4.0))


def test_bad_calls_raise_typed_errors(rng):
    x = dg.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    c = dg.tensor(rng.standard_normal((2, 3)))
    with pytest.raises(TypeError, match="must return a Tensor"):
        checkpoint(lambda t: 3.0, x)
    with pytest.raises(dg.GraphError, match="no output of the segment requires grad"):
        checkpoint(lambda t: t.tanh(), c)
    with pytest.raises(dg.GraphError, match="no Tensor argument"):
        checkpoint(lambda: x * 2)
    with pytest.raises(TypeError, match="callable"):
        checkpoint(None, x)
    with pytest.raises(NotImplementedError):
        checkpoint(lambda t: t, x, context_fn=lambda: None)
    # An input that requires no grad next to one that does: it gets none, the other one does.
    y = checkpoint(lambda t, u: t * u, x, c)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), c.numpy())
    assert c.grad is None
    with dg.no_grad():  # nothing recorded: the function just runs
        assert not checkpoint(lambda t: t * 2, x).requires_grad


def _pinn_error(steps, device="cpu"):
    result = subprocess.run([sys.executable, str(EXAMPLES / "pinn_poisson.py"), "--steps", str(steps),
                             "--tolerance", "1e9", "--device", device], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return float(re.search(r"max \|u - sin\(pi x\)\| on 101 points: (\S+)", result.stdout).group(1))


def test_pinn_example_learns_the_exact_solution_on_the_cpu():
    untrained, trained = _pinn_error(1), _pinn_error(400)
    assert trained < 0.1 * untrained, (untrained, trained)


def test_pinn_example_learns_the_exact_solution_on_the_gpu(cuda):
    untrained, trained = _pinn_error(1, "cuda"), _pinn_error(400, "cuda")
    assert trained < 0.1 * untrained, (untrained, trained)


def test_pinn_example_without_a_cuda_device_is_a_device_error():
    """--device cuda where dyngrad has no CUDA device (no device, or a build without the backend): dyngrad's
    DeviceError printed by the example, exit 1, no traceback."""
    if dg.cuda.is_available():
        pytest.skip("this machine has a CUDA device: --device cuda runs")
    result = subprocess.run([sys.executable, str(EXAMPLES / "pinn_poisson.py"), "--steps", "1", "--device", "cuda"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("pinn_poisson: ") and "cuda" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def _check_wgan_gp_penalty(device):
    if not Path(dg.data.DEFAULT_MNIST_DIRECTORY, "train-labels-idx1-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST is not installed (apt install dataset-fashion-mnist)")
    result = subprocess.run([sys.executable, str(EXAMPLES / "wgan_gp.py"), "--steps", "40", "--check-penalty",
                             "--device", device], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"images on {device}," in result.stdout
    assert "the penalty kept the critic's gradient norm closer to 1" in result.stdout


def test_wgan_gp_example_penalty_pulls_the_critic_norm_toward_one():
    _check_wgan_gp_penalty("cpu")


def test_wgan_gp_example_penalty_pulls_the_critic_norm_toward_one_on_the_gpu(cuda):
    _check_wgan_gp_penalty("cuda")
