"""Tensor methods written over the op table (the operators, indexing and conversions are in C++)."""
from __future__ import annotations

import numpy as _np

from . import _core, functional as F, ops
from ._core import Tensor


def _unsqueeze(self, dim):
    shape = list(self.shape)
    if dim < 0:
        dim += len(shape) + 1
    if not 0 <= dim <= len(shape):
        raise _core.IndexError(f"unsqueeze: dim {dim} is out of range for a tensor of rank {len(shape)}")
    return self.reshape(shape[:dim] + [1] + shape[dim:])


def _squeeze(self, dim=None):
    shape = list(self.shape)
    if dim is None:
        return self.reshape([d for d in shape if d != 1])
    if dim < 0:
        dim += len(shape)
    if not 0 <= dim < len(shape):
        raise _core.IndexError(f"squeeze: dim {dim} is out of range for a tensor of rank {len(shape)}")
    if shape[dim] != 1:
        return self
    return self.reshape(shape[:dim] + shape[dim + 1:])


def _flatten(self, start_dim=0, end_dim=-1):
    shape = list(self.shape)
    if not shape:
        return self.reshape([1])
    n = len(shape)
    start, end = start_dim % n, end_dim % n
    merged = 1
    for d in shape[start:end + 1]:
        merged *= d
    return self.reshape(shape[:start] + [merged] + shape[end + 1:])


def _array(self, dtype=None, copy=None):
    array = self.cpu().numpy() if self.device.type != "cpu" else self.numpy()
    return array if dtype is None else array.astype(dtype, copy=False)


def _tolist(self):
    return self.cpu().numpy().tolist()


def _requires_grad_(self, requires_grad=True):
    self.requires_grad = requires_grad
    return self


def _split(self, split_size_or_sections, dim=0):
    """torch.Tensor.split: pieces of split_size along dim (the last one smaller), or of the sizes listed."""
    length = self.shape[dim]
    if isinstance(split_size_or_sections, int):
        if split_size_or_sections <= 0:
            raise _core.ValueError(f"split: split_size must be positive, got {split_size_or_sections}")
        sizes = [min(split_size_or_sections, length - s) for s in range(0, length, split_size_or_sections)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != length:
            raise _core.ValueError(f"split: sections {sizes} do not add up to dim {dim}'s size {length}")
    pieces, start = [], 0
    for size in sizes:
        pieces.append(F.narrow(self, dim, start, size))
        start += size
    return tuple(pieces)


def _chunk(self, chunks, dim=0):
    """torch.Tensor.chunk: at most ``chunks`` pieces of ceil(size / chunks) along dim."""
    if not isinstance(chunks, int) or chunks <= 0:
        raise _core.ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    return _split(self, max(1, -(-self.shape[dim] // chunks)), dim)


_FLOATING = (_core.float32, _core.float64, _core.bfloat16, _core.float16)


def _cast_to(dtype):
    """x.float()/.double()/.half()/.bfloat16(): the table's cast op when x requires grad (differentiable, as
    PyTorch's: the gradient flows back in x's dtype), a plain conversion otherwise."""
    def method(self):
        if self.dtype == dtype:
            return self
        if self.requires_grad and self.dtype in _FLOATING:
            return ops.cast(self, dtype=dtype)
        return self.to(dtype)
    return method


_METHODS = {
    "sum": F.sum, "mean": F.mean, "max": F.max, "min": F.min, "argmax": F.argmax, "argmin": F.argmin,
    "relu": F.relu, "sigmoid": F.sigmoid, "tanh": F.tanh, "exp": F.exp, "log": F.log, "sqrt": F.sqrt,
    "abs": F.abs, "sin": F.sin, "cos": F.cos, "clamp": F.clamp, "pow": F.pow,
    "softmax": F.softmax, "log_softmax": F.log_softmax,
    "matmul": F.matmul, "transpose": F.transpose, "permute": F.permute, "expand": F.expand, "narrow": F.narrow,
    "flatten": _flatten, "split": _split, "chunk": _chunk, "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "masked_fill": F.masked_fill, "gather": F.gather, "index_select": F.index_select,
    "cumsum": F.cumsum, "sort": F.sort, "argsort": F.argsort, "topk": F.topk, "multinomial": F.multinomial,
    "__array__": _array, "tolist": _tolist, "requires_grad_": _requires_grad_,
    "cpu": lambda self: self.to("cpu"),
    "cuda": lambda self, device=0: self.to(f"cuda:{device}" if isinstance(device, int) else str(device)),
    "float": _cast_to(_core.float32),
    "double": _cast_to(_core.float64),
    "long": lambda self: self.to(_core.int64),
    "half": _cast_to(_core.float16),
    "bfloat16": _cast_to(_core.bfloat16),
    "t": lambda self: F.transpose(self, 0, 1),
}
for _name, _fn in _METHODS.items():
    setattr(Tensor, _name, _fn)
Tensor.T = property(lambda self: F.transpose(self, -2, -1) if len(self.shape) >= 2 else self)
Tensor.__array_priority__ = 1000  # numpy_scalar * tensor goes to Tensor.__rmul__
del _np
