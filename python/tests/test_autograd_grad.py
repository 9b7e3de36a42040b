"""dg.autograd.grad, the grad-mode switches, Module.apply and the top-level factories, against NumPy."""
import numpy as np
import pytest

import dyngrad as dg
from dyngrad import nn


def test_grad_of_leaves_matches_the_analytic_gradient_and_leaves_dot_grad_alone(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    x, w = dg.tensor(a, requires_grad=True), dg.tensor(b, requires_grad=True)
    other = dg.tensor(rng.standard_normal(2), requires_grad=True)
    y = ((x @ w).tanh() * other).sum()
    gx, gw = dg.autograd.grad(y, [x, w])
    t = np.tanh(a @ b)
    dz = (1 - t ** 2) * other.detach().numpy()
    np.testing.assert_allclose(gx.numpy(), dz @ b.T, rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), a.T @ dz, rtol=1e-12)
    assert x.grad is None and w.grad is None and other.grad is None  # no .grad changes, as torch's


def test_grad_restores_existing_grads_and_takes_grad_outputs(rng):
    a = rng.standard_normal(5)
    x = dg.tensor(a, requires_grad=True)
    (x * x).sum().backward()
    before = x.grad.numpy().copy()
    y = x.exp()
    seed = rng.standard_normal(5)
    (g,) = dg.autograd.grad(y, x, grad_outputs=dg.tensor(seed))
    np.testing.assert_allclose(g.numpy(), np.exp(a) * seed, rtol=1e-12)
    np.testing.assert_array_equal(x.grad.numpy(), before)


def test_grad_of_several_outputs_and_an_intermediate(rng):
    a = rng.standard_normal(4)
    x = dg.tensor(a, requires_grad=True)
    h = x * 3.0
    y1, y2 = (h * h).sum(), h.sin().sum()
    gh, gx = dg.autograd.grad([y1, y2], [h, x])
    np.testing.assert_allclose(gh.numpy(), 2 * 3 * a + np.cos(3 * a), rtol=1e-12)
    np.testing.assert_allclose(gx.numpy(), 3 * (2 * 3 * a + np.cos(3 * a)), rtol=1e-12)


def test_grad_retain_graph_allow_unused_and_errors(rng):
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    unused = dg.tensor(rng.standard_normal(3), requires_grad=True)
    y = (x * x).sum()
    (g1,) = dg.autograd.grad(y, x, retain_graph=True)
    (g2,) = dg.autograd.grad(y, x)  # a retained graph gives the same gradient again, not twice it
    np.testing.assert_allclose(g1.numpy(), g2.numpy())
    with pytest.raises(dg.GraphError, match="released"):
        dg.autograd.grad(y, x)
    y = (x * 2.0).sum()
    with pytest.raises(dg.GraphError, match="allow_unused"):
        dg.autograd.grad(y, [x, unused], retain_graph=True)
    gx, gu = dg.autograd.grad(y, [x, unused], allow_unused=True)
    assert gu is None and np.allclose(gx.numpy(), 2.0)
    twice = dg.custom_op("py_twice_first_order_grad", 1, lambda v: 2.0 * v, lambda g, v: 2.0 * g)
    with pytest.raises(dg.autograd.HigherOrderNotSupported, match="py_twice_first_order_grad"):  # first-order only
        dg.autograd.grad((twice(x) * x).sum(), x, create_graph=True)
    assert issubclass(dg.autograd.HigherOrderNotSupported, NotImplementedError)
    with pytest.raises(dg.GraphError, match="does not require grad"):
        dg.autograd.grad((x * x).sum(), dg.ones(3))
    with pytest.raises(TypeError, match="inputs"):
        dg.autograd.grad((x * x).sum(), "x")


def test_grad_through_a_model_keeps_parameter_grads(rng):
    dg.manual_seed(0)
    model = nn.Linear(3, 2)
    x = dg.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    (gx,) = dg.autograd.grad(model(x).sum(), x)
    np.testing.assert_allclose(gx.numpy(), np.tile(model.weight.detach().numpy().sum(0), (4, 1)), rtol=1e-6)
    assert model.weight.grad is None and model.bias.grad is None


def test_grad_modes():
    x = dg.ones(2, requires_grad=True)
    with dg.no_grad():
        assert not (x * 2).requires_grad
        with dg.enable_grad():
            assert dg.is_grad_enabled() and (x * 2).requires_grad
        assert not dg.is_grad_enabled()
    with dg.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert dg.is_grad_enabled()
    dg.set_grad_enabled(False)
    try:
        assert not dg.is_grad_enabled()
    finally:
        dg.set_grad_enabled(True)
    with dg.inference_mode():
        assert not (x * 2).requires_grad
    with dg.inference_mode(False):
        assert dg.is_grad_enabled()

    @dg.set_grad_enabled(False)
    def frozen():
        return dg.is_grad_enabled()

    assert dg.is_grad_enabled() and frozen() is False and dg.is_grad_enabled()
    with pytest.raises(TypeError):
        dg.set_grad_enabled("no")


def test_module_apply_visits_children_first():
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 1)))
    seen = []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["Linear", "ReLU", "Linear", "Sequential", "Sequential"]

    def zero(m):
        if isinstance(m, nn.Linear):
            with dg.no_grad():  # a parameter refuses in-place writes under grad mode, as in PyTorch
                m.weight.fill_(0.0)
    model.apply(zero)
    assert all(not p.numpy().any() for n, p in model.named_parameters() if n.endswith("weight"))


def test_factories_match_numpy(rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    x, y = dg.tensor(a), dg.tensor(b)
    np.testing.assert_array_equal(dg.cat([x, y], dim=1).numpy(), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(dg.stack([x, y], dim=1).numpy(), np.stack([a, b], 1))
    cond = (rng.random((2, 3)) < 0.5).astype(np.float64)
    np.testing.assert_array_equal(dg.where(dg.tensor(cond), x, y).numpy(), np.where(cond != 0, a, b))
    for fn, ref in ((dg.zeros_like, np.zeros_like(a)), (dg.ones_like, np.ones_like(a))):
        out = fn(x)
        assert out.dtype == dg.float64 and np.array_equal(out.numpy(), ref)
    full = dg.full_like(x, 2.5, dtype=dg.float32)
    assert full.dtype == dg.float32 and np.all(full.numpy() == 2.5)
    r = dg.randn_like(x)
    assert r.shape == (2, 3) and r.dtype == dg.float64
    u = dg.rand_like(x, requires_grad=True)
    assert u.requires_grad and np.all((u.detach().numpy() >= 0) & (u.detach().numpy() < 1))
    np.testing.assert_allclose(dg.linspace(-1, 2, 7).numpy(), np.linspace(-1, 2, 7, dtype=np.float32), rtol=1e-7)
    np.testing.assert_array_equal(dg.linspace(0, 1, 5, dtype=dg.float64).numpy(), np.linspace(0, 1, 5))
    assert dg.linspace(3, 4, 1).numpy().tolist() == [3.0] and dg.linspace(0, 1, 0).shape == (0,)
    ints = dg.randint(-3, 4, (1000,))
    assert ints.dtype == dg.int64 and ints.numpy().min() == -3 and ints.numpy().max() == 3
    assert dg.randint(5, (2, 2)).numpy().max() < 5
    dg.manual_seed(9)
    first = dg.randint(0, 100, (8,)).numpy()
    dg.manual_seed(9)
    np.testing.assert_array_equal(dg.randint(0, 100, (8,)).numpy(), first)
    with pytest.raises(dg.ValueError):
        dg.randint(3, 3, (2,))
    with pytest.raises(TypeError):
        dg.randint(0, 3, 2)
