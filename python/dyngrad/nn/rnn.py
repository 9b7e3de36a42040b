"""Recurrent layers (LSTM, GRU, RNN) over the table's one rnn op (nn/recurrent.h's weight layout)."""
from __future__ import annotations

from .. import _core
from .. import functional as F
from .._core import Tensor
from .module import Module, Parameter
from ._arguments import _int


class RNNBase(Module):
    """A recurrent layer: one ``rnn`` op of the table over one flat weight (nn/recurrent.h, ops/rnn.h).

    ``weight`` holds every layer's and direction's matrices and biases in cuDNN's order, initialised by the
    C++ layer (uniform(±1/√hidden_size), as PyTorch); ``weight_layout()`` names its blocks. x is (T, N, I), or
    (N, T, I) with ``batch_first=True``; the initial state is zeros when left out. The GPU runs cuDNN's RNN.
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False, batch_first: bool = False):
        super().__init__()
        who = type(self).__name__
        input_size, hidden_size = _int(who, "input_size", input_size), _int(who, "hidden_size", hidden_size)
        num_layers = _int(who, "num_layers", num_layers)
        self.weight = Parameter(_core._rnn_init(mode, input_size, hidden_size, num_layers, bidirectional))
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bidirectional, self.batch_first = num_layers, bidirectional, batch_first

    def weight_layout(self) -> list[tuple[str, int, tuple[int, ...]]]:
        """[(name, offset, shape)] of the flat weight's blocks, e.g. ("l0.fwd.W_ih.i", 0, (H, I))."""
        return _core.rnn_weight_layout(self.mode, self.input_size, self.hidden_size, self.num_layers,
                                       self.bidirectional)

    def _run(self, x, h0, c0):
        if self.batch_first:
            x = F.transpose(x, 0, 1)
        if len(x.shape) != 3:
            raise _core.ShapeError(f"{type(self).__name__}: x must be (T, N, I) ({'(N, T, I) with ' if self.batch_first else ''}"
                                   f"batch_first), got shape {tuple(x.shape)}")
        if c0 is not None and h0 is None:
            raise _core.ValueError(f"{type(self).__name__}: c0 needs h0 (pass zeros for a zero initial hidden state)")
        inputs = [x, self.weight] + ([h0] if h0 is not None else []) + ([c0] if c0 is not None else [])
        packed = _core.apply(_RNN_OP, inputs, {"mode": self.mode, "hidden_size": self.hidden_size,
                                               "num_layers": self.num_layers, "bidirectional": self.bidirectional})
        # The op's one output packs [output | h_n | c_n] (ops/rnn.h): views of it, as the C++ rnn() returns.
        steps, batch = x.shape[0], x.shape[1]
        dirs = 2 if self.bidirectional else 1
        out_size, state_size = steps * batch * dirs * self.hidden_size, self.num_layers * dirs * batch * self.hidden_size
        output = F.narrow(packed, 0, 0, out_size).reshape(steps, batch, dirs * self.hidden_size)
        h_n = F.narrow(packed, 0, out_size, state_size).reshape(self.num_layers * dirs, batch, self.hidden_size)
        c_n = None
        if self.mode == "lstm":
            c_n = F.narrow(packed, 0, out_size + state_size, state_size).reshape(self.num_layers * dirs, batch,
                                                                                 self.hidden_size)
        if self.batch_first:
            output = F.transpose(output, 0, 1)
        return output, h_n, c_n

    def extra_repr(self):
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"bidirectional={self.bidirectional}, batch_first={self.batch_first}")


class LSTM(RNNBase):
    """``output, (h_n, c_n) = lstm(x, (h0, c0))``, as torch.nn.LSTM; gates i, f, g, o."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 batch_first: bool = False):
        super().__init__("lstm", input_size, hidden_size, num_layers, bidirectional, batch_first)

    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h0, c0 = (None, None) if hx is None else hx
        output, h_n, c_n = self._run(x, h0, c0)
        return output, (h_n, c_n)


class GRU(RNNBase):
    """``output, h_n = gru(x, h0)``, as torch.nn.GRU; gates r, z, n."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 batch_first: bool = False):
        super().__init__("gru", input_size, hidden_size, num_layers, bidirectional, batch_first)

    def forward(self, x: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, h_n, _ = self._run(x, hx, None)
        return output, h_n


class RNN(RNNBase):
    """The Elman RNN, ``output, h_n = rnn(x, h0)``, as torch.nn.RNN (nonlinearity "tanh" or "relu")."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bidirectional: bool = False, batch_first: bool = False):
        if nonlinearity not in ("tanh", "relu"):
            raise _core.ValueError(f"RNN: nonlinearity='{nonlinearity}': expected 'tanh' or 'relu'")
        super().__init__("rnn_" + nonlinearity, input_size, hidden_size, num_layers, bidirectional, batch_first)
        self.nonlinearity = nonlinearity

    def forward(self, x: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, h_n, _ = self._run(x, hx, None)
        return output, h_n


_RNN_OP = dict((name, index) for name, index, *_ in _core.op_table())["rnn"]
