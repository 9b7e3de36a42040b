"""PyTorch's semantics where a PyTorch user expects them (issue 29): Linear over (*, in), the class losses over
(N, C, d...), max/min with a dim as (values, indices), integer arange as int64, x.to(device, dtype),
clip_grad_norm_'s error_if_nonfinite, DataLoader's defaults, a forward's outputs usable after backward(), and
errors spelled in Python. Where PyTorch is installed, the results are compared with it too."""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F
from conftest import numeric_grad


def t64(a, requires_grad=False):
    return dg.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def test_linear_over_leading_dims_and_1d(rng):
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    y = F.linear(t64(x), t64(w), t64(b))
    assert y.shape == [2, 3, 5] or tuple(y.shape) == (2, 3, 5)
    np.testing.assert_allclose(y.numpy(), x @ w.T + b, rtol=1e-12)
    np.testing.assert_allclose(F.linear(t64(x), t64(w)).numpy(), x @ w.T, rtol=1e-12)
    v = rng.standard_normal(4)
    assert tuple(F.linear(t64(v), t64(w), t64(b)).shape) == (5,)
    np.testing.assert_allclose(F.linear(t64(v), t64(w), t64(b)).numpy(), w @ v + b, rtol=1e-12)
    layer = dg.nn.Linear(4, 5)
    assert tuple(layer(dg.tensor(x.astype(np.float32))).shape) == (2, 3, 5)
    # Gradients through the reshapes, against central differences.
    weights = rng.standard_normal((2, 3, 5))
    xt, wt, bt = t64(x, True), t64(w, True), t64(b, True)
    (F.linear(xt, wt, bt) * t64(weights)).sum().backward()
    loss = lambda xa, wa=w, ba=b: float(((xa @ wa.T + ba) * weights).sum())  # noqa: E731
    np.testing.assert_allclose(xt.grad.numpy(), numeric_grad(loss, x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(wt.grad.numpy(), numeric_grad(lambda wa: loss(x, wa), w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(bt.grad.numpy(), numeric_grad(lambda ba: loss(x, w, ba), b), rtol=1e-6, atol=1e-7)
    # A refused (*, in) call records nothing (the 2-D op's checks run before the rows' reshape), with or without bias.
    bad = t64(rng.standard_normal((2, 3, 6)), True)
    before = dg._core._graph_size()
    with pytest.raises(dg.ShapeError, match="linear"):
        F.linear(bad, t64(w), t64(b))
    with pytest.raises(dg.ShapeError, match="matmul"):
        F.linear(bad, t64(w))
    assert dg._core._graph_size() == before


def _ce_rows(logits, labels, weight=None, ignore_index=-100, smoothing=0.0):
    """PyTorch's cross_entropy per row of (M, C) in NumPy (log_softmax, weights, smoothing)."""
    z = logits - logits.max(1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(1, keepdims=True))
    c = logits.shape[1]
    w = np.ones(c) if weight is None else weight
    loss, denom = np.zeros(len(labels)), 0.0
    for i, y in enumerate(labels):
        if y == ignore_index:
            continue
        loss[i] = (1 - smoothing) * -w[y] * lp[i, y] + smoothing / c * -(w * lp[i]).sum()
        denom += w[y]
    return loss, denom


def test_class_losses_over_spatial_dims(rng):
    logits = rng.standard_normal((2, 4, 3, 2))
    labels = rng.integers(0, 4, size=(2, 3, 2))
    labels[1, 2, 0] = -100
    weight = rng.uniform(0.5, 2.0, 4)
    rows = logits.transpose(0, 2, 3, 1).reshape(-1, 4)
    per_row, denom = _ce_rows(rows, labels.reshape(-1), weight, smoothing=0.2)
    x, y, w = t64(logits), dg.tensor(labels), t64(weight)
    none = F.cross_entropy(x, y, weight=w, reduction="none", label_smoothing=0.2)
    assert tuple(none.shape) == (2, 3, 2)
    np.testing.assert_allclose(none.numpy().reshape(-1), per_row, rtol=1e-12)
    np.testing.assert_allclose(F.cross_entropy(x, y, weight=w, label_smoothing=0.2).item(), per_row.sum() / denom,
                               rtol=1e-12)
    np.testing.assert_allclose(F.cross_entropy(x, y, weight=w, reduction="sum", label_smoothing=0.2).item(),
                               per_row.sum(), rtol=1e-12)
    nll_rows, nll_denom = _ce_rows(rows, labels.reshape(-1), weight)
    np.testing.assert_allclose(F.nll_loss(F.log_softmax(x, 1), y, weight=w).item(), nll_rows.sum() / nll_denom,
                               rtol=1e-12)
    # (C) with a 0-d target
    vec = rng.standard_normal(5)
    one = F.cross_entropy(t64(vec), dg.tensor(3))
    assert tuple(one.shape) == ()
    np.testing.assert_allclose(one.item(), _ce_rows(vec[None], [3])[0][0], rtol=1e-12)
    with pytest.raises(dg.ShapeError, match=r"expected \(2, 3, 2\)"):
        F.cross_entropy(x, dg.tensor(rng.integers(0, 4, size=(2, 2, 3))))
    # the gradient through permute and reshape, against central differences
    xt = t64(logits, True)
    F.cross_entropy(xt, y, reduction="sum").backward()
    f = lambda a: float(_ce_rows(a.transpose(0, 2, 3, 1).reshape(-1, 4), labels.reshape(-1))[0].sum())  # noqa: E731
    np.testing.assert_allclose(xt.grad.numpy(), numeric_grad(f, logits), rtol=1e-6, atol=1e-7)


def test_class_losses_match_torch(rng, torch):
    logits = rng.standard_normal((2, 4, 3)).astype(np.float32)
    labels = rng.integers(0, 4, size=(2, 3))
    for reduction in ("mean", "sum", "none"):
        ours = F.cross_entropy(dg.tensor(logits), dg.tensor(labels), reduction=reduction, label_smoothing=0.1)
        theirs = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels), reduction=reduction,
                                                   label_smoothing=0.1)
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_max_min_with_dim_return_values_and_indices(rng):
    a = rng.standard_normal((3, 5))
    x = t64(a, requires_grad=True)
    vals, idx = x.max(dim=1)
    assert idx.dtype == dg.int64 and vals.dtype == dg.float64
    np.testing.assert_array_equal(idx.numpy(), a.argmax(1))
    np.testing.assert_array_equal(vals.numpy(), a.max(1))
    result = x.max(1, keepdim=True)
    assert result.values is result[0] and result.indices is result[1] and tuple(result.indices.shape) == (3, 1)
    low, where = x.min(dim=0)
    np.testing.assert_array_equal(low.numpy(), a.min(0))
    np.testing.assert_array_equal(where.numpy(), a.argmin(0))
    np.testing.assert_array_equal(F.min(x, 1).indices.numpy(), a.argmin(1))
    # without a dim: the largest (smallest) element as a 0-d tensor, as torch.max(x)
    assert tuple(x.max().shape) == () and x.max().item() == a.max()
    assert x.min().item() == a.min()
    # with a tensor: the elementwise maximum
    np.testing.assert_array_equal(F.max(x, t64(np.zeros((3, 5)))).numpy(), np.maximum(a, 0))
    vals.sum().backward()
    expected = np.zeros_like(a)
    expected[np.arange(3), a.argmax(1)] = 1
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_arange_dtypes_follow_torch():
    assert dg.arange(3).dtype == dg.int64
    np.testing.assert_array_equal(dg.arange(3).numpy(), [0, 1, 2])
    assert dg.arange(1, 7, 2).dtype == dg.int64
    assert dg.arange(np.int64(4)).dtype == dg.int64
    assert dg.arange(3.0).dtype == dg.float32
    assert dg.arange(np.float32(2.0)).dtype == dg.float32
    assert dg.arange(0, 1, 0.25).dtype == dg.float32
    assert dg.arange(3, dtype=dg.float64).dtype == dg.float64
    assert dg.arange(2.0, dtype=dg.int64).dtype == dg.int64
    # the usual positions of a sequence model
    emb = dg.nn.Embedding(10, 4)
    assert tuple(emb(dg.arange(6)).shape) == (6, 4)
    with pytest.raises(TypeError, match="end"):
        dg.arange(0, "5")


def test_to_device_and_dtype(rng):
    x = t64(rng.standard_normal((2, 3)))
    y = x.to("cpu", dg.float32)
    assert y.dtype == dg.float32 and y.device == "cpu"
    assert x.to(dtype=dg.float32).dtype == dg.float32
    assert x.to(device="cpu", dtype=dg.float32).dtype == dg.float32
    assert x.to(dg.tensor([1, 2])).dtype == dg.int64  # to(other): other's dtype and device
    assert np.shares_memory(x.to("cpu").numpy(), x.numpy())  # nothing to change: no copy
    w = t64(rng.standard_normal((2, 3)), requires_grad=True)
    z = (w * 2.0).to("cpu")  # nothing to change: the same tensor, history kept
    z.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 3), 2.0))
    assert not np.shares_memory(x.to(dg.float64, copy=True).numpy(), x.numpy())


