"""Grad-mode switches as PyTorch's: set_grad_enabled (a function and a context manager), enable_grad,
inference_mode. They set the engine's per-thread recording switch (the one NoGradGuard sets) and restore it on
exit; no_grad is in dyngrad/__init__.py.
"""
from __future__ import annotations

import contextlib as _contextlib

from . import _core
from ._scoped import ScopedSwitch

__all__ = ["set_grad_enabled", "enable_grad", "inference_mode"]


class _GradMode(ScopedSwitch):
    def __init__(self, mode: bool):
        if not isinstance(mode, bool):
            raise TypeError(f"{type(self).__name__}: mode must be a bool, got {type(mode).__name__}")
        self._mode = mode
        self._scopes = []

    def _open_scope(self):
        scope = _core._GradModeScope()
        scope.enter(self._mode)
        return scope


class set_grad_enabled(_contextlib.ContextDecorator):
    """``set_grad_enabled(False)`` switches recording off for the thread at once (as PyTorch's, the call acts);
    in a ``with`` block the mode from before the call comes back at its end; as a decorator it applies per call."""

    def __init__(self, mode: bool):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled: mode must be a bool, got {type(mode).__name__}")
        self._mode, self._before = mode, _core.is_grad_enabled()
        _core._set_grad_enabled(mode)

    def __call__(self, fn):
        _core._set_grad_enabled(self._before)  # decorating changes nothing (as torch's)
        return super().__call__(fn)

    def _recreate_cm(self):
        return set_grad_enabled(self._mode)  # each decorated call sets the mode and restores its own "before"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _core._set_grad_enabled(self._before)
        return False


class enable_grad(_GradMode):
    """Records again inside a ``no_grad()`` block (or as a decorator)."""

    def __init__(self):
        super().__init__(True)


class inference_mode(_GradMode):
    """``no_grad`` under PyTorch's name: records nothing. (No inference-tensor semantics: results may later be
    used in recorded ops as constants, which PyTorch's inference tensors refuse.)"""

    def __init__(self, mode: bool = True):
        super().__init__(not mode)
