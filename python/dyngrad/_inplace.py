"""In-place writes, index assignment and boolean-mask indexing, with PyTorch's semantics (docs/python.md,
"In-place operations, index assignment and masks").

- A write into a tensor that records nothing (no input requires grad, or under no_grad()) goes into its storage
  (``Tensor._write_``), which bumps the storage's version: a recorded backward that still needs the old values
  then raises GraphError naming the op (the engine's version counter, docs/architecture.md).
- A write that must be recorded (grad enabled and self or the other operand requires grad) is recorded as the
  out-of-place op and this object then stands for its result (``Tensor._rebind``): the old node keeps its value,
  so the backward is exact; only other views of the old storage (``.numpy()``, ``reshape``) keep the old values.
- A leaf that requires grad refuses in-place writes while grad mode is on (PyTorch's RuntimeError), as GraphError.
- A mask is a NumPy bool array, a list of Python bools, or a dyngrad tensor marked as a mask: the result of a
  comparison, or ``t.bool()``. Any other tensor index keeps meaning gather-by-index (int64, 1-D).
"""
from __future__ import annotations

import numpy as _np

from . import _core, functional as F, ops
from ._core import Tensor

_cpp_getitem = Tensor.__getitem__  # ints, slices, None, ..., 1-D int64 index tensors (python/src/tensor.cpp)


# ---- masks and index keys ----

def _is_mask(item):
    if isinstance(item, Tensor):
        return item._is_mask
    if isinstance(item, _np.ndarray):
        return item.dtype == _np.bool_
    if isinstance(item, list) and item:
        return _np.asarray(item).dtype == _np.bool_
    return False


def _check_host_read(t, who):
    """A data-dependent count is read on the host (a device sync); a captured CUDA step cannot do that."""
    if t.device.type == "cuda" and _core._capturing(t.device.index):
        raise _core.GraphError(f"{who}: a boolean mask's count of selected elements is read on the host (a device "
                               f"synchronisation), which a captured CUDA step cannot do; use where() or masked_fill()")


def _mask_array(item, who):
    if isinstance(item, Tensor):
        _check_host_read(item, who)
        values = _np.asarray(item)
        if not _np.isin(values, (0, 1)).all():
            raise _core.ValueError(f"{who}: a mask holds only 0 and 1, got other values")
        return values != 0
    return _np.asarray(item, dtype=_np.bool_)


def _numpy_key(x, key, who):
    """`key` with masks as NumPy bool arrays and index tensors as NumPy int arrays, checked against x's shape."""
    # each mask read once (from a device: one copy to the host)
    items = [(_mask_array(item, who) if _is_mask(item) else item)
             for item in (key if isinstance(key, tuple) else (key,))]
    shape = tuple(x.shape)

    def dims(item):
        if item is None or item is Ellipsis or isinstance(item, (bool, _np.bool_)):
            return 0
        return item.ndim if _is_mask(item) else 1

    consumed = sum(dims(item) for item in items)
    if consumed > len(shape):
        raise _core.IndexError(f"{who}: too many indices for a tensor of rank {len(shape)}: {consumed} given")
    out, axis = [], 0
    for item in items:
        if item is Ellipsis:
            axis += len(shape) - consumed
        elif _is_mask(item):
            mask = item
            if mask.shape != shape[axis:axis + mask.ndim]:
                raise _core.ShapeError(f"{who}: the mask's shape {mask.shape} does not match the indexed tensor's "
                                       f"shape {shape} at dims {axis}..{axis + mask.ndim - 1} (PyTorch's rule: a mask "
                                       f"covers as many dims as it has, from where it stands)")
            item, axis = mask, axis + mask.ndim
        elif isinstance(item, Tensor):
            if item.dtype != _core.int64:
                raise _core.IndexError(f"{who}: a tensor index must be int64 or a mask (a comparison's result or "
                                       f"t.bool()), got {item.dtype}")
            item, axis = _np.asarray(item), axis + 1
        elif item is not None and not isinstance(item, (bool, _np.bool_)):
            if not (isinstance(item, slice) or hasattr(item, "__index__")):
                raise TypeError(f"{who}: tensor indices must be ints, slices, None, ..., int64 tensors or masks, "
                                f"got {type(item).__name__}")
            axis += 1
        out.append(item)
    return tuple(out)


def _positions(x, key, who):
    """The flat positions x[key] reads, shaped as its result (NumPy's indexing rules, which are PyTorch's)."""
    grid = _np.arange(x.numel(), dtype=_np.int64).reshape(tuple(x.shape))
    try:
        return grid[_numpy_key(x, key, who)]
    except IndexError as e:  # NumPy's own bounds message, as dyngrad's typed error
        raise _core.IndexError(f"{who}: {e}") from None


