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
