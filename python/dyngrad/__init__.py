"""dyngrad: reverse-mode autodiff on a dynamic graph, C++ engine (CPU and CUDA) driven from Python.

The graph is recorded implicitly, as in PyTorch: every op whose inputs require grad records into the
calling thread's current graph; ``loss.backward()`` back-propagates and releases it (unless
``retain_graph=True``); ``x.grad`` holds a leaf's gradient; ``with dyngrad.no_grad():`` records nothing.
docs/python.md explains the choice.
"""
from __future__ import annotations

import contextlib as _contextlib
import os as _os
import sys as _sys
import types as _types

import numpy as _np

from . import _core
from ._core import (  # noqa: F401  (the public surface)
    Tensor, dtype, device, float32, float64, int64,
    Error, ShapeError, DTypeError, DeviceError, GraphError, IndexError, ValueError, CudaError, OutOfMemory,
    IoError, NumericalError,
    zeros, ones, full, arange, randn, rand, manual_seed, from_dlpack,
    is_grad_enabled, is_anomaly_enabled, cuda_is_available, cuda_device_count, cuda_compiled, set_cpu_threads,
    verify, lint, to_dot, VerifyReport, LintReport, CapturedStep, custom_op, CustomOp, BatchLoader,
    save_safetensors, load_safetensors, load_mnist,
)

# Frames inside this package are skipped when an op names its creation site: errors point at user code.
_core._set_package_dir(_os.path.dirname(_os.path.abspath(__file__)) + _os.sep)

from . import ops  # noqa: E402
from . import functional  # noqa: E402
from . import nn  # noqa: E402
from . import optim  # noqa: E402
from . import data  # noqa: E402
from . import models  # noqa: E402
from . import parity  # noqa: E402  (PyTorch is imported only when used)
from . import _tensor_methods  # noqa: E402,F401  (adds methods to Tensor)
from . import _inplace  # noqa: E402  (in-place writes, x[i] = v, masks: after _tensor_methods, over its methods)
_inplace.install()
functional.masked_fill = _inplace.masked_fill  # also NumPy bool masks, lists of bools and tensor values
functional.masked_select = _inplace.masked_select
masked_select = _inplace.masked_select
from . import amp  # noqa: E402
from . import autograd  # noqa: E402
from .amp import autocast  # noqa: E402,F401
from .grad_mode import set_grad_enabled, enable_grad, inference_mode  # noqa: E402,F401
from .factories import (  # noqa: E402,F401
    cat, concat, stack, where, zeros_like, ones_like, full_like, rand_like, randn_like, empty_like, linspace, randint,
)
from ._core import bfloat16, float16  # noqa: E402,F401
from ._core import Generator  # noqa: E402,F401
from .functional import cumsum, sort, argsort, topk, multinomial  # noqa: E402,F401
# The distributed layer (dg.distributed, dg.nn.parallel; docs/python.md) and dg.cuda (captured steps).
from ._core import DistributedError  # noqa: E402,F401
from . import distributed  # noqa: E402
from . import cuda  # noqa: E402
from . import fusion  # noqa: E402  (the fusion compiler's switch, counters and log)
from . import parallel as _parallel  # noqa: E402
nn.parallel = _parallel  # dg.nn.parallel.DistributedDataParallel, and `from dyngrad.nn.parallel import ...`
_sys.modules[__name__ + ".nn.parallel"] = _parallel

__version__ = "0.1.0"

# PyTorch's module paths, so that a script's imports port by renaming torch to dyngrad:
# `import dyngrad.nn.functional as F`, `from dyngrad.utils.data import DataLoader`,
# `from dyngrad.optim.lr_scheduler import StepLR` (docs/python.md, "Ported PyTorch scripts").
from . import checkpoint as _checkpoint  # noqa: E402
utils = _types.ModuleType(__name__ + ".utils", "torch.utils' counterparts: utils.data is dyngrad.data, "
                          "utils.checkpoint dyngrad.checkpoint")
utils.data = data
utils.checkpoint = _checkpoint
for _alias, _module in (("nn.functional", functional), ("utils", utils), ("utils.data", data),
                        ("utils.checkpoint", _checkpoint),
                        ("optim.lr_scheduler", optim.lr_scheduler)):
    _sys.modules[f"{__name__}.{_alias}"] = _module
