import numpy as np
import pytest

import dyngrad as dg


def square_forward(x):
    return x * x


def square_backward(grad, x):
    return 2.0 * x * grad


square = dg.custom_op("py_square", 1, square_forward, square_backward)


def test_custom_op_forward_backward(rng):
    a = rng.standard_normal((3, 4))
    x = dg.tensor(a, requires_grad=True)
    y = square(x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * a)


def test_custom_op_passes_gradcheck_and_verify(rng):
    passed, error, detail = square.gradcheck([[3, 5]], seed=11)
    assert passed, detail
    x = dg.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    report = dg.verify(square(x * 2.0).sum())
    assert report.passed, report.summary()
    assert any(node["op"] == "py_square" for node in report.nodes)


def test_seed_example_trains_to_zero():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "custom_op.py"
    spec = importlib.util.spec_from_file_location("custom_op_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.train(steps=100) < 1e-6


def test_bad_custom_ops_raise_typed_errors(rng):
    wrong_shape = dg.custom_op("py_wrong_shape", 1, lambda x: x[:1], lambda g, x: g)
    with pytest.raises(dg.ShapeError, match="returned shape"):
        wrong_shape(dg.tensor(rng.standard_normal(3)))
    raising = dg.custom_op("py_raising", 1, lambda x: 1 / 0, lambda g, x: g)
    with pytest.raises(dg.ValueError, match="ZeroDivisionError"):
        raising(dg.tensor(rng.standard_normal(3)))
    bad_backward = dg.custom_op("py_bad_backward", 2, lambda a, b: a + b, lambda g, a, b: (g,))
    x = dg.tensor(rng.standard_normal(3), requires_grad=True)
    with pytest.raises(dg.ValueError, match="1 gradients for 2 inputs"):
        bad_backward(x, x).sum().backward()
    with pytest.raises(TypeError):
        square(dg.tensor([1.0]), dg.tensor([2.0]))
    with pytest.raises(TypeError):
        square(np.zeros(3))
    with pytest.raises(TypeError):
        dg.custom_op("py_not_callable", 1, 3, 4)