def _index_tensor(positions, device):
    return _core._from_numpy_copy(_np.ascontiguousarray(positions.reshape(-1), dtype=_np.int64), device)


def _getitem(self, key):
    if not (any(_is_mask(k) for k in key) if isinstance(key, tuple) else _is_mask(key)):
        return _cpp_getitem(self, key)
    positions = _positions(self, key, "x[mask]")
    flat = self.reshape(-1)
    if positions.size == 0:
        return F.narrow(flat, 0, 0, 0).reshape(positions.shape)
    # a gather by the positions: differentiable, its backward scatters the gradient back (zeros elsewhere)
    return ops.index_select(flat, _index_tensor(positions, self.device), axis=0).reshape(positions.shape)


def masked_select(x, mask):
    """torch.masked_select: the elements of x where the mask (a mask as above, or any tensor of 0/1 values) is
    set, 1-D in row-major order; the mask broadcasts to x's shape."""
    if not isinstance(x, Tensor):
        raise TypeError(f"masked_select(): argument 'input' must be a dyngrad.Tensor, not {type(x).__name__}")
    array = _mask_array(mask, "masked_select()")
    try:
        array = _np.broadcast_to(array, tuple(x.shape))
    except ValueError:
        raise _core.ShapeError(f"masked_select(): the mask's shape {array.shape} does not broadcast to the input's "
                               f"shape {tuple(x.shape)}") from None
    return _getitem(x, array) if x.numel() else x.reshape(-1)


# ---- in-place writes ----

def _guard(self, who):
    if self.requires_grad and self.is_leaf and _core.is_grad_enabled():
        raise _core.GraphError(f"{who}: a leaf Variable that requires grad is being used in an in-place operation "
                               f"(update it under dyngrad.no_grad(), as an optimizer step does)")


def _records(*tensors):
    return _core.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _commit(self, result, who):
    if tuple(result.shape) != tuple(self.shape):
        raise _core.ShapeError(f"{who}: output with shape {tuple(self.shape)} doesn't match the broadcast shape "
                               f"{tuple(result.shape)}")
    if result.requires_grad and not result.is_leaf:
        self._rebind(result if result.dtype == self.dtype else ops.cast(result, dtype=self.dtype))
    else:
        self._write_(result)
    return self


def _numpy_inplace(self, other, fn, who):
    """int64 tensors (no int64 arithmetic in the engine): the op in NumPy, refused where PyTorch refuses the
    result type (a float result into int64)."""
    a = _np.asarray(self)
    b = _np.asarray(other) if isinstance(other, Tensor) else other
    out = fn(a, b)
    if not _np.issubdtype(_np.asarray(out).dtype, _np.integer):
        raise _core.DTypeError(f"{who}: result type float can't be cast to the desired output type int64")
    self._write_(_core._from_numpy_copy(_np.ascontiguousarray(_np.broadcast_to(out, a.shape), dtype=_np.int64),
                                        self.device))
    return self


def _arith(who, fn, numpy_fn):
    def method(self, other, *, alpha=1):
        _guard(self, who)
        if alpha != 1:
            other = other * alpha
        if isinstance(other, Tensor) and other.dtype != self.dtype and self.dtype != _core.int64:
            # PyTorch computes in the promoted dtype and casts back; the engine wants one dtype, so the
            # operand is cast first (differentiably when it requires grad)
            other = ops.cast(other, dtype=self.dtype) if _records(other) else other.to(self.dtype)
        if self.dtype == _core.int64 and not _records(self, other):
            return _numpy_inplace(self, other, numpy_fn, who)
        return _commit(self, fn(self, other), who)
    method.__name__ = who.rstrip("()")
    return method


add_ = _arith("add_()", lambda a, b: a + b, _np.add)
sub_ = _arith("sub_()", lambda a, b: a - b, _np.subtract)
mul_ = _arith("mul_()", lambda a, b: a * b, _np.multiply)
div_ = _arith("div_()", lambda a, b: a / b, _np.true_divide)


def clamp_(self, min=None, max=None):  # noqa: A002  (PyTorch's keywords)
    _guard(self, "clamp_()")
    return _commit(self, F.clamp(self, min, max), "clamp_()")


