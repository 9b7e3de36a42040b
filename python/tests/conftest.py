import inspect

import numpy as np
import pytest

import dyngrad as dg


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


@pytest.fixture
def torch():
    t = _torch()
    if t is None:
        pytest.skip("PyTorch is not installed in this environment (the GPU machine has it)")
    return t


@pytest.fixture
def cuda():
    if not dg.cuda_is_available():
        pytest.skip("no CUDA device (dyngrad built with CUDA: %s); run on the GPU machine" % dg.cuda_compiled())
    return "cuda:0"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def numeric_grad(f, a, h=1e-6):
    """The central-difference gradient of the scalar function f at the array a (a itself is left unchanged)."""
    a = a.copy()
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        saved = a[i]
        a[i] = saved + h
        up = f(a)
        a[i] = saved - h
        down = f(a)
        a[i] = saved
        g[i] = (up - down) / (2 * h)
    return g


def line_of(marker):
    """The line number of the line of the calling test file that holds `marker` (a comment on that line)."""
    caller = inspect.getmodule(inspect.currentframe().f_back)
    source, _ = inspect.getsourcelines(caller)
    for i, text in enumerate(source):
        if marker in text and "line_of(" not in text:
            return i + 1
    raise AssertionError(marker)