long = int64  # torch.long

_NUMPY_DTYPES = {"float32": float32, "float64": float64, "int64": int64}
half = float16


def tensor(data, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, scalars, NumPy arrays, any array-like).

    Python floats become float32 and ints int64 (as in PyTorch); NumPy arrays keep float32/float64/int64,
    other integer and bool arrays become int64, other floats float32.
    """
    if isinstance(dtype, _core.dtype) and dtype in (_core.bfloat16, _core.float16):
        # NumPy has no bfloat16: the data in float64, rounded once to the 16-bit type by the engine.
        t = tensor(data, dtype=float64, device=device).to(dtype)
        if requires_grad:
            t.requires_grad = True
        return t
    if isinstance(data, Tensor):
        data = data.detach().cpu().numpy()
    array = _np.asarray(data)
    if dtype is not None:
        target = _core_dtype_name(dtype)
    elif array.dtype.kind == "f":
        target = "float64" if array.dtype == _np.float64 and not _is_python_data(data) else "float32"
    elif array.dtype.kind in "iub":
        target = "int64"
    else:
        raise DTypeError(f"tensor(): cannot convert data of NumPy dtype {array.dtype} (dyngrad has float32, float64, int64)")
    array = _np.asarray(array, dtype=target, order="C")  # keeps 0-d data 0-d (ascontiguousarray would not)
    t = _core._from_numpy_copy(array, device)
    if requires_grad:
        t.requires_grad = True
    return t


def _is_python_data(data) -> bool:
    return not isinstance(data, _np.ndarray) and not hasattr(data, "__array__")


def _core_dtype_name(d) -> str:
    if isinstance(d, dtype):
        return {float32: "float32", float64: "float64", int64: "int64"}[d]
    if isinstance(d, str) and d in ("float32", "float64", "int64"):
        return d
    try:
        name = _np.dtype(d).name
    except TypeError:
        name = None
    if name in _NUMPY_DTYPES:
        return name
    raise DTypeError(f"unknown dtype {d!r}: dyngrad has float32, float64 and int64")


def from_numpy(array) -> Tensor:
    """A tensor sharing ``array``'s memory (no copy; the array stays alive while the tensor does)."""
    if not isinstance(array, _np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    return from_dlpack(array)


class no_grad(_contextlib.ContextDecorator):
    """Records nothing inside: results have no history (evaluation, in-place updates)."""

    def __enter__(self):
        self._scope = _core._NoGradScope()
        self._scope.enter()
        return self

    def __exit__(self, *exc):
        self._scope.exit()
        return False


class detect_anomaly(_contextlib.ContextDecorator):
    """Anomaly mode: the first NaN/Inf in a forward value or gradient raises NumericalError naming its node."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def __enter__(self):
        self._scope = _core._AnomalyScope()
        self._scope.enter(self.enabled)
        return self

    def __exit__(self, *exc):
        self._scope.exit()
        return False


def save(tensors: dict, path) -> None:
    """Writes a dict of tensors (a state_dict) to a safetensors file."""
    save_safetensors(str(path), dict(tensors))


def load(path) -> dict:
    """Reads a safetensors file into a dict of CPU tensors."""
    tensors, _ = load_safetensors(str(path))
    return dict(tensors)


def save_checkpoint(path, model, optimizer, scheduler=None) -> None:
    """Model state, optimizer state (groups, step counts, moments) and the schedule, in one safetensors file."""
    _core._save_checkpoint(str(path), model.state_dict(), optimizer, scheduler)


def load_checkpoint(path, model, optimizer, scheduler=None) -> None:
    """Restores what save_checkpoint wrote; checks everything before anything changes."""
    state, commit = _core._load_checkpoint(str(path), optimizer, scheduler)
    model.load_state_dict(state)
    commit()


def synchronize(device=0) -> None:
    """Waits for dyngrad's queued GPU work (timing)."""
    _core.cuda_synchronize(device if isinstance(device, int) else _core.device(str(device)).index)
