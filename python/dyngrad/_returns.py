"""PyTorch's return types for the ops that give values and their indices (torch.return_types): tuples that unpack
as ``values, indices = x.topk(3)`` and name both fields (``r.values``, ``r.indices``). One type per op, so the
repr says which op made it, as PyTorch's does; max and min with a dim share them (dyngrad.functional.max)."""
from __future__ import annotations

from collections import namedtuple

sort = namedtuple("sort", ["values", "indices"])
topk = namedtuple("topk", ["values", "indices"])
max = namedtuple("max", ["values", "indices"])  # noqa: A001
min = namedtuple("min", ["values", "indices"])  # noqa: A001

__all__ = ["sort", "topk", "max", "min"]
