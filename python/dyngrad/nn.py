"""Modules: subclass Module, assign Parameters, layers and buffers as attributes, write forward().

Assigning registers (``self.fc = Linear(...)`` registers the layer and its parameters, by dotted name,
as torch.nn does). The layers take their initial weights from dyngrad's C++ layers (nn/layers.h: PyTorch's
default initialisation, from the generator ``dyngrad.manual_seed`` sets), and their forward is one op of
the table, so a Python model computes exactly what its C++ twin does.
"""
from __future__ import annotations

import numbers as _numbers
import operator as _operator
import types as _types
from collections import OrderedDict

from . import _core, functional as F
from ._core import Tensor

__all__ = [
    "Parameter", "Module", "Linear", "Conv2d", "BatchNorm2d", "BatchNorm1d", "LayerNorm", "RMSNorm", "Embedding",
    "Dropout", "ReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "LeakyReLU", "Flatten", "MaxPool2d", "AvgPool2d",
    "Identity", "Sequential", "ModuleList", "CrossEntropyLoss", "MSELoss", "RNNBase", "LSTM", "GRU", "RNN",
    "MultiheadAttention", "TransformerBlock", "PositionalEmbedding", "GPT", "GPTConfig", "gpt2_small",
    "padded_vocabulary", "functional",
]
functional = F


class Parameter(Tensor):
    """A leaf that requires grad and belongs to a module: its gradient accumulates until zero_grad()."""

    def __init__(self, data, requires_grad: bool = True):
        if not isinstance(data, Tensor):
            from . import tensor
            data = tensor(data)
        super().__init__(data, True)
        if not requires_grad:
            self.requires_grad = False

    def __repr__(self):
        return "Parameter(" + super().__repr__() + ")"


def _param(t):
    return None if t is None else Parameter(t)


class Module:
    """Base class of models and layers (PyTorch's nn.Module surface)."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- registration --
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call Module.__init__() (super().__init__()) before assigning attributes")
        for table in (self._parameters, self._buffers, self._modules):
            if name in table and not (table is self._buffers and isinstance(value, Tensor)):
                del table[name]
        if isinstance(value, Tensor) and value.is_parameter:
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif name in self._buffers:
            self._buffers[name] = value
        elif value is None and name in ("bias", "weight"):
            self._parameters[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param):
        if param is not None and not (isinstance(param, Tensor) and param.is_parameter):
            raise _core.ValueError(f"register_parameter('{name}'): expected a Parameter, got {type(param).__name__}")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor):
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer('{name}'): expected a dyngrad Tensor, got {type(tensor).__name__}")
        self._buffers[name] = tensor

    def add_module(self, name: str, module):
        if not isinstance(module, Module):
            raise TypeError(f"add_module('{name}'): expected a Module, got {type(module).__name__}")
        self._modules[name] = module

    # -- traversal --
    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(prefix + name if not prefix else f"{prefix}.{name}")

    def modules(self):
        return [m for _, m in self.named_modules()]

    def children(self):
        return list(self._modules.values())

    def named_parameters(self, prefix: str = ""):
        seen = set()
        for mod_prefix, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                full = f"{mod_prefix}.{name}" if mod_prefix else name
                if p.name != full:
                    p.name = full  # error messages and lint name parameters by their path
                yield full, p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = ""):
        for mod_prefix, module in self.named_modules(prefix):
            for name, b in module._buffers.items():
                if b is not None:
                    yield (f"{mod_prefix}.{name}" if mod_prefix else name), b

    def buffers(self):
        return [b for _, b in self.named_buffers()]

    # -- modes and devices --
    def train(self, mode: bool = True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def to(self, target):
        """Moves (or converts) every parameter and buffer in place; parameters keep their identity."""
        if not isinstance(target, _core.dtype):
            target = _core.device(str(target))
        for t in list(self.parameters()) + self.buffers():
            _core._param_to(t, target)
        return self

    def cuda(self, device: int = 0):
        return self.to(f"cuda:{device}")

    # Mixed precision casts every floating parameter and buffer, as torch.nn.Module's (int64 ones stay).
    def _cast_floating(self, dtype):
        floating = (_core.float32, _core.float64, _core.bfloat16, _core.float16)
        for t in list(self.parameters()) + self.buffers():
            if t.dtype in floating and t.dtype != dtype:
                _core._param_to(t, dtype)
        return self

    def half(self):
        return self._cast_floating(_core.float16)

    def bfloat16(self):
        return self._cast_floating(_core.bfloat16)

    def float(self):
        return self._cast_floating(_core.float32)

    def double(self):
        return self._cast_floating(_core.float64)

    def apply(self, fn):
        """Calls fn(module) on every submodule (children first) and on self, as torch.nn.Module.apply; returns self."""
        for child in self._modules.values():
            child.apply(fn)
        fn(self)
        return self

    def cpu(self):
        return self.to("cpu")

    # -- state --
    def state_dict(self) -> "OrderedDict[str, Tensor]":
        state = OrderedDict(self.named_parameters())
        state.update(self.named_buffers())
        return state

    def load_state_dict(self, state: dict, strict: bool = True):
        """Copies tensors into the parameters and buffers; checks names and shapes before changing anything."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise _core.ValueError(f"load_state_dict: missing entries {missing}, unexpected entries {unexpected}")
        for name, target in own.items():
            if name not in state:
                continue
            source = state[name]
            if not isinstance(source, Tensor):
                from . import tensor
                source = tensor(source, dtype=target.dtype)
            if tuple(source.shape) != tuple(target.shape):
                raise _core.ShapeError(f"load_state_dict: '{name}' has shape {tuple(source.shape)} in the state, "
                                       f"{tuple(target.shape)} in the model")
        for name, target in own.items():
            if name in state:
                source = state[name]
                if not isinstance(source, Tensor):
                    from . import tensor
                    source = tensor(source, dtype=target.dtype)
                target._write_(source)  # checked above; a parameter's own write, as PyTorch's under no_grad
        return missing, unexpected

    def save(self, path):
        """The state_dict as a safetensors file (what dyngrad-train and PyTorch's safetensors read)."""
        _core.save_safetensors(str(path), dict(self.state_dict()))

    def load(self, path):
        tensors, _ = _core.load_safetensors(str(path))
        self.load_state_dict(tensors)
        return self

    # -- calling --
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_repr}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