def _setitem(self, key, value, who="x[index] = value"):
    _guard(self, who)
    positions = _positions(self, key, who)
    if positions.size == 0:
        return
    if _records(self, value):
        # recorded: where(selected, value gathered into place, self), differentiable in self and value
        v = value if isinstance(value, Tensor) else _core.full([], float(value), dtype=self.dtype, device=self.device)
        vshape = tuple(v.shape)
        try:
            _np.broadcast_shapes(vshape, positions.shape)
            if len(vshape) > positions.ndim:
                raise ValueError
        except ValueError:
            raise _core.ShapeError(f"{who}: shape mismatch: value of shape {vshape} cannot be broadcast to the indexing "
                                   f"result of shape {positions.shape}") from None
        if v.dtype != self.dtype:
            v = ops.cast(v, dtype=self.dtype) if v.requires_grad else v.to(self.dtype)
        v = F.expand(v.reshape((1,) * (positions.ndim - len(vshape)) + vshape), positions.shape).reshape(-1)
        n = self.numel()
        inverse, hit = _np.zeros(n, _np.int64), _np.zeros(n, _np.float64)
        inverse[positions.reshape(-1)] = _np.arange(positions.size)  # repeated positions: the last one wins
        hit[positions.reshape(-1)] = 1
        placed = ops.index_select(v, _index_tensor(inverse, self.device), axis=0)
        selected = _core._from_numpy_copy(hit, self.device).to(self.dtype)
        _commit(self, F.where(selected, placed, self.reshape(-1)).reshape(tuple(self.shape)), who)
        return
    array = _np.array(self)  # a host copy (one device round trip for a device tensor)
    v = _np.asarray(value) if isinstance(value, Tensor) else value
    try:
        array.reshape(-1)[positions.reshape(-1)] = _np.broadcast_to(v, positions.shape).reshape(-1)
    except ValueError:
        raise _core.ShapeError(f"{who}: shape mismatch: value of shape {_np.shape(v)} cannot be broadcast to the "
                               f"indexing result of shape {positions.shape}") from None
    self._write_(_core._from_numpy_copy(array, self.device))


def fill_(self, value):
    _guard(self, "fill_()")
    if isinstance(value, Tensor) and value.numel() != 1:
        raise _core.ValueError(f"fill_(): value must be a number or a one-element tensor, got shape {tuple(value.shape)}")
    if _records(self, value):
        _setitem(self, Ellipsis, value.reshape([]) if isinstance(value, Tensor) else value, "fill_()")
    else:
        self._write_(_core.full(list(self.shape), float(value), dtype=self.dtype, device=self.device))
    return self


def zero_(self):
    return fill_(self, 0.0)


def copy_(self, src, non_blocking=False):
    _guard(self, "copy_()")
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' must be a dyngrad.Tensor, not {type(src).__name__}")
    if tuple(src.shape) == tuple(self.shape) and not _records(self, src):
        self._write_(src)  # any device and dtype, no host round trip
    else:
        _setitem(self, Ellipsis, src, "copy_()")
    return self


def masked_fill_(self, mask, value):
    _guard(self, "masked_fill_()")
    return _commit(self, masked_fill(self, mask, value), "masked_fill_()")


def masked_fill(x, mask, value):
    """x where the mask is 0, value where it is 1 (the mask broadcasts to x's shape): a dyngrad mask, a NumPy
    bool array, a list of bools, or any tensor of 0/1 values; value a number or a 0-d/1-element tensor."""
    if not isinstance(mask, Tensor):
        mask = _core._from_numpy_copy(_np.ascontiguousarray(_np.asarray(mask, dtype=_np.bool_), dtype=_np.float64),
                                      x.device)
    if mask.dtype != x.dtype:
        mask = mask.to(x.dtype)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise _core.ValueError(f"masked_fill(): value must be a number or a one-element tensor, got shape "
                                   f"{tuple(value.shape)}")
        if value.requires_grad and _core.is_grad_enabled():
            v = value.reshape([]) if value.dtype == x.dtype else ops.cast(value.reshape([]), dtype=x.dtype)
            return F.where(mask, v, x)
        value = float(value)
    return ops.masked_fill(x, mask, scalar=value)


def _bool(self):
    """A mask of where self is nonzero (float 0/1 in self's float dtype, float64 for int64), marked as a mask."""
    zero = _core.full([], 0.0, dtype=self.dtype, device=self.device)
    return self != zero


def _iop(method):
    def inplace(self, other):
        return method(self, other)
    return inplace


def install():
    for name, fn in {"add_": add_, "sub_": sub_, "mul_": mul_, "div_": div_, "clamp_": clamp_, "fill_": fill_,
                     "zero_": zero_, "copy_": copy_, "masked_fill_": masked_fill_, "masked_fill": masked_fill,
                     "masked_select": masked_select, "bool": _bool, "__getitem__": _getitem,
                     "__setitem__": _setitem, "__iadd__": _iop(add_), "__isub__": _iop(sub_),
                     "__imul__": _iop(mul_), "__itruediv__": _iop(div_)}.items():
        setattr(Tensor, name, fn)
