"""dyngrad.autograd.functional: vjp, jvp, hvp, jacobian and hessian of a Python function of tensors, as
torch.autograd.functional, built on dyngrad.autograd.grad (with create_graph=True where a derivative is
differentiated again). jvp uses the double-vjp trick: J·v = d/du <J^T u, v> at any u (here u = 0), two
reverse passes instead of a forward mode. jacobian and hessian loop over output elements: for small inputs.

Each function takes ``func`` (tensors -> tensor, or a tuple of tensors for jacobian's outputs) and ``inputs`` (a
tensor or a tuple of tensors); the inputs are entered as fresh leaves that require grad (sharing storage), so
the caller's tensors and their .grad are untouched. Results mirror the shape of ``inputs``: a tensor for a
tensor, a tuple for a tuple.
"""
from __future__ import annotations

from . import _core
from ._core import Tensor

__all__ = ["vjp", "jvp", "hvp", "jacobian", "hessian"]


def _grad(outputs, inputs, grad_outputs=None, create_graph=False):
    from .autograd import grad
    return grad(outputs, inputs, grad_outputs=grad_outputs, retain_graph=True, create_graph=create_graph,
                allow_unused=True)


def _leaves(inputs):
    single = isinstance(inputs, Tensor)
    seq = [inputs] if single else list(inputs)
    for i, t in enumerate(seq):
        if not isinstance(t, Tensor):
            raise TypeError(f"autograd.functional: inputs[{i}] must be a dyngrad.Tensor, got {type(t).__name__}")
    return single, [Tensor(t.detach(), True) for t in seq]


def _shaped(single, values):
    return values[0] if single else tuple(values)


def _zeros_for(grads, leaves):
    return [g if g is not None else _core.zeros(*x.shape, dtype=x.dtype, device=x.device)
            for g, x in zip(grads, leaves)]


def _detached(t):
    return t.detach() if isinstance(t, Tensor) else t


def vjp(func, inputs, v=None, create_graph=False):
    """(func(inputs), v^T·J): the vector-Jacobian product; v may be omitted for a one-element output."""
    single, leaves = _leaves(inputs)
    out = func(*leaves)
    grads = _zeros_for(_grad([out], leaves, None if v is None else [v], create_graph), leaves)
    if not create_graph:
        out, grads = out.detach(), [g.detach() for g in grads]
    return out, _shaped(single, grads)


def jvp(func, inputs, v, create_graph=False):
    """(func(inputs), J·v) by the double-vjp trick: g(u) = J^T u is linear in u, and d<g(u), v>/du = J v."""
    single, leaves = _leaves(inputs)
    vs = [v] if single else list(v)
    out = func(*leaves)
    u = Tensor(_core.zeros(*out.shape, dtype=out.dtype, device=out.device), True)
    g = _grad([out], leaves, [u], create_graph=True)
    terms = [(gi * vi).sum() for gi, vi in zip(g, vs) if gi is not None and gi.requires_grad]
    if not terms:  # J^T u does not depend on u: func does not depend on the inputs
        result = _core.zeros(*out.shape, dtype=out.dtype, device=out.device)
    else:
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        (result,) = _grad([total], [u], create_graph=create_graph)
        if result is None:
            result = _core.zeros(*out.shape, dtype=out.dtype, device=out.device)
    if not create_graph:
        out, result = out.detach(), _detached(result)
    return out, result


def hvp(func, inputs, v, create_graph=False):
    """(func(inputs), H·v) for a scalar func: the gradient of <∇func, v>."""
    single, leaves = _leaves(inputs)
    vs = [v] if single else list(v)
    out = func(*leaves)
    if out.numel() != 1:
        raise _core.ValueError(f"autograd.functional.hvp: func must return one element, got shape {tuple(out.shape)}")
    g = _grad([out], leaves, create_graph=True)
    terms = [(gi * vi).sum() for gi, vi in zip(g, vs) if gi is not None and gi.requires_grad]
    if not terms:
        result = _zeros_for([None] * len(leaves), leaves)
    else:
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        result = _zeros_for(_grad([total], leaves, create_graph=create_graph), leaves)
    if not create_graph:
        out, result = out.detach(), [r.detach() for r in result]
    return out, _shaped(single, result)


def _jacobian_rows(out, leaves, create_graph):
    # One vjp per output element with a one-hot v: row k of J for every input, reshaped to out.shape + in.shape.
    n = out.numel()
    flat = out.reshape(n)
    rows = [[] for _ in leaves]
    for k in range(n):
        g = _zeros_for(_grad([flat[k]], leaves, create_graph=create_graph), leaves)
        for i, gi in enumerate(g):
            rows[i].append(gi if create_graph else gi.detach())
    from .factories import stack
    return [stack(r, 0).reshape(*(list(out.shape) + list(x.shape))) for r, x in zip(rows, leaves)]


def jacobian(func, inputs, create_graph=False):
    """J[i] of shape func(inputs).shape + inputs[i].shape (a tensor for a tensor input)."""
    single, leaves = _leaves(inputs)
    out = func(*leaves)
    return _shaped(single, _jacobian_rows(out, leaves, create_graph))


def hessian(func, inputs, create_graph=False):
    """H[i][j] of shape inputs[i].shape + inputs[j].shape for a scalar func (a tensor for a tensor input)."""
    single, leaves = _leaves(inputs)
    out = func(*leaves)
    if out.numel() != 1:
        raise _core.ValueError(f"autograd.functional.hessian: func must return one element, got shape "
                               f"{tuple(out.shape)}")
    grads = _zeros_for(_grad([out], leaves, create_graph=True), leaves)
    blocks = []
    for gi in grads:
        if not gi.requires_grad:  # a gradient that is constant in every input: zero blocks
            blocks.append([_core.zeros(*(list(gi.shape) + list(x.shape)), dtype=x.dtype, device=x.device)
                           for x in leaves])
            continue
        blocks.append(_jacobian_rows(gi, leaves, create_graph))
    if single:
        return blocks[0][0]
    return tuple(tuple(row) for row in blocks)
