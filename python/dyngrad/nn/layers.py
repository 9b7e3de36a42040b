"""The layers over one op of the table each: Linear, Conv2d, Embedding, Dropout, activations, pooling, Flatten."""
from __future__ import annotations

from .. import _core
from .. import functional as F
from .module import Module, Parameter, _param
from ._arguments import _float, _int, _pair


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, activation=None, init="torch"):
        super().__init__()
        in_features, out_features = _int("Linear", "in_features", in_features), _int("Linear", "out_features", out_features)
        w, b = _core._linear_init(in_features, out_features, bias, init)
        self.weight = Parameter(w)
        self.bias = _param(b)
        self.in_features, self.out_features, self.activation = in_features, out_features, activation

    def forward(self, x):
        return F.linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 activation=None, init="torch"):
        super().__init__()
        in_channels, out_channels = _int("Conv2d", "in_channels", in_channels), _int("Conv2d", "out_channels", out_channels)
        kernel_size, groups = _pair(kernel_size, "Conv2d", "kernel_size"), _int("Conv2d", "groups", groups)
        w, b = _core._conv2d_init(in_channels, out_channels, kernel_size, groups, bias, init)
        self.weight = Parameter(w)
        self.bias = _param(b)
        self.stride, self.padding = _pair(stride, "Conv2d", "stride"), _pair(padding, "Conv2d", "padding")
        self.dilation, self.groups = _pair(dilation, "Conv2d", "dilation"), groups
        self.activation = activation
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, self.activation)

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        num_embeddings = _int("Embedding", "num_embeddings", num_embeddings)
        embedding_dim = _int("Embedding", "embedding_dim", embedding_dim)
        padding_idx = None if padding_idx is None else _int("Embedding", "padding_idx", padding_idx)
        self.weight = Parameter(_core._embedding_init(num_embeddings, embedding_dim, padding_idx))
        self.padding_idx = padding_idx

    def forward(self, indices):
        return F.embedding(indices, self.weight, self.padding_idx)


class Dropout(Module):
    """Counter-based masks (identical on CPU and GPU): call k of a layer seeded s uses seed s·1000003 + k. The
    seed is drawn from manual_seed's generator at construction unless given, so two layers (and two runs under
    different manual_seed values) draw different masks, as torch's do."""

    def __init__(self, p=0.5, seed=None):
        super().__init__()
        p = _float("Dropout", "p", p)
        if seed is None:
            seed = _core._draw_seed() % (1 << 40)  # s·1000003 + k stays below 2^63
        seed = _int("Dropout", "seed", seed)  # a str seed would repeat the string
        if not 0.0 <= p < 1.0:
            raise _core.ValueError(f"Dropout: p={p} must be in [0, 1)")
        self.p, self.seed, self._calls = p, seed, 0

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        self._calls += 1
        return F.dropout(x, self.p, True, self.seed * 1000003 + self._calls)


class _Activation(Module):
    fn = None

    def forward(self, x):
        return type(self).fn(x)


class ReLU(_Activation):
    fn = staticmethod(F.relu)


class Sigmoid(_Activation):
    fn = staticmethod(F.sigmoid)


class Tanh(_Activation):
    fn = staticmethod(F.tanh)


class SiLU(_Activation):
    fn = staticmethod(F.silu)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


class Identity(Module):
    def forward(self, x):
        return x


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = _int("Flatten", "start_dim", start_dim), _int("Flatten", "end_dim", end_dim)

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        who = type(self).__name__
        for name, value in (("kernel_size", kernel_size), ("stride", stride), ("padding", padding)):
            if value is not None:
                _pair(value, who, name)  # checked here, kept as given (an int stays an int, as in PyTorch)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(MaxPool2d):
    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)
