import numpy as np
import pytest

import dyngrad as dg


def test_construction_dtypes_and_shape(rng):
    a = rng.standard_normal((3, 4))
    t = dg.tensor(a)
    assert t.shape == (3, 4) and t.dtype == dg.float64 and str(t.device) == "cpu"
    np.testing.assert_array_equal(t.numpy(), a)
    assert dg.tensor([[1.0, 2.0]]).dtype == dg.float32
    assert dg.tensor([1, 2, 3]).dtype == dg.int64
    assert dg.tensor(np.arange(4, dtype=np.int32)).dtype == dg.int64
    assert dg.tensor(a, dtype="float32").dtype == dg.float32
    assert dg.tensor(2.5).item() == 2.5 and dg.tensor(2.5).shape == ()
    assert dg.zeros(2, 3).shape == (2, 3) and dg.ones((2, 3), dtype=dg.float64).dtype == dg.float64
    assert dg.arange(5).numpy().tolist() == [0, 1, 2, 3, 4]
    assert dg.full((2,), 7.0).numpy().tolist() == [7.0, 7.0]
    assert len(dg.zeros(5, 2)) == 5 and dg.zeros(5, 2).ndim == 2 and dg.zeros(5, 2).numel() == 10


def test_operators_match_numpy(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    x, y = dg.tensor(a), dg.tensor(b)
    np.testing.assert_allclose((x + y).numpy(), a + b)
    np.testing.assert_allclose((x - y).numpy(), a - b)
    np.testing.assert_allclose((x * y).numpy(), a * b)
    np.testing.assert_allclose((x / y).numpy(), a / b)
    np.testing.assert_allclose((2.0 - x).numpy(), 2.0 - a)
    np.testing.assert_allclose((3.0 / (x * x + 1)).numpy(), 3.0 / (a * a + 1))
    np.testing.assert_allclose((-x).numpy(), -a)
    np.testing.assert_allclose((x ** 2).numpy(), a ** 2)
    np.testing.assert_allclose((x @ y.T).numpy(), a @ b.T)
    np.testing.assert_array_equal((x > y).numpy(), (a > b).astype(np.float64))
    np.testing.assert_array_equal((x <= 0.0).numpy(), (a <= 0).astype(np.float64))
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1))
    np.testing.assert_allclose(x.mean().item(), a.mean())
    np.testing.assert_allclose(x.max(1).values.numpy(), a.max(1))
    assert x.argmax(1).numpy().tolist() == a.argmax(1).tolist()
    np.testing.assert_allclose(x.softmax(1).numpy(), np.exp(a) / np.exp(a).sum(1, keepdims=True))


def test_indexing_and_slicing(rng):
    a = rng.standard_normal((4, 5, 6))
    x = dg.tensor(a)
    for key in [0, -1, (1, 2), (slice(1, 3),), (slice(None), 2), (Ellipsis, 3), (None, 1), (slice(None, None, 2), 1),
                (slice(4, 0, -1),), (1, slice(1, 5, 3), Ellipsis)]:
        np.testing.assert_array_equal(x[key].numpy(), a[key], err_msg=str(key))
    idx = dg.tensor([3, 0, 3])
    np.testing.assert_array_equal(x[idx].numpy(), a[[3, 0, 3]])
    np.testing.assert_array_equal(x[:, idx].numpy(), a[:, [3, 0, 3]])


def test_indexing_records_gradients(rng):
    x = dg.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    (x[1] * 2.0).sum().backward()
    expected = np.zeros((3, 4))
    expected[1] = 2.0
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_numpy_view_and_array_protocol(rng):
    t = dg.tensor(rng.standard_normal((2, 3)).astype(np.float32))
    view = t.numpy()
    view[0, 0] = 123.0
    assert t[0, 0].item() == 123.0  # .numpy() is a view, as in PyTorch
    assert np.asarray(t).shape == (2, 3)
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert t.tolist()[0][0] == 123.0


def test_conversions(rng):
    t = dg.tensor(rng.standard_normal(3))
    assert t.float().dtype == dg.float32 and t.float().double().dtype == dg.float64
    assert dg.tensor([1.7, 2.2]).long().numpy().tolist() == [1, 2]
    assert float(dg.tensor([1.5])) == 1.5 and int(dg.tensor([3])) == 3
    assert dg.device("cpu") == "cpu" and dg.device("cuda:1").index == 1
    assert repr(t).startswith("tensor([") and "dtype=dyngrad.float64" in repr(t)


def test_reshape_family(rng):
    a = rng.standard_normal((2, 3, 4))
    x = dg.tensor(a)
    assert x.reshape(6, 4).shape == (6, 4) and x.reshape((4, 6)).shape == (4, 6)
    assert x.flatten(1).shape == (2, 12) and x.flatten().shape == (24,)
    assert x.unsqueeze(0).shape == (1, 2, 3, 4) and x.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert x[:, :1].squeeze(1).shape == (2, 4)
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.transpose(0, 2).numpy(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(dg.functional.cat([x, x], 1).numpy(), np.concatenate([a, a], 1))
    np.testing.assert_array_equal(dg.functional.stack([x, x], 0).numpy(), np.stack([a, a], 0))
