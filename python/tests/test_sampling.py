"""Sorting and sampling from Python (ops/sampling.h): cumsum, sort / argsort, topk, multinomial as functions,
Tensor methods and dyngrad.ops rows; (values, indices) return types; the Generator; typed errors. Against NumPy
here, against PyTorch where it is installed (tie-free inputs: PyTorch leaves topk's tie order open)."""
import numpy as np
import pytest

import dyngrad as dg


def test_cumsum_values_and_gradient(rng):
    a = rng.standard_normal((3, 5))
    x = dg.tensor(a, requires_grad=True)
    y = dg.cumsum(x, 1)
    np.testing.assert_allclose(y.numpy(), np.cumsum(a, 1), rtol=1e-6)
    np.testing.assert_allclose(x.cumsum(0).numpy(), np.cumsum(a, 0), rtol=1e-6)
    w = rng.standard_normal((3, 5))
    (y * dg.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.flip(np.cumsum(np.flip(w, 1), 1), 1), rtol=1e-5)
    assert dg.cumsum(dg.tensor(a), 0, dtype=dg.float64).dtype == dg.float64


def test_sort_returns_named_values_and_indices(rng):
    a = rng.standard_normal((4, 6))
    x = dg.tensor(a, requires_grad=True)
    result = x.sort(dim=1, descending=True)
    values, indices = result  # unpacks as a pair
    assert result.values is values and result.indices is indices
    assert repr(result).startswith("sort(values=")
    assert indices.dtype == dg.int64 and not indices.requires_grad
    order = np.argsort(-a, axis=1, kind="stable")
    np.testing.assert_array_equal(indices.numpy(), order)
    np.testing.assert_allclose(values.numpy(), np.take_along_axis(a, order, 1).astype(np.float32), rtol=1e-6)
    values.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((4, 6)))
    np.testing.assert_array_equal(dg.argsort(x, dim=0).numpy(), np.argsort(a, axis=0, kind="stable"))


def test_sort_is_stable_with_ties_and_nan():
    a = np.array([1.0, np.nan, 0.0, 1.0, -2.0, 0.0, np.nan])
    x = dg.tensor(a, dtype=dg.float64)
    np.testing.assert_array_equal(x.argsort().numpy(), [4, 2, 5, 0, 3, 1, 6])
    np.testing.assert_array_equal(x.argsort(descending=True).numpy(), [1, 6, 0, 3, 2, 5, 4])
    assert dg.sort(x, stable=False).indices.numpy().tolist() == [4, 2, 5, 0, 3, 1, 6]  # always stable


def test_topk(rng):
    a = rng.standard_normal((5, 9))
    x = dg.tensor(a, requires_grad=True)
    values, indices = dg.topk(x, 3)
    expect = np.argsort(-a, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(indices.numpy(), expect)
    np.testing.assert_allclose(values.numpy(), np.take_along_axis(a, expect, 1).astype(np.float32), rtol=1e-6)
    small = x.topk(2, dim=0, largest=False)
    assert repr(small).startswith("topk(")
    np.testing.assert_array_equal(small.indices.numpy(), np.argsort(a, axis=0, kind="stable")[:2])
    values.sum().backward()
    grad = np.zeros_like(a)
    np.put_along_axis(grad, expect, 1.0, 1)
    np.testing.assert_allclose(x.grad.numpy(), grad)
    np.testing.assert_array_equal(dg.ops.topk_indices(x, k=3, largest=True).numpy(), expect)
    with pytest.raises(dg.ValueError, match="k = 10"):
        dg.topk(x, 10)


def test_multinomial_statistics_and_reproducibility():
    weights = np.array([1.0, 2.0, 0.0, 3.0, 4.0], dtype=np.float32)
    probs = dg.tensor(np.tile(weights, (40, 1)))
    g = dg.Generator(7)
    draws = dg.multinomial(probs, 1000, replacement=True, generator=g).numpy()
    assert draws.shape == (40, 1000) and draws.dtype == np.int64
    counts = np.bincount(draws.ravel(), minlength=5)
    assert counts[2] == 0
    expected = weights / weights.sum() * draws.size
    keep = expected > 0
    chi = (((counts - expected)[keep]) ** 2 / expected[keep]).sum()
    assert chi < 30  # 3 degrees of freedom: P(chi² > 30) < 2e-6
    # The same generator seed, the same samples; the default generator through manual_seed.
    again = dg.multinomial(probs, 1000, True, generator=dg.Generator(7)).numpy()
    np.testing.assert_array_equal(draws, again)
    dg.manual_seed(3)
    first = probs.multinomial(4).numpy()
    dg.manual_seed(3)
    np.testing.assert_array_equal(first, probs.multinomial(4).numpy())
    for row in first:
        assert len(set(row.tolist())) == 4 and 2 not in row  # without replacement: distinct, never weight 0


@pytest.mark.parametrize("bad, match", [([1.0, float("nan")], "NaN weight"), ([1.0, float("inf")], "infinite weight"),
                                        ([1.0, -1.0], "negative weight"), ([0.0, 0.0], "summing to 0")])
def test_multinomial_refuses_invalid_rows(bad, match):
    with pytest.raises(dg.ValueError, match=match):
        dg.multinomial(dg.tensor([bad]), 1, replacement=True)


def test_multinomial_argument_errors():
    probs = dg.tensor([[1.0, 2.0, 3.0]])
    with pytest.raises(dg.ValueError, match="without replacement"):
        dg.multinomial(probs, 4)
    with pytest.raises(dg.ValueError, match="fewer non-zero weights"):
        dg.multinomial(dg.tensor([[1.0, 0.0, 3.0]]), 3)
    with pytest.raises(TypeError, match="generator"):
        dg.multinomial(probs, 1, generator=5)


def test_gpu_matches_cpu(cuda, rng):
    a = rng.integers(-2, 3, size=(6, 300)).astype(np.float32)  # many ties
    x = dg.tensor(a)
    for descending in (False, True):
        np.testing.assert_array_equal(x.to(cuda).argsort(descending=descending).cpu().numpy(),
                                      x.argsort(descending=descending).numpy())
    probs = dg.tensor(rng.uniform(0, 1, size=(4, 200)).astype(np.float32))
    for replacement in (False, True):
        np.testing.assert_array_equal(
            dg.multinomial(probs.to(cuda), 20, replacement, generator=dg.Generator(5)).cpu().numpy(),
            dg.multinomial(probs, 20, replacement, generator=dg.Generator(5)).numpy())
    np.testing.assert_allclose(dg.cumsum(x.to(cuda), 1).cpu().numpy(), np.cumsum(a, 1), rtol=1e-5, atol=1e-5)


def test_against_pytorch(torch, rng):
    a = rng.standard_normal((4, 11))
    x, t = dg.tensor(a, dtype=dg.float64), torch.tensor(a)
    np.testing.assert_allclose(dg.cumsum(x, 1).numpy(), torch.cumsum(t, 1).numpy(), rtol=1e-12)
    np.testing.assert_array_equal(dg.argsort(x, 0, True).numpy(), torch.argsort(t, dim=0, descending=True, stable=True).numpy())
    ours, theirs = x.topk(3, dim=1, largest=False), t.topk(3, dim=1, largest=False)
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    np.testing.assert_allclose(ours.values.numpy(), theirs.values.numpy())
    values, _ = dg.sort(x, dim=1)
    np.testing.assert_allclose(values.numpy(), torch.sort(t, dim=1).values.numpy())
