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