def test_clip_grad_norm_error_if_nonfinite(rng):
    w = dg.tensor(rng.standard_normal(4).astype(np.float32), requires_grad=True)
    (w * dg.tensor(np.array([1.0, np.nan, 2.0, 3.0], dtype=np.float32))).sum().backward()
    before = w.grad.numpy().copy()
    with pytest.raises(dg.NumericalError, match="error_if_nonfinite"):
        dg.optim.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(w.grad.numpy(), before)  # untouched (NaN compares equal in assert_array_equal)
    dg.optim.clip_grad_norm_([w], 1.0)  # PyTorch's default, error_if_nonfinite=False: no error
    v = dg.tensor(rng.standard_normal(4).astype(np.float32), requires_grad=True)
    (v * 3.0).sum().backward()
    total = dg.optim.clip_grad_norm_([v], 1.0, 2.0, True)
    assert total.item() == pytest.approx(6.0, rel=1e-6)


def test_dataloader_defaults_are_torch():
    data = dg.data.TensorDataset(dg.arange(5), dg.arange(0, 50, 10))
    batches = list(dg.data.DataLoader(data))
    assert len(batches) == 5
    assert [int(b[0].item()) for b in batches] == [0, 1, 2, 3, 4]
    assert tuple(batches[0][0].shape) == (1,)

    class Squares:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i * i

    assert [int(b.item()) for b in dg.data.DataLoader(Squares())] == [0, 1, 4]


