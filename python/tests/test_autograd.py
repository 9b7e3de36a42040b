import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F
from conftest import line_of


def test_backward_matches_analytic(rng):
    a = rng.standard_normal((3, 4))
    x = dg.tensor(a, requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(a) * (1 + a), rtol=1e-12)
    assert x.is_leaf and not y.is_leaf and y.requires_grad


def test_leaf_grad_accumulates_and_resets(rng):
    x = dg.tensor(rng.standard_normal(5), requires_grad=True)
    (x * 3.0).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(5, 6.0))
    x.grad = None
    assert x.grad is None
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(5, 2.0))


def test_retain_graph_and_second_backward_error(rng):
    x = dg.tensor(rng.standard_normal(4), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.numpy())
    with pytest.raises(dg.GraphError, match="already back-propagated"):
        y.backward()


def test_results_stay_usable_after_backward_but_no_gradient_flows_through_a_released_graph(rng):
    x = dg.tensor(rng.standard_normal(4), requires_grad=True)
    h = x * 2.0
    h.sum().backward()
    np.testing.assert_allclose((h * 3.0).numpy(), 6.0 * x.numpy())  # a value backward() kept, as in C++
    with pytest.raises(dg.GraphError, match=r"earlier backward\(\) released; call that backward with retain_graph=True"):
        (h * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 2.0))  # the refused backward changed nothing
    (h.detach() * 3.0).sum()  # detached: fine


def test_no_grad_records_nothing(rng):
    x = dg.tensor(rng.standard_normal(4), requires_grad=True)
    with dg.no_grad():
        y = x * 2.0
        assert not dg.is_grad_enabled()
    assert dg.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf
    with pytest.raises(dg.GraphError, match="does not require grad"):
        y.sum().backward()


def test_non_scalar_backward_takes_a_gradient(rng):
    a = rng.standard_normal(3)
    x = dg.tensor(a, requires_grad=True)
    y = x * x
    y.backward(dg.tensor(np.array([1.0, 2.0, 3.0])))
    np.testing.assert_allclose(x.grad.numpy(), 2 * a * np.array([1, 2, 3]))


def test_errors_name_the_python_line(rng):
    x = dg.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    with pytest.raises(dg.ShapeError) as info:
        x @ x  # BAD-MATMUL
    assert f"test_autograd.py:{line_of('BAD-MATMUL')}" in str(info.value)
    with pytest.raises(dg.ShapeError) as info:
        dg.tensor(rng.standard_normal((2, 3))) @ dg.tensor(rng.standard_normal((2, 3)))  # EAGER-MATMUL
    assert f"test_autograd.py:{line_of('EAGER-MATMUL')}" in str(info.value)


def test_backward_error_names_the_recording_line(rng):
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    y = (x * 2.0).sum()  # RECORDED-HERE
    y.backward()
    with pytest.raises(dg.GraphError) as info:
        y.backward()
    assert f"test_autograd.py:{line_of('RECORDED-HERE')}" in str(info.value)


def test_frames_inside_dyngrad_are_skipped(rng):
    x = dg.tensor(rng.standard_normal((2, 3)))
    with pytest.raises(dg.ShapeError) as info:
        F.linear(x, dg.tensor(rng.standard_normal((4, 5))))  # VIA-FUNCTIONAL
    assert f"test_autograd.py:{line_of('VIA-FUNCTIONAL')}" in str(info.value)
    assert "functional.py" not in str(info.value)


def test_requires_grad_toggles(rng):
    x = dg.tensor(rng.standard_normal(3))
    assert not x.requires_grad
    x.requires_grad_()
    assert x.requires_grad and x.is_leaf
    with pytest.raises(dg.DTypeError):
        dg.tensor([1, 2]).requires_grad = True
    y = x * 2.0
    with pytest.raises(dg.GraphError):
        y.requires_grad = False


def test_anomaly_mode_raises_numerical_error():
    x = dg.tensor([1.0, -1.0], requires_grad=True)
    with dg.detect_anomaly():
        assert dg.is_anomaly_enabled()
        with pytest.raises(dg.NumericalError):
            x.log().sum()
    assert not dg.is_anomaly_enabled()
