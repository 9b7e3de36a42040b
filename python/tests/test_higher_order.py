"""dg.autograd.grad(create_graph=True) and dg.autograd.functional, against analytic derivatives in float64."""
import numpy as np
import pytest

import dyngrad as dg
from conftest import numeric_grad


def test_second_and_third_derivatives_of_a_polynomial(rng):
    a = rng.standard_normal(5)
    x = dg.tensor(a, requires_grad=True)
    (d1,) = dg.autograd.grad((x * x * x).sum(), x, create_graph=True)
    (d2,) = dg.autograd.grad(d1.sum(), x, create_graph=True)
    (d3,) = dg.autograd.grad(d2.sum(), x)
    np.testing.assert_allclose(d1.numpy(), 3 * a ** 2, rtol=1e-12)
    np.testing.assert_allclose(d2.numpy(), 6 * a, rtol=1e-12)
    np.testing.assert_allclose(d3.numpy(), np.full(5, 6.0), rtol=1e-12)
    assert x.grad is None


def test_gradient_penalty_through_a_layer(rng):
    # f = Σ tanh(W x); ‖∇x f‖² differentiated in W: the penalty term of WGAN-GP, checked by central differences
    w0, a = rng.standard_normal((3, 4)), rng.standard_normal(4)

    def penalty(w_value, want_grad):
        w = dg.tensor(w_value, requires_grad=want_grad)
        x = dg.tensor(a, requires_grad=True)
        f = (w @ x.reshape(4, 1)).tanh().sum()
        (gx,) = dg.autograd.grad(f, x, create_graph=True)
        p = (gx * gx).sum()
        return p, w

    p, w = penalty(w0, True)
    (gw,) = dg.autograd.grad(p, w)
    numeric = numeric_grad(lambda w: penalty(w, False)[0].item(), w0)
    np.testing.assert_allclose(gw.numpy(), numeric, rtol=1e-6, atol=1e-9)


def test_first_order_only_op_raises_higher_order_not_supported(rng):
    # a custom op without a differentiable backward is first-order only
    twice = dg.custom_op("py_twice_first_order", 1, lambda v: 2.0 * v, lambda g, v: 2.0 * g)
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    with pytest.raises(dg.autograd.HigherOrderNotSupported, match="py_twice_first_order"):
        dg.autograd.grad((twice(x) * x).sum(), x, create_graph=True)
    assert issubclass(dg.autograd.HigherOrderNotSupported, dg.GraphError)
    # max pooling is second order (a composition): d²/dx² of Σ maxpool(x)³ is 6·x at each window's maximum
    a = rng.standard_normal((1, 1, 4, 4))
    x = dg.tensor(a, requires_grad=True)
    (g,) = dg.autograd.grad((dg.nn.functional.max_pool2d(x, 2) ** 3).sum(), x, create_graph=True)
    (h,) = dg.autograd.grad(g.sum(), x)
    expected = np.zeros_like(a)
    for i in range(2):
        for j in range(2):
            win = a[0, 0, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
            r, c = np.unravel_index(np.argmax(win), win.shape)
            expected[0, 0, 2 * i + r, 2 * j + c] = 6 * win[r, c]
    np.testing.assert_allclose(h.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_lstm_hessian_vector_product_matches_central_differences(rng):
    # rnn's differentiable backward (the recurrence as a composition): H·v of an LSTM in float64 against central
    # differences of its first-order gradient along v
    dg.manual_seed(0)
    lstm = dg.nn.LSTM(2, 3, num_layers=2).double()
    a, v = rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 2, 2))

    def gradient(values, create_graph):
        x = dg.tensor(values, requires_grad=True)
        output, (h_n, c_n) = lstm(x)
        (g,) = dg.autograd.grad(output.tanh().sum() + (h_n * c_n).sum(), x, create_graph=create_graph)
        return x, g

    x, g = gradient(a, True)
    (hv,) = dg.autograd.grad((g * dg.tensor(v)).sum(), x)
    eps = 1e-5
    numeric = (gradient(a + eps * v, False)[1].numpy() - gradient(a - eps * v, False)[1].numpy()) / (2 * eps)
    assert np.abs(hv.numpy()).max() > 1e-3
    np.testing.assert_allclose(hv.numpy(), numeric, rtol=1e-6, atol=1e-8)


def test_functional_vjp_jvp_jacobian(rng):
    a, x0, v = rng.standard_normal((3, 3)), rng.standard_normal(3), rng.standard_normal(3)
    A = dg.tensor(a)

    def f(x):
        return (A @ x.reshape(3, 1)).reshape(3).tanh()

    y = np.tanh(a @ x0)
    jac = (1 - y ** 2)[:, None] * a
    out, vj = dg.autograd.functional.vjp(f, dg.tensor(x0), dg.tensor(v))
    np.testing.assert_allclose(out.numpy(), y, rtol=1e-12)
    np.testing.assert_allclose(vj.numpy(), v @ jac, rtol=1e-10, atol=1e-12)
    _, jv = dg.autograd.functional.jvp(f, dg.tensor(x0), dg.tensor(v))
    np.testing.assert_allclose(jv.numpy(), jac @ v, rtol=1e-10, atol=1e-12)
    j = dg.autograd.functional.jacobian(f, dg.tensor(x0))
    np.testing.assert_allclose(j.numpy(), jac, rtol=1e-10, atol=1e-12)


def test_functional_hvp_hessian(rng):
    x0, v = rng.standard_normal(3), rng.standard_normal(3)

    def f(x):
        return (x * x * x).sum() + (x * x).sum() * x.sum()

    # f = Σx³ + (Σx²)(Σx): H = diag(6x) + 2·S·I + 2x·1ᵀ + 2·1·xᵀ, S = Σx
    s = x0.sum()
    h = np.diag(6 * x0) + 2 * s * np.eye(3) + 2 * np.outer(x0, np.ones(3)) + 2 * np.outer(np.ones(3), x0)
    hess = dg.autograd.functional.hessian(f, dg.tensor(x0))
    np.testing.assert_allclose(hess.numpy(), h, rtol=1e-10, atol=1e-12)
    out, hv = dg.autograd.functional.hvp(f, dg.tensor(x0), dg.tensor(v))
    np.testing.assert_allclose(hv.numpy(), h @ v, rtol=1e-10, atol=1e-12)
    with pytest.raises(dg.ValueError, match="one element"):
        dg.autograd.functional.hvp(lambda x: x * 2.0, dg.tensor(x0), dg.tensor(v))
