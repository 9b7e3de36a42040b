"""Module, the base class of models and layers (registration, parameters, modes, devices, state), and Parameter."""
from __future__ import annotations

from collections import OrderedDict

from .. import _core
from .._core import Tensor


class Parameter(Tensor):
    """A leaf that requires grad and belongs to a module: its gradient accumulates until zero_grad()."""

    def __init__(self, data, requires_grad: bool = True):
        if not isinstance(data, Tensor):
            from .. import tensor
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
                from .. import tensor
                source = tensor(source, dtype=target.dtype)
            if tuple(source.shape) != tuple(target.shape):
                raise _core.ShapeError(f"load_state_dict: '{name}' has shape {tuple(source.shape)} in the state, "
                                       f"{tuple(target.shape)} in the model")
        for name, target in own.items():
            if name in state:
                source = state[name]
                if not isinstance(source, Tensor):
                    from .. import tensor
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
