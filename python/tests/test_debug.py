import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F
from dyngrad import nn


def test_verify_lint_and_dot(rng):
    dg.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 4, activation="relu"), nn.Linear(4, 3))
    unused = nn.Linear(2, 2)
    x = dg.tensor(rng.standard_normal((6, 5)).astype(np.float32))
    y = dg.tensor(rng.integers(0, 3, 6))
    loss = F.cross_entropy(model(x), y) + unused.weight.sum() * 0.0
    assert "digraph" in dg.to_dot(loss)
    report = dg.lint(loss)
    assert report.clean() or isinstance(str(report), str)
    v = dg.verify(loss)
    assert v.passed, v.summary()
    assert model[0].weight.grad is not None  # verify ran the backward
    loss2 = F.cross_entropy(model(x), y)
    lint2 = dg.lint(loss2)
    assert lint2.clean(), str(lint2)


def test_lint_reports_unused_parameter(rng):
    a = nn.Parameter(dg.tensor(rng.standard_normal(3)))
    b = nn.Parameter(dg.tensor(rng.standard_normal(3)))
    loss = (a * 2.0).sum()
    (b * 1.0)  # recorded but not part of the loss
    report = dg.lint(loss)
    assert isinstance(report.issues, list)


def test_debug_tools_need_history(rng):
    t = dg.tensor(rng.standard_normal(3))
    for fn in (dg.verify, dg.lint, dg.to_dot):
        with pytest.raises(dg.GraphError, match="no recorded history"):
            fn(t)


def test_captured_step_on_cpu_is_a_device_error():
    if dg.cuda_is_available():
        pytest.skip("a CUDA device is present: test_gpu.py covers CapturedStep")
    step = dg.CapturedStep(lambda x: x * 2.0)
    with pytest.raises(dg.DeviceError):
        step.run(dg.ones(3))
