"""dyngrad.autograd.grad: gradients of outputs with respect to chosen inputs, as torch.autograd.grad.

It runs the engine's backward (graph/graph.h: backward with an explicit grad_output, retain_graph, node
gradients) and reads the inputs' gradients; no ``.grad`` of any tensor changes (every parameter's gradient is
set aside and restored). With ``create_graph=True`` the backward is recorded as ops of the graph
(graph/higher_order.h), so the gradients can be differentiated again; an op that is first-order only (docs/ops.md)
raises HigherOrderNotSupported naming it. ``dyngrad.autograd.functional`` builds vjp, jvp, hvp, jacobian and
hessian on it.
"""
from __future__ import annotations

from . import _core
from ._core import Tensor

__all__ = ["grad", "HigherOrderNotSupported", "functional"]

# create_graph=True through an op without a differentiable backward (or over a released graph): the engine's
# HigherOrderError, a GraphError and a NotImplementedError.
HigherOrderNotSupported = _core.HigherOrderNotSupported


def _as_list(x, what):
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return list(x)
    raise TypeError(f"autograd.grad: {what} must be a Tensor or a sequence of Tensors, got {type(x).__name__}")


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False,
         is_grads_batched=False):
    """Returns a tuple with d(sum of outputs · grad_outputs)/d(input) for each input (None for an unused input
    when allow_unused=True). ``retain_graph`` defaults to ``create_graph`` (False): the graph is released as
    ``backward()`` releases it."""
    if is_grads_batched:
        raise HigherOrderNotSupported("autograd.grad(is_grads_batched=True) is not supported")
    outs = _as_list(outputs, "outputs")
    ins = _as_list(inputs, "inputs")
    for name, seq in (("outputs", outs), ("inputs", ins)):
        for i, t in enumerate(seq):
            if not isinstance(t, Tensor):
                raise TypeError(f"autograd.grad: {name}[{i}] must be a dyngrad.Tensor, got {type(t).__name__}")
    if grad_outputs is None:
        seeds = []
    else:
        seeds = _as_list(grad_outputs, "grad_outputs") if not isinstance(grad_outputs, Tensor) else [grad_outputs]
        for i, g in enumerate(seeds):
            if g is not None and not isinstance(g, Tensor):
                raise TypeError(f"autograd.grad: grad_outputs[{i}] must be a dyngrad.Tensor or None, "
                                f"got {type(g).__name__}")
    retain = bool(create_graph) if retain_graph is None else bool(retain_graph)
    if create_graph:
        return tuple(_core._autograd_grad_create_graph(outs, ins, seeds, retain, bool(allow_unused)))
    return tuple(_core._autograd_grad(outs, ins, seeds, retain, bool(allow_unused)))


from . import functional_ad as functional  # noqa: E402  (needs grad above)
