"""Issue 35 (trust, round 3) from Python: arguments of the wrong Python type are refused as PyTorch refuses them,
with a TypeError naming the function and the argument; a bool index adds an axis; NumPy arrays without
elements are shared whatever their strides, and read-only ones are refused with dyngrad's ValueError."""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F
from dyngrad import nn
from dyngrad.data import DataLoader, TensorDataset


# ---- numeric strings (and floats) where ints are required ----

NUMERIC_STRINGS = [
    (lambda: nn.Linear("4", 3), ["Linear", "in_features", "str"]),
    (lambda: nn.Linear(4, "3"), ["Linear", "out_features"]),
    (lambda: nn.Linear(4.0, 3), ["Linear", "in_features", "float"]),
    (lambda: nn.Conv2d(3, "8", 3), ["Conv2d", "out_channels"]),
    (lambda: nn.Conv2d(3, 8, "3"), ["Conv2d", "kernel_size"]),
    (lambda: nn.Conv2d(3, 8, 3, stride="1"), ["Conv2d", "stride"]),
    (lambda: nn.Conv2d(4, 8, 3, groups="2"), ["Conv2d", "groups"]),
    (lambda: nn.BatchNorm2d("16"), ["BatchNorm", "num_features"]),
    (lambda: nn.BatchNorm2d(16, eps="1e-5"), ["BatchNorm", "eps"]),
    (lambda: nn.LayerNorm("8"), ["LayerNorm", "normalized_shape"]),
    (lambda: nn.LayerNorm([8, "4"]), ["LayerNorm", "normalized_shape"]),
    (lambda: nn.RMSNorm(("8",)), ["RMSNorm", "normalized_shape"]),
    (lambda: nn.Embedding(10, "4"), ["Embedding", "embedding_dim"]),
    (lambda: nn.Embedding(10, 4, padding_idx="0"), ["Embedding", "padding_idx"]),
    (lambda: nn.LSTM("4", 8), ["LSTM", "input_size"]),
    (lambda: nn.GRU(4, 8, num_layers="2"), ["GRU", "num_layers"]),
    (lambda: nn.Dropout(0.5, seed="3"), ["Dropout", "seed"]),
    (lambda: nn.Dropout("0.5"), ["Dropout", "p"]),
    (lambda: nn.Flatten("1"), ["Flatten", "start_dim"]),
    (lambda: nn.MaxPool2d("2"), ["MaxPool2d", "kernel_size"]),
    (lambda: dg.zeros("3"), ["zeros", "size", "str"]),
    (lambda: dg.zeros(2, "3"), ["zeros", "size"]),
    (lambda: dg.ones(2, 3.0), ["ones", "size"]),
    (lambda: dg.randn(["2", 3]), ["randn", "size"]),
    (lambda: dg.full("2", 1.0), ["full", "size"]),
    (lambda: dg.ones(2, 3).reshape(3, "2"), ["reshape", "size"]),
    (lambda: dg.ones(2, 3).view("6"), ["view", "size"]),
    (lambda: dg.ops.sum(dg.ones(2, 3), axis="0"), ["sum", "axis"]),
    (lambda: dg.ops.sum(dg.ones(2, 3), axes=["0"]), ["sum", "axes"]),
    (lambda: dg.ops.sum(dg.ones(2, 3), axes=True), ["sum", "axes", "bool"]),
    (lambda: F.conv2d(dg.ones(1, 1, 4, 4), dg.ones(1, 1, 3, 3), stride="1"), ["conv2d", "stride"]),
    (lambda: F.conv2d(dg.ones(1, 1, 4, 4), dg.ones(1, 1, 3, 3), padding=(1, "1")), ["conv2d", "padding"]),
    (lambda: F.max_pool2d(dg.ones(1, 1, 4, 4), "2"), ["max_pool2d", "kernel"]),
    (lambda: F.cross_entropy(dg.ones(2, 3), dg.tensor([0, 1]), ignore_index="0"), ["cross_entropy", "ignore_index"]),
]


@pytest.mark.parametrize("call,words", NUMERIC_STRINGS, ids=[str(i) for i in range(len(NUMERIC_STRINGS))])
def test_numeric_strings_and_floats_are_refused_where_ints_are_required(call, words):
    with pytest.raises(TypeError) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, message


def test_numeric_strings_are_refused_by_every_binding_taking_an_int():
    # Entry points bound straight from C++ (no Python wrapper): the integer conversion itself refuses str.
    data = TensorDataset(dg.ones(8, 2), dg.tensor(np.arange(8)))
    for bad in ("4", 4.0, b"4"):
        with pytest.raises(TypeError):
            DataLoader(data, batch_size=bad)
        with pytest.raises(TypeError):
            dg.manual_seed(bad)
    p = nn.Parameter(dg.ones(3))
    with pytest.raises(TypeError):
        dg.optim.StepLR(dg.optim.SGD([p], lr=0.1), step_size="2")


def test_ints_from_numpy_are_taken(rng):
    n = np.int64(4)
    layer = nn.Linear(n, np.int32(3))
    assert layer.weight.shape == (3, 4) and type(layer.in_features) is int
    assert dg.zeros(n, np.int16(2)).shape == (4, 2)
    x = dg.tensor(rng.standard_normal((2, 3)).astype(np.float32))
    assert dg.ops.sum(x, axes=[np.int64(1)]).shape == (2,)
    assert F.softmax(x, np.int64(0)).shape == (2, 3)
    assert nn.Conv2d(2, 4, np.int64(3)).kernel_size == (3, 3)


