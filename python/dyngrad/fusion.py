"""dyngrad.fusion: the fusion compiler's switch, counters and log (docs/fusion.md), as C++ reaches them.

    step = dg.cuda.CapturedStep(train_step)  # fused by default: its warm-up plans, its capture runs each group
    for x, y in loader:                      # of pointwise ops as one generated kernel, forward and backward
        step.run(x, y)
    with dg.fusion.enabled():                # or set_mode("all"); DYNGRAD_FUSION=1: eager graphs fuse too
        for x, y in loader:                  # CUDA tensors: from the third step with the same graph
            train_step(x, y)
    dg.fusion.stats()["eager_graphs_fused"], dg.fusion.log()

The mode (``fusion::FusionMode``; DYNGRAD_FUSION sets the process's default): "captured" (the default) plans a
``dg.cuda.CapturedStep``'s graph at its warm-up's backward (``fusion::plan_fusion``): maximal groups of pointwise
ops, each compiled with NVRTC into one kernel that its capture launches, and each group's backward chain as one
kernel; "all" does the same for eager graphs (every backward runs the chains, and an eager graph whose signature
has come to a backward twice runs the generated forward); "off" never fuses. A plan never changes a result. Only
CUDA graphs are planned: on the CPU, and on a build without CUDA, the switch and the counters exist but the
counters do not move and nothing is logged.
"""
from __future__ import annotations

import contextlib as _contextlib

from . import _core
from ._args import check_bools

__all__ = ["is_enabled", "set_enabled", "mode", "set_mode", "MODES", "enabled", "settings", "stats", "log", "clear_log",
           "LOG_KINDS"]

MODES = ("off", "captured", "all")

# The values of a log entry's "kind" (cuda::FusionLogEntry::Kind, in snake case).
LOG_KINDS = tuple(_core.fusion_log_kinds())


def is_enabled() -> bool:
    """Whether fusion is on (``fusion::fusion_settings().enabled``): mode() is "captured" (the default) or "all"."""
    return _core.fusion_settings()["enabled"]


def mode() -> str:
    """The mode, one of MODES: DYNGRAD_FUSION's ("captured" when unset; "0"/"off"; "1"/"all"), or what set_mode or
    set_enabled last set."""
    return _core.fusion_settings()["mode"]


def set_mode(mode: str) -> None:
    """Sets the mode for the whole process, every thread (``fusion::set_fusion_mode``; overrides DYNGRAD_FUSION):
    "off", "captured" (captured steps only, the default) or "all" (eager graphs too). Each call also forgets which
    eager graphs have repeated. TypeError for a non-str, ValueError for another string."""
    if not isinstance(mode, str):
        raise TypeError(f"fusion.set_mode: mode must be a str, got {type(mode).__name__}")
    _core.set_fusion_mode(mode)


def set_enabled(enabled: bool) -> None:
    """True: mode "all" (captured steps and eager graphs fuse); False: "off" (``fusion::set_fusion_enabled``;
    overrides DYNGRAD_FUSION). Each call also forgets which eager graphs have repeated: an eager graph fuses again
    once its signature has come to a backward twice after the call. A bool only (TypeError otherwise)."""
    check_bools("fusion.set_enabled", enabled=enabled)
    _core.set_fusion_enabled(enabled)


class enabled(_contextlib.ContextDecorator):
    """``with dg.fusion.enabled():`` (or ``enabled(False)``, or as a decorator): mode "all" ("off") inside, the
    previous mode back at the end, also when the block raises. The mode is the process's, as set_mode's: other
    threads see it change. Entering or leaving with the mode already that one changes nothing (no set_mode call,
    so what the eager hook learnt of repeating graphs is kept)."""

    def __init__(self, flag: bool = True):
        check_bools("fusion.enabled", flag=flag)
        self._mode = "all" if flag else "off"
        self._before = []  # a stack: one object may be entered again while active (a decorated recursive function)

    def __enter__(self):
        before = mode()
        self._before.append(before)
        if before != self._mode:
            _core.set_fusion_mode(self._mode)
        return self

    def __exit__(self, *exc):
        before = self._before.pop()
        if mode() != before:
            _core.set_fusion_mode(before)
        return False


def settings() -> dict:
    """The switches as ``fusion::fusion_settings()`` reads them: ``{"mode", "enabled", "eager", "print", "check"}``
    (mode a str of MODES, the others bools). "enabled": the mode is not "off"; "eager": it is "all"; "print": DYNGRAD_PRINT_FUSIONS=1 (generated sources and fallbacks
    to stderr); "check": DYNGRAD_CHECK_FUSIONS=1 (each new kernel compared with its unfused ops on first use).
    "print" and "check" are read once from the environment: C++ has no setter for them either."""
    return _core.fusion_settings()


def stats() -> dict:
    """The calling thread's fusion counters (``fusion::replay_stats()``, ``ReplayStats``'s fields), counted since
    the thread started (there is no reset: compare two readings). ints, except ``prepare_ms`` and ``nvrtc_ms``
    (floats, host milliseconds):

    plans (made at first backwards; a repeated signature reuses its plan), groups_compiled, groups_dropped (a failed
    compile or check), captures (captured graphs that ran generated kernels), last_groups and last_launches_saved
    (of the last of those), prepare_ms (planning, source generation, NVRTC, module loading), nvrtc_ms (NVRTC alone),
    groups_from_cache (images from the disk cache), backward_chains_compiled, backward_chains_dropped,
    backward_chains_run, eager_graphs_fused (eager graphs that ran generated forward kernels), plans_let_go (graphs
    that turned out to differ from their plan part way).

    Work on another thread (a DataLoader worker, a thread of your own) counts in that thread's stats. All 0 on the
    CPU and without CUDA: only CUDA graphs are planned."""
    return _core.fusion_stats()


def log() -> list:
    """The process's fusion log (``cuda::fusion_log()``), oldest first: one dict per event,
    ``{"kind", "kernel", "reason"}``: kind one of LOG_KINDS ("compile_fallback": NVRTC refused a source, the unfused
    kernels ran; "cache_unwritable", "cache_read_failed": the disk cache, the kernel compiled in memory;
    "check_mismatch": DYNGRAD_CHECK_FUSIONS=1 found a kernel differing, it was dropped; "graph_differs": a graph
    differed from its plan's and ran unfused from there), kernel the generated kernel's name ("" when the entry is
    about none), reason the text. Always empty on a build without CUDA (nothing there compiles kernels)."""
    return _core.fusion_log()


def clear_log() -> None:
    """Empties the fusion log (``cuda::clear_fusion_log()``; an unwritable cache directory is then logged again).
    Does nothing on a build without CUDA."""
    _core.clear_fusion_log()
