"""dyngrad.cuda: the device queries of torch.cuda, and captured training steps (CUDA graphs, cuda/capture.h).

    step = dg.cuda.CapturedStep(train_step)      # or @dg.cuda.captured_step above the function
    for x, y in loader:                            # CUDA tensors of fixed shapes
        loss = step(x, y)                          # 1st call eager (warm-up), 2nd captures, then replays

``train_step(*tensors) -> Tensor`` runs the forward, ``loss.backward()``, ``opt.step()`` and ``opt.zero_grad()``
and returns a tensor (e.g. ``loss.detach()``). Each distinct key of the inputs' shapes, dtypes and device is a
variant of its own (warm-up, capture, replay). torch spells this ``torch.cuda.make_graphed_callables`` /
``torch.cuda.graph``; docs/python.md, "Captured steps", lists the differences. On a build without CUDA (or with
CPU tensors) ``run`` raises DeviceError; construction only checks the arguments, as the C++ class does.
"""
from __future__ import annotations

from . import _core

__all__ = ["CapturedStep", "captured_step", "is_available", "is_compiled", "device_count", "synchronize"]

CapturedStep = _core.CapturedStep


def captured_step(fn=None, *, guard_replays: int = 0, guard_state=None):
    """Decorator form: ``@dg.cuda.captured_step`` (or ``@dg.cuda.captured_step(guard_replays=2, guard_state=f)``)
    turns a step function into a CapturedStep."""
    if fn is None:
        return lambda f: CapturedStep(f, guard_replays=guard_replays, guard_state=guard_state)
    return CapturedStep(fn, guard_replays=guard_replays, guard_state=guard_state)


def is_available() -> bool:
    """A CUDA build with at least one device."""
    return _core.cuda_is_available()


def is_compiled() -> bool:
    """This dyngrad was built with its CUDA backend (devices may still be absent)."""
    return _core.cuda_compiled()


def device_count() -> int:
    return _core.cuda_device_count()


def synchronize(device=None) -> None:
    """Waits for dyngrad's queued work on ``device`` (default cuda:0). DeviceError on a build without CUDA."""
    if device is None:
        index = 0
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        index = _core.device(str(device)).index
    _core.cuda_synchronize(index)
