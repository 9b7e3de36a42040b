"""dyngrad.nn.LSTM / GRU / RNN: the C++ recurrent layers (nn/recurrent.h) from Python."""
import numpy as np
import pytest

import dyngrad as dg
from dyngrad import nn

MODES = [("lstm", lambda *a, **k: nn.LSTM(*a, **k)), ("gru", lambda *a, **k: nn.GRU(*a, **k)),
         ("rnn_tanh", lambda *a, **k: nn.RNN(*a, **k)),
         ("rnn_relu", lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k))]
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def state_of(mode, result):
    output, state = result
    return (output, *state) if mode == "lstm" else (output, state)


@pytest.mark.parametrize("mode,make", MODES)
@pytest.mark.parametrize("layers,bidirectional,batch_first", [(1, False, False), (2, True, False), (2, False, True)])
def test_shapes(mode, make, layers, bidirectional, batch_first):
    steps, batch, features, hidden = 5, 3, 4, 6
    layer = make(features, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    dirs = 2 if bidirectional else 1
    x = dg.randn(*((batch, steps, features) if batch_first else (steps, batch, features)))
    parts = state_of(mode, layer(x))
    assert parts[0].shape == ((batch, steps, dirs * hidden) if batch_first else (steps, batch, dirs * hidden))
    for state in parts[1:]:
        assert state.shape == (layers * dirs, batch, hidden)
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    layout = layer.weight_layout()
    assert sum(int(np.prod(shape)) for _, _, shape in layout) == layer.weight.shape[0]
    g = GATES[mode]
    first_in = [shape for name, _, shape in layout if name.startswith("l0.fwd.W_ih")]
    assert len(first_in) == g and all(shape == (hidden, features) for shape in first_in)


@pytest.mark.parametrize("mode,make", MODES)
def test_initialisation_is_the_cpp_layers(mode, make):
    dg.manual_seed(7)
    a = make(3, 5, num_layers=2).weight.numpy().copy()
    dg.manual_seed(7)
    b = make(3, 5, num_layers=2).weight.numpy().copy()
    np.testing.assert_array_equal(a, b)
    assert np.abs(a).max() <= 1 / np.sqrt(5) and a.std() > 0.1
    dg.manual_seed(8)
    assert not np.array_equal(a, make(3, 5, num_layers=2).weight.numpy())


def _loss(mode, layer, x, state, weights):
    """A scalar that depends on every output: sum of each part times its fixed random weight."""
    parts = state_of(mode, layer(x, state))
    total = None
    for part, w in zip(parts, weights):
        term = (part * w).sum()
        total = term if total is None else total + term
    return total


@pytest.mark.parametrize("mode,make", MODES)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_gradients_match_finite_differences(mode, make, bidirectional, rng):
    steps, batch, features, hidden, layers = 3, 2, 3, 4, 2
    dirs = 2 if bidirectional else 1
    layer = make(features, hidden, num_layers=layers, bidirectional=bidirectional).to(dg.float64)
    x = dg.tensor(rng.standard_normal((steps, batch, features)), requires_grad=True)
    h0 = dg.tensor(0.5 * rng.standard_normal((layers * dirs, batch, hidden)), requires_grad=True)
    c0 = dg.tensor(0.5 * rng.standard_normal((layers * dirs, batch, hidden)), requires_grad=True)
    state = (h0, c0) if mode == "lstm" else h0
    n_parts = 3 if mode == "lstm" else 2
    shapes = [(steps, batch, dirs * hidden)] + [(layers * dirs, batch, hidden)] * (n_parts - 1)
    weights = [dg.tensor(rng.standard_normal(s)) for s in shapes]
    _loss(mode, layer, x, state, weights).backward()

    def numeric(tensor, index, eps=1e-6):
        flat = tensor.numpy().reshape(-1)  # a view: writes go into the tensor
        keep = flat[index]
        values = []
        for delta in (eps, -eps):
            flat[index] = keep + delta
            with dg.no_grad():
                values.append(_loss(mode, layer, x, state, weights).item())
        flat[index] = keep
        return (values[0] - values[1]) / (2 * eps)

    checks = [(layer.weight, layer.weight.grad), (x, x.grad), (h0, h0.grad)] + ([(c0, c0.grad)] if mode == "lstm" else [])
    for tensor, grad in checks:
        analytic = grad.numpy().reshape(-1)
        for index in rng.choice(analytic.size, size=min(12, analytic.size), replace=False):
            assert numeric(tensor, index) == pytest.approx(analytic[index], rel=1e-5, abs=1e-7), (mode, index)


@pytest.mark.parametrize("mode,make", MODES[:2])
def test_a_tiny_sequence_task_is_learned(mode, make, rng):
    """Recall the first input at the last step: the loss falls well below its start."""
    dg.manual_seed(3)
    recurrent, head = make(1, 16), nn.Linear(16, 1)
    params = list(recurrent.parameters()) + list(head.parameters())
    optimizer = dg.optim.Adam(params, lr=0.02)
    losses = []
    for step in range(120):
        signs = rng.choice([-1.0, 1.0], size=(6, 32, 1)).astype(np.float32)
        x, target = dg.tensor(signs), dg.tensor(signs[0])
        parts = state_of(mode, recurrent(x))
        prediction = head(parts[1][-1])  # the top layer's final hidden state
        loss = dg.functional.mse_loss(prediction, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.2 * np.mean(losses[:10]), losses[::10]


def test_matches_pytorch(torch, rng):
    """Same weights (the flat layout mapped onto torch's weight_ih_l* ...), same outputs and gradients."""
    steps, batch, features, hidden, layers = 4, 3, 5, 6, 2
    for mode, make, twin in [("lstm", MODES[0][1], torch.nn.LSTM), ("gru", MODES[1][1], torch.nn.GRU),
                             ("rnn_tanh", MODES[2][1], torch.nn.RNN)]:
        ours = make(features, hidden, num_layers=layers, bidirectional=True).to(dg.float64)
        theirs = twin(features, hidden, num_layers=layers, bidirectional=True).double()
        flat = ours.weight.numpy()
        blocks = {}
        for name, offset, shape in ours.weight_layout():
            key = name.rsplit(".", 1)[0] if name.count(".") == 3 else name  # "l0.fwd.W_ih"
            blocks.setdefault(key, []).append(flat[offset:offset + int(np.prod(shape))].reshape(shape))
        with torch.no_grad():
            for key, parts in blocks.items():
                layer, direction, kind = key.split(".")
                suffix = layer[1:] + ("_reverse" if direction == "bwd" else "")
                torch_name = {"W_ih": "weight_ih_l", "W_hh": "weight_hh_l", "b_ih": "bias_ih_l", "b_hh": "bias_hh_l"}[kind]
                getattr(theirs, torch_name + suffix).copy_(torch.from_numpy(np.concatenate(parts, axis=0)))
        x_np = rng.standard_normal((steps, batch, features))
        x, tx = dg.tensor(x_np, requires_grad=True), torch.tensor(x_np, requires_grad=True)
        out, _ = ours(x)
        tout, _ = theirs(tx)
        np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
        out.sum().backward()
        tout.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


BAD = [
    (dg.ShapeError, lambda: nn.LSTM(3, 4)(dg.randn(5, 2, 7))),
    (dg.ShapeError, lambda: nn.GRU(3, 4)(dg.randn(5, 3))),
    (dg.ShapeError, lambda: nn.GRU(3, 4, batch_first=True)(dg.randn(3))),
    (dg.ShapeError, lambda: nn.RNN(3, 4)(dg.randn(5, 2, 3), dg.zeros(2, 2, 4))),
    (dg.ShapeError, lambda: nn.LSTM(3, 4)(dg.randn(5, 2, 3), (dg.zeros(1, 2, 4), dg.zeros(1, 3, 4)))),
    (dg.ValueError, lambda: nn.LSTM(3, 4)(dg.randn(5, 2, 3), (None, dg.zeros(1, 2, 4)))),
    (dg.ValueError, lambda: nn.RNN(3, 4, nonlinearity="sigmoid")),
    (dg.ValueError, lambda: nn.LSTM(3, 0)),
    (dg.ValueError, lambda: nn.GRU(3, 4, num_layers=0)),
    (dg.ValueError, lambda: dg._core.rnn_weight_layout("elman", 3, 4)),
    (dg.DTypeError, lambda: nn.LSTM(3, 4)(dg.randn(5, 2, 3, dtype=dg.float64))),
]


@pytest.mark.parametrize("error,call", BAD)
def test_bad_calls_raise_typed_errors(error, call):
    with pytest.raises(error):
        call()
