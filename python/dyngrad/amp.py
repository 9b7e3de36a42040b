"""Mixed precision: ``dyngrad.autocast`` (graph/autocast.h's AutocastGuard as a context manager) and
``dyngrad.amp.GradScaler`` (nn/optim.h), with PyTorch's names.

    with dg.autocast("cuda", dtype=dg.bfloat16):
        loss = F.cross_entropy(model(x), y)          # matmul/linear/conv2d/attention in bf16, the loss in f32
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

docs/mixed_precision.md has the per-op policy.
"""
from __future__ import annotations

from . import _core
from ._args import check_bools, check_ints, check_numbers
from ._scoped import ScopedSwitch

__all__ = ["autocast", "GradScaler", "get_autocast_dtype", "is_autocast_enabled", "set_autocast_parameter_copies",
           "autocast_parameter_copies", "set_batched_gradient_casts", "batched_gradient_casts"]


def get_autocast_dtype():
    """bfloat16/float16 inside an autocast block on this thread, None outside."""
    return _core.get_autocast_dtype()


def is_autocast_enabled() -> bool:
    return _core.get_autocast_dtype() is not None


def set_autocast_parameter_copies(keep: bool) -> None:
    """Whether autocast keeps the 16-bit cast of a parameter an optimizer updates across steps (on by default;
    a deliberate difference from PyTorch, docs/mixed_precision.md "Kept parameter copies"): the optimizer's step
    rewrites the copy and the next forward launches no cast for it, at 2 bytes per parameter kept between steps.
    For every thread; DYNGRAD_AUTOCAST_PARAMETER_COPIES=0 sets the default off."""
    check_bools("set_autocast_parameter_copies", keep=keep)
    _core.set_autocast_parameter_copies(keep)


def autocast_parameter_copies() -> bool:
    """Whether autocast keeps parameter copies (set_autocast_parameter_copies)."""
    return _core.autocast_parameter_copies()


def set_batched_gradient_casts(batch: bool) -> None:
    """Whether a backward converts the gradients of parameters read through a cast (autocast's, or an explicit
    ``p.to(dtype)``) back to the parameters' dtype together at its end, one kernel launch per 64 on a GPU, rather
    than each as its cast's backward is reached (on by default; the same bits either way; docs/mixed_precision.md
    "Batched gradient casts"; under data parallel in batches of 4 MiB, each parameter reported once complete).
    Not under anomaly mode. For every thread; DYNGRAD_BATCH_GRADIENT_CASTS=0 sets the default off."""
    check_bools("set_batched_gradient_casts", batch=batch)
    _core.set_batched_gradient_casts(batch)


def batched_gradient_casts() -> bool:
    """Whether parameter-gradient casts are batched (set_batched_gradient_casts)."""
    return _core.batched_gradient_casts()


class autocast(ScopedSwitch):
    """``with dg.autocast("cuda", dtype=dg.float16):`` / ``@dg.autocast("cpu")``.

    device_type is "cuda" or "cpu" and only checked: dyngrad's autocast is per thread, not per device, and
    casts the ops of every device (on the CPU bf16/f16 ops compute through float32). dtype defaults to float16
    for "cuda" and bfloat16 for "cpu", as PyTorch's. ``enabled=False`` turns autocast off inside (nested blocks
    restore the outer state). cache_enabled is accepted; the parameter-cast cache is always on.
    """

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled=None):
        if not isinstance(device_type, str) or device_type.split(":")[0] not in ("cuda", "cpu"):
            raise _core.ValueError(f"autocast: device_type must be 'cuda' or 'cpu', got {device_type!r}")
        if dtype is None:
            dtype = _core.float16 if device_type.startswith("cuda") else _core.bfloat16
        if dtype not in (_core.bfloat16, _core.float16):
            raise _core.DTypeError(f"autocast: dtype must be dyngrad.bfloat16 or dyngrad.float16, got {dtype}")
        self.device_type, self.fast_dtype, self.enabled = device_type, dtype, bool(enabled)
        self._scopes = []

    def _open_scope(self):
        scope = _core._AutocastScope()
        # AutocastGuard(float32) is the engine's "autocast off in this scope".
        scope.enter(self.fast_dtype if self.enabled else _core.float32)
        return scope


class GradScaler(_core.GradScaler):
    """Loss scaling (nn/optim.h): ``scale(loss)``, ``unscale_(opt)``, ``step(opt)``, ``update()``, ``get_scale()``,
    ``state_dict()``/``load_state_dict()``. On a GPU the check, the skip and the scale update run on the device
    (no synchronisation). Differences from torch.amp.GradScaler: ``update(new_scale)`` is refused (the scale
    follows its growth/backoff rule); a scale that keeps collapsing raises NumericalError (``min_scale``,
    ``max_consecutive_skips``); ``scale()`` takes one tensor, not a list."""

    def __init__(self, device: str = "cuda", init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True, *,
                 min_scale: float = 1.0, max_consecutive_skips: int = 16):
        if not isinstance(device, str):
            raise TypeError(f"GradScaler: device must be a str, got {type(device).__name__}")
        check_numbers("GradScaler", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                      min_scale=min_scale)
        check_ints("GradScaler", growth_interval=growth_interval, max_consecutive_skips=max_consecutive_skips)
        check_bools("GradScaler", enabled=enabled)
        super().__init__(init_scale, growth_factor, backoff_factor, growth_interval, enabled,
                         min_scale=min_scale, max_consecutive_skips=max_consecutive_skips)

    def step(self, optimizer, *args, **kwargs):
        if args or kwargs:
            raise TypeError("GradScaler.step(optimizer): extra arguments (closures) are not supported")
        super().step(optimizer)

    def state_dict(self) -> dict:
        tensors, metadata = self._save_state()
        return {"tensors": dict(tensors), "metadata": dict(metadata)}

    def load_state_dict(self, state: dict) -> None:
        self._load_state(state["tensors"], state["metadata"])
