"""Argument checks of the layers' constructors: ints and floats taken as PyTorch takes them, never a str."""
from __future__ import annotations

import numbers as _numbers
import operator as _operator


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
