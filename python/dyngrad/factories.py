"""Top-level tensor functions as torch's: cat, stack, where, zeros_like ... full_like, linspace, randint.

cat/stack/where are the op table's concat/where (through dyngrad.functional); the *_like factories are the
C++ factories with the other tensor's shape, dtype and device; linspace and randint are C++ (src/autograd.cpp),
randint drawing from ``dyngrad.manual_seed``'s generator.
"""
from __future__ import annotations

from . import _core, functional as _F
from ._args import check_ints, check_numbers

__all__ = ["cat", "concat", "stack", "where", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
           "empty_like", "linspace", "randint"]


def cat(tensors, dim: int = 0):
    return _F.cat(tensors, dim)


concat = cat


def stack(tensors, dim: int = 0):
    return _F.stack(tensors, dim)


def where(condition, input, other):  # noqa: A002  (torch's names)
    """condition ? input : other, elementwise with broadcasting (condition: nonzero = true)."""
    return _F.where(condition, input, other)


def _like_factory(name, make):
    def like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002  (torch's names)
        if not isinstance(input, _core.Tensor):
            raise TypeError(f"{name}: input must be a dyngrad.Tensor, got {type(input).__name__}")
        t = make(input.shape, dtype=input.dtype if dtype is None else dtype,
                 device=input.device if device is None else device)
        if requires_grad:
            t.requires_grad = True
        return t
    like.__name__ = like.__qualname__ = name
    like.__doc__ = f"{name}(input): as torch.{name}, with input's shape, dtype and device unless given."
    return like


zeros_like = _like_factory("zeros_like", _core.zeros)
ones_like = _like_factory("ones_like", _core.ones)
rand_like = _like_factory("rand_like", _core.rand)
randn_like = _like_factory("randn_like", _core.randn)
empty_like = zeros_like  # dyngrad has no uninitialised factory in Python: zeros


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _like_factory("full_like", lambda shape, **kw: _core.full(shape, fill_value, **kw))(
        input, dtype=dtype, device=device, requires_grad=requires_grad)


def linspace(start, end, steps, *, dtype=None, device=None):
    """``steps`` values from start to end inclusive (float32 unless dtype says otherwise)."""
    check_numbers("linspace", start=start, end=end)
    check_ints("linspace", steps=steps)
    return _core.linspace(float(start), float(end), steps, dtype=dtype, device=device)


def randint(low, high=None, size=None, *, dtype=None, device=None):
    """int64 values uniform in [low, high): ``randint(high, size)`` or ``randint(low, high, size)``, as torch."""
    if size is None:  # randint(high, size)
        if high is None:
            raise TypeError("randint: expects (high, size) or (low, high, size)")
        low, high, size = 0, low, high
    if isinstance(size, int):
        raise TypeError("randint: size must be a tuple of ints, e.g. (3,) (as torch.randint)")
    check_ints("randint", low=low, high=high)
    check_ints("randint", **{f"size[{i}]": d for i, d in enumerate(size)})
    if dtype is not None and dtype != _core.int64:
        raise _core.DTypeError(f"randint: dtype must be int64, got {dtype}")
    return _core.randint(int(low), int(high), list(size), device)
