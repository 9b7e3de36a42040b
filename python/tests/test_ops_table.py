import re
from pathlib import Path

import numpy as np
import pytest

import dyngrad as dg


def table_names_from_source():
    """The op names as ops/op_table.cpp spells them (when the repository is at hand)."""
    table = Path(__file__).resolve().parents[2] / "ops" / "op_table.cpp"
    if not table.exists():
        pytest.skip("ops/op_table.cpp not found (installed package without the repository)")
    return set(re.findall(r'\{OpType::\w+, "(\w+)"', table.read_text()))


def test_every_op_type_is_reachable_from_python():
    names = table_names_from_source() - {"leaf", "custom"}
    assert names, "no op rows parsed"
    missing = [n for n in sorted(names) if not callable(getattr(dg.ops, n, None))]
    assert not missing, f"ops not reachable as dyngrad.ops.<name>: {missing}"
    assert set(dg.ops.TABLE) == names


@pytest.mark.parametrize("name", sorted(dg.ops.TABLE))
def test_each_op_has_a_generated_function(name):
    fn = getattr(dg.ops, name)
    assert fn.__name__ == name and name in fn.__doc__


def test_generated_ops_compute(rng):
    a = rng.standard_normal((3, 4))
    x = dg.tensor(a, requires_grad=True)
    np.testing.assert_allclose(dg.ops.tanh(x).numpy(), np.tanh(a))
    np.testing.assert_allclose(dg.ops.clamp(x, min=-0.5, max=0.5).numpy(), np.clip(a, -0.5, 0.5))
    np.testing.assert_allclose(dg.ops.sum(x, axes=[0]).numpy(), a.sum(0))
    np.testing.assert_allclose(dg.ops.narrow(x, axis=1, start=1, length=2).numpy(), a[:, 1:3])
    np.testing.assert_allclose(dg.ops.concat(x, x, axis=0).numpy(), np.concatenate([a, a]))
    y = dg.ops.mul_scalar(dg.ops.leaky_relu(x, scalar=0.1), scalar=2.0).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.where(a > 0, 2.0, 0.2))


def test_cross_entropy_matches_numpy(rng):
    logits = rng.standard_normal((5, 3))
    labels = np.array([0, 2, 1, 1, 0])
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    expected = -np.log(p[np.arange(5), labels]).mean()
    got = dg.functional.cross_entropy(dg.tensor(logits), dg.tensor(labels)).item()
    assert abs(got - expected) < 1e-12


def test_conv_and_pool_shapes(rng):
    x = dg.tensor(rng.standard_normal((2, 1, 8, 8)).astype(np.float32))
    w = dg.tensor(rng.standard_normal((4, 1, 3, 3)).astype(np.float32))
    y = dg.functional.conv2d(x, w, padding=1)
    assert y.shape == (2, 4, 8, 8)
    assert dg.functional.max_pool2d(y, 2).shape == (2, 4, 4, 4)


def test_unknown_keyword_is_a_type_error(rng):
    with pytest.raises(TypeError, match="unexpected keyword argument 'axs'"):
        dg.ops.sum(dg.tensor(rng.standard_normal(3)), axs=[0])


