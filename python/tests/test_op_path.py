"""The op path from Python (python/src/tensor.cpp): operators as number slots, leaves recorded once per forward,
results reading their node's value, the cached caller site. Each test pins a behaviour those shortcuts could break."""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F
from conftest import line_of


def test_a_constant_enters_the_graph_once_per_forward(rng):
    c = dg.tensor(rng.standard_normal(3))
    y = dg.tensor(rng.standard_normal(3), requires_grad=True)
    before = dg._core._graph_size()
    for _ in range(10):
        y = y + c
    # one leaf for y, one for c, ten adds (a leaf per use of c made it 21)
    assert dg._core._graph_size() - before == 12
    y.sum().backward()


def test_a_parameter_used_twice_gets_both_gradients(rng):
    a = rng.standard_normal(4)
    w = dg.tensor(a, requires_grad=True)
    ((w * w) * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 3 * a ** 2, rtol=1e-6)


def test_a_retained_graph_records_fresh_leaves_after_its_backward(rng):
    a = rng.standard_normal(4)
    w = dg.tensor(a, requires_grad=True)
    c = dg.tensor(rng.standard_normal(4))
    first = (w * c).sum()
    first.backward(retain_graph=True)
    second = (w * w * c).sum()  # same graph (retained), new forward: w's gradient must not count twice
    second.backward()
    np.testing.assert_allclose(w.grad.numpy(), c.numpy() + 2 * a * c.numpy(), rtol=1e-5)


def test_requires_grad_switched_on_between_two_uses(rng):
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    c = dg.tensor(rng.standard_normal(3))
    y = x * c  # c a constant here
    c.requires_grad = True
    z = (y + c * 2.0).sum()  # and a parameter here
    z.backward()
    np.testing.assert_allclose(c.grad.numpy(), np.full(3, 2.0))
    np.testing.assert_allclose(x.grad.numpy(), c.numpy(), rtol=1e-6)


def test_module_to_gives_a_parameter_a_new_value_inside_one_graph(rng):
    lin = dg.nn.Linear(3, 2)
    x = dg.tensor(rng.standard_normal((4, 3)), dtype=dg.float32)
    keep = lin(x).sum()  # records lin.weight's leaf in the current graph
    lin.to(dg.float64)
    out = lin(x.double()).sum()  # the new value (float64), not the cached leaf's float32 one
    assert out.dtype == dg.float64
    out.backward()
    assert lin.weight.grad.dtype == dg.float64
    del keep


def test_results_with_history_read_their_value_after_backward(rng):
    a = rng.standard_normal((2, 3))
    x = dg.tensor(a, requires_grad=True)
    y = x * 2.0
    loss = y.sum()
    loss.backward()
    np.testing.assert_allclose(y.numpy(), 2 * a, rtol=1e-6)
    assert loss.item() == pytest.approx(2 * a.sum(), rel=1e-5)
    assert y.shape == (2, 3) and y.dtype == dg.float64 and str(y.device) == "cpu"


def test_operators_take_both_operand_orders_and_numpy_scalars(rng):
    a = rng.standard_normal(3).astype(np.float32)
    t = dg.tensor(a)
    cases = [
        (t + 2, a + 2), (2 + t, 2 + a), (t - 2.5, a - 2.5), (2.5 - t, 2.5 - a), (t * 3, a * 3), (3 * t, 3 * a),
        (t / 4, a / 4), (4 / t, 4 / a), (t * np.float32(2), a * 2), (np.float64(2) * t, 2 * a),
        (t + np.int64(1), a + 1), (t + True, a + 1), (t + t, a + a), (t - t * t, a - a * a), (t / t, a / a),
    ]
    for got, want in cases:
        assert isinstance(got, dg.Tensor)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    m = dg.tensor(rng.standard_normal((2, 3)))
    np.testing.assert_allclose((m @ dg.tensor(rng.standard_normal((3, 4)))).shape, (2, 4))
    p = dg.nn.Parameter(dg.tensor(a))
    assert type(p + t) is dg.Tensor and type(1.0 - p) is dg.Tensor  # subclasses take the same slots


@pytest.mark.parametrize("bad", [lambda t: t + "a", lambda t: "a" + t, lambda t: t * [1, 2], lambda t: t @ 2.0,
                                 lambda t: 2.0 @ t, lambda t: t - None, lambda t: t / object()])
def test_operators_refuse_other_operands_with_type_error(bad):
    with pytest.raises(TypeError):
        bad(dg.ones(2))


def test_division_by_a_zero_scalar_follows_ieee():
    out = (dg.tensor([1.0, -1.0]) / 0.0).numpy()
    assert np.isposinf(out[0]) and np.isneginf(out[1])


def test_an_operator_error_is_typed_and_names_the_line(rng):
    a, b = dg.tensor(rng.standard_normal((2, 3))), dg.tensor(rng.standard_normal((4, 5)))
    with pytest.raises(dg.ShapeError) as info:
        a + b  # SLOT-ADD
    assert f"test_op_path.py:{line_of('SLOT-ADD')}" in str(info.value)
    with pytest.raises(dg.DTypeError):
        a * dg.ones(2, 3, dtype=dg.float32)


def test_each_call_site_is_named_even_in_a_loop(rng):
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    messages = []
    for bad in (dg.ones(2, dtype=dg.float64), dg.ones(4, dtype=dg.float64)):
        for _ in range(3):
            y = x * 2.0  # LOOP-FINE
            try:
                y + bad  # LOOP-BAD-1
            except dg.ShapeError as e:
                messages.append(str(e))
            try:
                bad - y  # LOOP-BAD-2
            except dg.ShapeError as e:
                messages.append(str(e))
    assert len(messages) == 12
    assert all(f"test_op_path.py:{line_of('LOOP-BAD-1')}" in m for m in messages[0::2])
    assert all(f"test_op_path.py:{line_of('LOOP-BAD-2')}" in m for m in messages[1::2])
    with pytest.raises(dg.ShapeError) as info:
        F.linear(x, dg.ones(4, 5, dtype=dg.float64))  # LOOP-VIA-FUNCTIONAL
    assert f"test_op_path.py:{line_of('LOOP-VIA-FUNCTIONAL')}" in str(info.value)


def test_apply_checks_its_inputs():
    relu = dg.ops.TABLE["relu"][0]
    with pytest.raises(TypeError, match="input 0 is None"):
        dg._core.apply(relu, [None], {})
    with pytest.raises(TypeError, match="must be a dyngrad.Tensor"):
        dg._core.apply(relu, [np.ones(2)], {})
    with pytest.raises(TypeError, match="list of tensors"):
        dg._core.apply(relu, dg.ones(2), {})
    with pytest.raises(TypeError, match="keywords must be strings"):
        dg._core.apply(dg.ops.TABLE["sum"][0], [dg.ones(2)], {1: 2})
    many = [dg.ones(2) * float(i) for i in range(12)]  # more inputs than the inline buffer
    np.testing.assert_allclose(dg.ops.concat(many, axis=0).numpy(), np.repeat(np.arange(12.0), 2))