def test_outputs_usable_after_backward(rng):
    model = dg.nn.Linear(4, 3)
    x = dg.tensor(rng.standard_normal((8, 4)).astype(np.float32))
    y = dg.tensor(rng.integers(0, 3, size=8))
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    accuracy = (logits.argmax(1) == y).float().mean()  # the usual train-accuracy line after backward
    assert accuracy.item() == pytest.approx(np.mean(logits.numpy().argmax(1) == y.numpy()))
    assert loss.item() > 0 and logits.softmax(1).sum().item() == pytest.approx(8.0, rel=1e-5)
    # int64 comparisons (as PyTorch promotes): a float mask, float64 for two int64 operands
    labels = y.numpy()
    np.testing.assert_array_equal((y == 2).numpy(), labels == 2)
    np.testing.assert_array_equal((y == 2.5).numpy(), np.zeros(8))
    np.testing.assert_array_equal((y < dg.tensor(np.ones(8, dtype=np.float32))).numpy(), labels < 1)
    assert (y == y).dtype == dg.float64 and (y >= 1).dtype == dg.float64
    # a new forward that mixes the old logits in without needing their gradient works ...
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    extra = (model(x).sum() + logits.argmax(1).float().sum())
    extra.backward()
    # ... but a gradient that would flow into them is refused before any gradient changes
    for p in model.parameters():
        p.grad = None
    with pytest.raises(dg.GraphError, match="retain_graph=True"):
        (model(x).sum() + logits.sum()).backward()
    assert all(p.grad is None for p in model.parameters())
    del grads


def test_errors_use_python_spellings(rng):
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    y = (x * 2.0).sum()
    y.backward()
    with pytest.raises(dg.GraphError) as info:
        y.backward()
    assert "retain_graph=True" in str(info.value)
    assert "BackwardOptions" not in str(info.value)
