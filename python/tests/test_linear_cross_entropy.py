"""linear_cross_entropy from Python (ops/linear_cross_entropy.h): dg.ops comes from the op table, F wraps it with
PyTorch's (*, E) shapes; both against cross_entropy(linear(x, weight[:classes])) with garbage in the padded rows."""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F


def _problem(rng, n=7, e=5, classes=6, padding=3):
    weight = rng.standard_normal((classes + padding, e))
    weight[classes:] *= 60.0  # would take every probability were the padded rows classes
    labels = rng.integers(0, classes, size=n)
    labels[1::3] = -100
    return rng.standard_normal((n, e)), weight, labels


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_the_unfused_ops(rng, reduction):
    x_np, w_np, y_np = _problem(rng)
    grads = []
    for fused in (True, False):
        x = dg.tensor(x_np, requires_grad=True)
        w = dg.tensor(w_np, requires_grad=True)
        y = dg.tensor(y_np)
        if fused:
            loss = F.linear_cross_entropy(x, w, y, reduction=reduction, label_smoothing=0.1, classes=6)
        else:
            loss = F.cross_entropy(F.linear(x, F.narrow(w, 0, 0, 6)), y, reduction=reduction, label_smoothing=0.1)
        (loss.sum() if reduction == "none" else loss).backward()
        grads.append((loss.numpy(), x.grad.numpy(), w.grad.numpy()))
    for ours, reference in zip(grads[0], grads[1]):
        np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-13)
    assert not grads[0][2][6:].any()  # the padded rows get no gradient


def test_ops_row_and_leading_axes(rng):
    x_np, w_np, y_np = _problem(rng, n=6)
    x, w, y = dg.tensor(x_np), dg.tensor(w_np), dg.tensor(y_np)
    # dg.ops: the row itself; length not given is every row of the weight
    every_row = dg.ops.linear_cross_entropy(x, w, y)
    np.testing.assert_allclose(every_row.item(), F.cross_entropy(F.linear(x, w), y).item(), rtol=1e-12)
    per_row = F.linear_cross_entropy(x.reshape(2, 3, 5), w, y.reshape(2, 3), reduction="none", classes=6)
    assert tuple(per_row.shape) == (2, 3)
    with pytest.raises(dg.IndexError, match="linear_cross_entropy"):
        dg.ops.linear_cross_entropy(x, w, dg.tensor(np.full(6, 7)), length=6)
    with pytest.raises(dg.ShapeError, match="linear_cross_entropy"):
        F.linear_cross_entropy(x, w, dg.tensor(y_np[:4]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_inputs_give_a_float32_loss(rng, dtype):
    """bf16/f16 x and weight: a float32 loss (as F.cross_entropy's under PyTorch's autocast) and gradients in the
    inputs' dtype, outside autocast and, from float32 leaves, under dg.autocast (whose casts take them back to f32)."""
    low = getattr(dg, dtype)
    x_np, w_np, y_np = _problem(rng)
    x32 = dg.tensor(x_np.astype(np.float32), requires_grad=True)
    w32 = dg.tensor(w_np.astype(np.float32), requires_grad=True)
    y = dg.tensor(y_np)
    x = x32.detach().to(low).requires_grad_()
    w = w32.detach().to(low).requires_grad_()
    loss = F.linear_cross_entropy(x, w, y, label_smoothing=0.1, classes=6)
    assert loss.dtype == dg.float32
    loss.backward()
    assert x.grad.dtype == low and w.grad.dtype == low
    reference = F.linear_cross_entropy(x32, w32, y, label_smoothing=0.1, classes=6)
    reference.backward()
    tolerance = 3e-2 if dtype == "bfloat16" else 4e-3
    np.testing.assert_allclose(loss.item(), reference.item(), rtol=tolerance)
    np.testing.assert_allclose(w.grad.float().numpy(), w32.grad.numpy(), atol=tolerance)
    with dg.autocast("cpu", dtype=low):
        under_autocast = F.linear_cross_entropy(x32, w32, y, label_smoothing=0.1, classes=6)
    assert under_autocast.dtype == dg.float32
    assert under_autocast.item() == loss.item()  # the same rounded inputs, the same f32 computation