def test_a_keyword_the_op_does_not_read_is_a_type_error(rng):
    """Every op takes the keywords of the attributes its op-table row reads (graph/op_def.h's field table), and
    only those: one it would ignore is refused, naming the op, the keyword and what the op takes."""
    x = dg.tensor(rng.standard_normal(3))
    with pytest.raises(TypeError, match=r"relu\(\) got an unexpected keyword argument 'eps' \(relu takes: none\)"):
        dg.ops.relu(x, eps=1e-3)
    with pytest.raises(TypeError, match=r"sum\(\) got an unexpected keyword argument 'axis' \(sum takes: axes \(dims\), keepdim\)"):
        dg.ops.sum(x, axis=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dropout_p'"):
        dg.ops.softmax(x, dropout_p=0.5)
    # The keywords (and aliases) of the attributes an op reads are all accepted.
    np.testing.assert_allclose(dg.ops.sum(x, dims=[0], keepdim=True).numpy(), x.numpy().sum(0, keepdims=True))
    np.testing.assert_allclose(dg.ops.softmax(x, dim=0).numpy(), dg.ops.softmax(x, axis=0).numpy())
    assert dg.ops.gelu(x, approximate="tanh").shape == (3,)
    assert dg.ops.clamp(x, min=None, max=0.5).shape == (3,)


def test_rows_argument_rules_run_from_python(rng):
    """dg.ops runs each row's argument rule (ops/argument_rules.h), as the C++ front doors do: the defaults that depend
    on the inputs are the row's, and a None optional input is left out (or filled by the rule)."""
    for np_dtype in (np.float32, np.float64):
        x = dg.tensor((rng.standard_normal((3, 4)) * 1e-4).astype(np_dtype))  # small: eps matters
        bias = dg.tensor(rng.standard_normal(4).astype(np_dtype))
        eps = float(np.finfo(np_dtype).eps)
        np.testing.assert_array_equal(dg.ops.rms_norm(x, shape=[4]).numpy(), dg.ops.rms_norm(x, shape=[4], eps=eps).numpy())
        assert not np.array_equal(dg.ops.rms_norm(x, shape=[4]).numpy(), dg.ops.rms_norm(x, shape=[4], eps=1e-5).numpy())
        ones = dg.ones(4, dtype=x.dtype)
        np.testing.assert_array_equal(dg.ops.layer_norm(x, None, bias, shape=[4]).numpy(),
                                      dg.ops.layer_norm(x, ones, bias, shape=[4]).numpy())
        np.testing.assert_array_equal(dg.ops.layer_norm(x, None, None, shape=[4]).numpy(),
                                      dg.ops.layer_norm(x, shape=[4]).numpy())
    images = dg.tensor(rng.standard_normal((2, 3, 6, 4)).astype(np.float32))
    assert dg.ops.max_pool2d(images, kernel=2).shape == (2, 3, 3, 2)  # stride: the kernel size
    np.testing.assert_array_equal(dg.ops.avg_pool2d(images, kernel=2).numpy(),
                                  dg.ops.avg_pool2d(images, kernel=2, stride=2).numpy())
    logits = dg.tensor(rng.standard_normal((3, 4)))
    target = dg.tensor(rng.uniform(size=(3, 4)))
    pos_weight = dg.tensor(rng.uniform(0.5, 2.0, size=4))
    np.testing.assert_array_equal(
        dg.ops.binary_cross_entropy_with_logits(logits, target, None, pos_weight).numpy(),
        dg.ops.binary_cross_entropy_with_logits(logits, target, dg.ones(4, dtype=dg.float64), pos_weight).numpy())
    with pytest.raises(TypeError, match=r"layer_norm\(\): input 0 is None"):
        dg.ops.layer_norm(None, shape=[4])
    with pytest.raises(TypeError, match=r"conv2d\(\): input 1 is None"):
        dg.ops.conv2d(images, None, dg.tensor(np.zeros(5, dtype=np.float32)))
    with pytest.raises(ValueError, match="rnn: input 2 is left out but input 3 is given"):
        dg.ops.rnn(images, images, None, images, hidden_size=2)


def test_embedding_padding_idx_rule_and_none_keywords(rng):
    """embedding's rule (ops/indexing.cpp) runs from Python too: a negative padding_idx counts from the weight's rows
    (as in PyTorch and C++), and that row gets no gradient; a keyword given as None is its default, so the rules that
    fill a default (embedding's padding_idx, rms_norm's eps, pooling's stride) treat it as not given."""
    weight = dg.tensor(rng.standard_normal((5, 3)), requires_grad=True)
    indices = dg.tensor(np.array([4, 0, 4, 2], dtype=np.int64))
    np.testing.assert_array_equal(dg.ops.embedding(weight, indices, padding_idx=-1).numpy(),
                                  dg.ops.embedding(weight, indices, padding_idx=4).numpy())
    dg.functional.embedding(indices, weight, padding_idx=-1).sum().backward()
    expected = np.zeros((5, 3))
    expected[[0, 2]] = 1.0
    np.testing.assert_array_equal(weight.grad.numpy(), expected)
    weight.grad = None
    dg.ops.embedding(weight, indices, padding_idx=None).sum().backward()
    expected[4] = 2.0
    np.testing.assert_array_equal(weight.grad.numpy(), expected)
    with pytest.raises(dg.IndexError, match=r"embedding.*padding_idx -6 is outside \[-5, 5\)"):
        dg.ops.embedding(weight, indices, padding_idx=-6)
    x = dg.tensor((rng.standard_normal((3, 4)) * 1e-4).astype(np.float32))
    np.testing.assert_array_equal(dg.ops.rms_norm(x, shape=[4], eps=None).numpy(), dg.ops.rms_norm(x, shape=[4]).numpy())
    images = dg.tensor(rng.standard_normal((2, 3, 6, 4)).astype(np.float32))
    assert dg.ops.max_pool2d(images, kernel=2, stride=None).shape == (2, 3, 3, 2)
