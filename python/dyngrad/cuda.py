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

__all__ = ["CapturedStep", "captured_step", "is_available", "is_compiled", "device_count", "synchronize",
           "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "memory_reserved",
           "set_per_process_memory_fraction", "set_memory_limit", "memory_limit"]

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


def _index(device) -> int:
    """cuda:N's N for None (cuda:0), an int, "cuda:N" or a dyngrad.device."""
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    return _core.device(str(device)).index


def synchronize(device=None) -> None:
    """Waits for dyngrad's queued work on ``device`` (default cuda:0). DeviceError on a build without CUDA."""
    _core.cuda_synchronize(_index(device))


# Memory, as torch.cuda's functions of these names (DeviceError on a build without CUDA). dyngrad counts what its
# own allocator hands out; cuBLAS's and cuDNN's workspaces are outside it (PyTorch's caching allocator holds its
# cuBLAS workspace, so its figures include it).
def memory_allocated(device=None) -> int:
    """Bytes of device memory held by tensors now."""
    return _core.cuda_memory_stats(_index(device))["allocated"]


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated since the start or the last reset_peak_memory_stats."""
    return _core.cuda_memory_stats(_index(device))["peak_allocated"]


def reset_peak_memory_stats(device=None) -> None:
    _core.cuda_reset_peak_memory(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes dyngrad's pool (and captured steps' private pools) hold from the driver."""
    return _core.cuda_memory_stats(_index(device))["reserved"]


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Caps what dyngrad may hold on the device at ``fraction`` of its memory (0 to 1, as torch's): an allocation
    past the cap raises dyngrad.OutOfMemory (a MemoryError) naming it, whatever the device has free."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise _core.ValueError(f"set_per_process_memory_fraction: fraction must be a number from 0 to 1, got {fraction!r}")
    index = _index(device)
    # A cap of 0 bytes means "no cap" to set_memory_limit; a fraction of 0 caps at one byte (nothing fits).
    _core.cuda_set_memory_limit(index, max(1, int(fraction * _core.cuda_total_memory(index))))


def set_memory_limit(limit_bytes, device=None) -> None:
    """dyngrad's cap in bytes (cuda::set_memory_limit; char_gpt --memory-limit-mib); 0 removes it."""
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise _core.ValueError(f"set_memory_limit: limit_bytes must be an int >= 0, got {limit_bytes!r}")
    _core.cuda_set_memory_limit(_index(device), limit_bytes)


def memory_limit(device=None) -> int:
    """The cap of set_memory_limit / set_per_process_memory_fraction in bytes; 0: none."""
    return _core.cuda_memory_limit(_index(device))
