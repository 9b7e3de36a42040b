"""The base of the per-thread switches that are context managers and decorators (grad_mode.py's modes,
amp.py's autocast): each ``with`` enters one engine scope object, whose exit restores the state from before.
"""
import contextlib as _contextlib


class ScopedSwitch(_contextlib.ContextDecorator):
    """Subclasses set ``self._scopes = []`` and define ``_open_scope()``, which returns an entered _core scope.
    The scopes form a stack: one object may be entered again while active (a decorated recursive function)."""

    def _open_scope(self):
        raise NotImplementedError

    def __enter__(self):
        self._scopes.append(self._open_scope())
        return self

    def __exit__(self, *exc):
        self._scopes.pop().exit()
        return False
