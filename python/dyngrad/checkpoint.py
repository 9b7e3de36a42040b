"""dyngrad.utils.checkpoint.checkpoint (this module, dyngrad.checkpoint): activation checkpointing, as torch.utils.checkpoint.checkpoint.

``checkpoint(function, *args, **kwargs)`` runs ``function(*args, **kwargs)`` as a segment whose intermediate values
are not kept: the engine replays the segment's recorded ops when the backward reaches it (graph/checkpoint.h), so
dropout draws the recorded masks, autocast's recorded casts run again, and the gradients are those of the plain
call, bit for bit on the CPU when the inputs feed nothing outside the segment (otherwise, and at second order, up to
the grouping of float sums). It composes with ``create_graph=True`` (second order through the segment) and with
captured steps (the replay allocates and synchronises no more than the forward did).

Differences from PyTorch: the replay re-runs the recorded ops, not ``function``, so Python side effects in it
happen once; ``use_reentrant``, ``preserve_rng_state`` and ``determinism_check`` are accepted and have nothing to
choose (the replay is always the recorded computation); ``context_fn`` is not supported.
"""
from __future__ import annotations

from . import _core
from ._core import Tensor

__all__ = ["checkpoint", "CheckpointError"]

# A checkpoint call that cannot work (nothing differentiable comes out, no tensor goes in): a GraphError.
CheckpointError = _core.GraphError


def checkpoint(function, *args, use_reentrant=None, context_fn=None, determinism_check="default", debug=False,
               preserve_rng_state=True, **kwargs):
    """Returns ``function(*args, **kwargs)`` (a Tensor, or a tuple or list of Tensors) computed as a checkpointed
    segment. The Tensor positional arguments are the segment's inputs; other arguments pass through."""
    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    if context_fn is not None:
        raise NotImplementedError("checkpoint: context_fn is not supported (the replay runs the recorded ops)")
    for name, value in (("use_reentrant", use_reentrant), ("preserve_rng_state", preserve_rng_state),
                        ("debug", debug)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"checkpoint: {name} must be a bool, got {type(value).__name__}")
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    if not _core.is_grad_enabled():
        return function(*args, **kwargs)  # nothing is recorded, so there is nothing to keep or replay
    if not positions:
        raise CheckpointError("checkpoint: no Tensor argument; the segment needs at least one input tensor")
    shape = {}

    def segment(*entered):
        full = list(args)
        for position, tensor in zip(positions, entered):
            full[position] = tensor
        out = function(*full, **kwargs)
        if isinstance(out, Tensor):
            shape["kind"] = None
            return [out]
        if isinstance(out, (tuple, list)) and out and all(isinstance(t, Tensor) for t in out):
            shape["kind"] = type(out)
            return list(out)
        raise TypeError("checkpoint: the function must return a Tensor or a non-empty tuple or list of Tensors, "
                        f"got {type(out).__name__}")

    outputs = _core._checkpoint(segment, [args[i] for i in positions])
    return outputs[0] if shape["kind"] is None else shape["kind"](outputs)