def _int(who, name, value):
    """An int argument as PyTorch takes it: an int or anything with __index__ (a NumPy integer), never a str
    or a float (``Linear('4', 3)`` must not build a layer whose in_features is the string '4')."""
    try:
        return _operator.index(value)
    except TypeError:
        raise TypeError(f"{who}(): argument '{name}' must be an int, not {type(value).__name__}") from None


def _float(who, name, value):
    """A float argument: a real number (an int or a NumPy float too), never a str (float('0.1') would parse it)."""
    if isinstance(value, _numbers.Real):
        return float(value)
    raise TypeError(f"{who}(): argument '{name}' must be a float, not {type(value).__name__}")


def _ints(who, name, value):
    """An int or a sequence of ints (a NumPy array too), as a list of ints; a str is neither."""
    if not isinstance(value, (str, bytes)):
        try:
            return [_operator.index(value)]
        except TypeError:
            pass
        try:
            items = list(value)
        except TypeError:
            items = None
        if items is not None:
            return [_int(who, name, v) for v in items]
    raise TypeError(f"{who}(): argument '{name}' must be an int or a sequence of ints, not {type(value).__name__}")


def _pair(v, who="conv2d", name="kernel_size"):
    try:
        one = _operator.index(v)
        return (one, one)
    except TypeError:
        return tuple(_ints(who, name, v))


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


class BatchNorm2d(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        num_features = _int("BatchNorm", "num_features", num_features)
        eps, momentum = _float("BatchNorm", "eps", eps), _float("BatchNorm", "momentum", momentum)
        w, b, mean, var = _core._batch_norm_init(num_features)
        self.weight, self.bias = Parameter(w), Parameter(b)
        self.register_buffer("running_mean", mean)
        self.register_buffer("running_var", var)
        self.eps, self.momentum = eps, momentum

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                            self.momentum, self.eps)


BatchNorm1d = BatchNorm2d


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = _ints("LayerNorm", "normalized_shape", normalized_shape)
        eps = _float("LayerNorm", "eps", eps)
        w, b = _core._layer_norm_init(shape, elementwise_affine, bias)
        self.weight, self.bias = _param(w), _param(b)
        self.normalized_shape, self.eps = tuple(shape), eps

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        shape = _ints("RMSNorm", "normalized_shape", normalized_shape)
        eps = None if eps is None else _float("RMSNorm", "eps", eps)
        self.weight = _param(_core._rms_norm_init(shape, elementwise_affine))
        self.normalized_shape, self.eps = tuple(shape), eps

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


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


class Sequential(Module):
    """Layers applied in order; Sequential(a, b) names them "0", "1"; Sequential(OrderedDict) by its keys."""

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (dict, OrderedDict)):
            for name, layer in layers[0].items():
                self.add_module(str(name), layer)
        else:
            for i, layer in enumerate(layers):
                self.add_module(str(i), layer)

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    __getitem__, __len__, __iter__ = Sequential.__getitem__, Sequential.__len__, Sequential.__iter__

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self


class CrossEntropyLoss(Module):
    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.weight, self.ignore_index, self.reduction, self.label_smoothing = weight, ignore_index, reduction, label_smoothing

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class MSELoss(Module):
    def forward(self, prediction, target):
        return F.mse_loss(prediction, target)


# The transformer layers are nn/transformer.h's C++ layers (dyngrad/transformer.py); imported last, they
# subclass Module.
from .transformer import (GPT, GPTConfig, MultiheadAttention, PositionalEmbedding, TransformerBlock,  # noqa: E402
                          gpt2_small, padded_vocabulary)


# torch.nn.utils' gradient clipping (the same functions as dyngrad.optim's), for code that spells them
# torch.nn.utils.clip_grad_norm_(...).
utils = _types.SimpleNamespace(clip_grad_norm_=_core.clip_grad_norm_, clip_grad_value_=_core.clip_grad_value_)
