"""Every op of dyngrad's op table, generated from the table itself (so a new op appears without a change here).

``dyngrad.ops.<name>(*inputs, **attrs)`` records (or runs eagerly) the op ``name`` with the attributes its
op-table row reads as keywords (the field table of graph/op_def.h: ``axis``/``dim``, ``axes``/``dims``,
``keepdim``, ``scalar``, ``shape``, ``min``/``max`` (clamp), ``stride``, ``padding``, ``dilation``, ``groups``,
``kernel``, ``training``, ``eps``, ``momentum``, ``seed``, ``reduction``, ``ignore_index``, ``label_smoothing``,
``activation``, ``approximate``, ``start``, ``length``, ``padding_idx``, ``mode``, ``hidden_size``,
``num_layers``, ``bidirectional``, ``descending``/``largest``, ``replacement``, ``k``/``num_samples`` (argsort,
topk_indices, multinomial), and for attention ``is_causal``, ``scale`` and ``dropout_p`` (with ``seed``)).
An optional input may be None (left out); the row's argument rule (ops/argument_rules.h), the one the C++ front doors
run, fills in what depends on the inputs: rms_norm's eps when not given, layer_norm's weight for a bias alone, the
bce weight for a pos_weight alone, pooling's stride when not given (the kernel size), embedding's padding_idx counted
from the weight's rows when negative. A keyword given as None is its default, as if not given.
A keyword the op does not read is a TypeError naming the op, the keyword and the keywords it takes;
``dyngrad-verify --list`` shows each op's keywords.
The friendlier, PyTorch-shaped functions are in dyngrad.functional.
"""
from __future__ import annotations

from . import _core

#: name -> (op index, arity, optional inputs, differentiable), from the C++ op table
TABLE = {name: (index, arity, optional, differentiable)
         for name, index, arity, optional, differentiable in _core.op_table()}


def _make(name: str, index: int, arity: int, optional: int):
    apply = _core.apply
    if arity == 1 and optional == 0:
        def op(x, **attrs):
            return apply(index, [x], attrs)
    elif arity == 2 and optional == 0:
        def op(a, b, **attrs):
            return apply(index, [a, b], attrs)
    else:
        def op(*inputs, **attrs):
            if arity == -1 and len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
                inputs = tuple(inputs[0])
            return apply(index, list(inputs), attrs)
    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"The '{name}' op of dyngrad's op table ({'variadic' if arity == -1 else arity} inputs" + \
        (f", the last {optional} optional" if optional else "") + ")."
    return op


for _name, (_index, _arity, _optional, _diff) in TABLE.items():
    globals()[_name] = _make(_name, _index, _arity, _optional)

__all__ = sorted(TABLE)