def test_type_errors_name_the_function_and_the_argument():
    x = dg.ones(2, 3)
    bad = [
        (lambda: F.gelu(x, approximate=3), ["gelu", "approximate", "str", "int"]),
        (lambda: dg.ops.sum(x, keepdim="yes"), ["sum", "keepdim", "bool"]),
        (lambda: F.dropout(x, p="0.5"), ["dropout"]),
        (lambda: dg.optim.SGD([{"params": [nn.Parameter(dg.ones(2))], "lr": "0.1"}]), ["SGD", "lr", "float"]),
        (lambda: dg.optim.Adam([{"params": [nn.Parameter(dg.ones(2))], "betas": "ab"}]), ["Adam", "betas"]),
        (lambda: x.__dlpack__(max_version="1"), ["__dlpack__", "max_version"]),
        (lambda: x.__dlpack__(copy="yes"), ["__dlpack__", "copy"]),
    ]
    for call, words in bad:
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert "an argument has an incompatible Python type" not in message
        for word in words:
            assert word in message, message


# ---- a bool as an index adds an axis (NumPy, PyTorch) ----

def test_bool_index_adds_an_axis_of_one_or_zero(rng):
    a = rng.standard_normal((3, 4))
    x = dg.tensor(a)
    for key in [True, False, (True, 1), (0, True), (Ellipsis, True), (True, slice(1, 3)), np.True_, np.False_,
                (None, False)]:
        got, expected = x[key], a[key]
        assert got.shape == expected.shape, (key, got.shape, expected.shape)
        np.testing.assert_array_equal(got.numpy(), expected)
    # Several bools: each adds its own axis, as in PyTorch (NumPy broadcasts them into one).
    assert x[True, True].shape == (1, 1, 3, 4) and x[True, False].shape == (1, 0, 3, 4)
    assert x[True].shape == (1, 3, 4) and x[False].shape == (0, 3, 4)
    s = dg.tensor(2.5)
    assert s[True].shape == (1,) and s[False].shape == (0,) and s[True].numpy()[0] == 2.5


def test_bool_index_gradient(rng):
    x = dg.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    (x[True] * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0))
    y = dg.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    (y[False].sum() + (y * 0.0).sum()).backward()
    np.testing.assert_array_equal(y.grad.numpy(), np.zeros((2, 3)))


# ---- NumPy interop: zero-size arrays, read-only arrays ----

def test_zero_size_arrays_are_contiguous_whatever_their_strides():
    for a in [np.zeros((0, 3)), np.empty((3, 0), dtype=np.float32), np.zeros((4, 0))[:, ::2],
              np.zeros((0, 6))[:, ::2], np.zeros((0,), dtype=np.int64), np.zeros((2, 0, 3)).transpose(2, 0, 1)]:
        for share in (dg.from_numpy, dg.from_dlpack):
            t = share(a)
            assert t.shape == a.shape, (a.shape, a.strides)
            assert t.numpy().size == 0
    assert (dg.from_numpy(np.zeros((0, 3))) * 2.0).sum().item() == 0.0


def test_non_contiguous_arrays_with_elements_are_still_refused():
    with pytest.raises(dg.ValueError, match="non-contiguous"):
        dg.from_numpy(np.zeros((4, 6))[:, ::2])


def test_read_only_arrays_raise_dyngrads_value_error(rng):
    a = rng.standard_normal((3, 2))
    a.flags.writeable = False
    for share in (dg.from_numpy, dg.from_dlpack):
        with pytest.raises(dg.ValueError, match="read-only") as info:
            share(a)
        assert not isinstance(info.value, BufferError)
    broadcast = np.broadcast_to(np.float32(1.5), (2, 2))  # read-only by construction
    with pytest.raises(dg.ValueError):
        dg.from_numpy(broadcast)
    # The documented way out: a copy.
    t = dg.tensor(a)
    np.testing.assert_array_equal(t.numpy(), a)
    # A writable array is still shared, not copied.
    w = rng.standard_normal(4)
    shared = dg.from_numpy(w)
    w[0] = 42.0
    assert shared.numpy()[0] == 42.0


def test_custom_op_arguments_and_infer_results_of_the_wrong_type(rng):
    with pytest.raises(TypeError, match="custom_op.*'infer' must be a callable"):
        dg.custom_op("py_trust_bad_infer", 1, lambda x: x, lambda g, x: g, infer=3)
    op = dg.custom_op("py_trust_str_shape", 1, lambda x: x, lambda g, x: g, infer=lambda shapes, dtypes: "ab")
    with pytest.raises(dg.Error) as info:
        op(dg.tensor(rng.standard_normal(3)))
    message = str(info.value)
    assert "py_trust_str_shape" in message and "infer returned" in message and "str" in message


def test_sizes_from_numpy_arrays_are_still_taken():
    # A NumPy array has __index__ too, but is a sequence of ints where a size or a pair is asked for.
    assert dg.zeros(np.array([2, 3])).shape == (2, 3)
    assert dg.ones(2, 3).reshape(np.array([3, 2])).shape == (3, 2)
    assert nn.LayerNorm(np.array([4])).normalized_shape == (4,)
    assert nn.Conv2d(1, 2, np.array([3, 1])).kernel_size == (3, 1)
    out = F.conv2d(dg.ones(1, 1, 5, 5), dg.ones(1, 1, 3, 3), stride=np.array([2, 1]))
    assert out.shape == (1, 1, 2, 3)
