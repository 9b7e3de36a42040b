"""Bad calls from Python raise typed exceptions (dyngrad's classes, which are also the built-in ones a Python
user catches), never crash the interpreter."""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F


def test_exception_hierarchy():
    assert issubclass(dg.ShapeError, dg.Error) and issubclass(dg.ShapeError, ValueError)
    assert issubclass(dg.DTypeError, TypeError) and issubclass(dg.IndexError, IndexError)
    assert issubclass(dg.ValueError, ValueError) and issubclass(dg.OutOfMemory, MemoryError)
    assert issubclass(dg.OutOfMemory, dg.CudaError) and issubclass(dg.IoError, OSError)
    assert issubclass(dg.Error, RuntimeError) and issubclass(dg.GraphError, RuntimeError)
    assert issubclass(dg.NumericalError, ArithmeticError) and issubclass(dg.DeviceError, RuntimeError)


BAD_CALLS = [
    (dg.ShapeError, lambda: dg.ones(2, 3) + dg.ones(4, 5)),
    (dg.ShapeError, lambda: dg.ones(2, 3) @ dg.ones(2, 3)),
    (dg.ShapeError, lambda: dg.ones(2, 3).reshape(4, 2)),
    (dg.ShapeError, lambda: F.conv2d(dg.ones(1, 2, 5, 5), dg.ones(3, 1, 3, 3))),
    (dg.DTypeError, lambda: dg.ones(3) + dg.ones(3, dtype=dg.float64)),
    (dg.DTypeError, lambda: dg.tensor(["a", "b"])),
    (dg.DTypeError, lambda: dg.zeros(2, dtype="complex64")),
    (dg.IndexError, lambda: dg.ones(3)[5]),
    (dg.IndexError, lambda: dg.ones(3)[-4]),
    (dg.IndexError, lambda: dg.ones(3)[0, 0]),
    (dg.IndexError, lambda: dg.ones(3)[..., ...]),
    (dg.IndexError, lambda: dg.ones(3, 2)[dg.ones(2)]),
    (dg.IndexError, lambda: F.cross_entropy(dg.ones(2, 3), dg.tensor([0, 7]))),
    (dg.DeviceError, lambda: dg.zeros(2, device="tpu")),
    (dg.DeviceError, lambda: dg.ones(2).to("cuda:x")),
    (dg.ValueError, lambda: dg.ones(2, 2).__bool__()),
    (dg.ValueError, lambda: dg.ops.reduce if False else F.clamp(dg.ones(2), min=2.0, max=1.0)),
    (dg.ValueError, lambda: F.gelu(dg.ones(2), approximate="cubic")),
    (dg.ValueError, lambda: F.cross_entropy(dg.ones(2, 3), dg.tensor([0, 1]), reduction="avg")),
    (dg.ValueError, lambda: dg.optim.SGD([dg.ones(2)], lr=0.1)),
    (dg.ValueError, lambda: dg.optim.SGD([dg.nn.Parameter(dg.ones(2))], lr=-1.0)),
    (dg.ValueError, lambda: dg.nn.Dropout(1.5)),
    (dg.GraphError, lambda: dg.ones(2).backward()),
    (dg.GraphError, lambda: dg.ones(2, requires_grad=True).backward()),
    (dg.IoError, lambda: dg.load("/nonexistent/model.safetensors")),
    (dg.IoError, lambda: dg.load_mnist("/nonexistent-mnist")),
    (TypeError, lambda: dg.ones(2) + "a"),
    (TypeError, lambda: dg.ones(2) @ 3),
    (TypeError, lambda: dg.ops.relu([1.0, 2.0])),
    (TypeError, lambda: dg.ops.relu(dg.ones(2), dg.ones(2))),
    (TypeError, lambda: dg.ops.add(dg.ones(2))),
    (TypeError, lambda: dg.ones(2)["x"]),
    (TypeError, lambda: dg.ones(2).__setitem__("x", 1.0)),
    (TypeError, lambda: dg.zeros("three")),
    (TypeError, lambda: len(dg.tensor(1.0))),
    (TypeError, lambda: dg.ops.sum(dg.ones(2), axis="0")),
    (TypeError, lambda: F.linear(dg.ones(2, 2), None)),
]


@pytest.mark.parametrize("expected,call", BAD_CALLS, ids=[f"{i}-{e.__name__}" for i, (e, _) in enumerate(BAD_CALLS)])
def test_bad_call_raises_typed_error(expected, call):
    with pytest.raises(expected):
        call()


def test_dyngrad_errors_name_this_file():
    with pytest.raises(dg.Error) as info:
        dg.ones(2, 3) + dg.ones(4, 5)
    assert "test_errors.py:" in str(info.value)


def test_interpreter_survives_many_errors():
    for _ in range(200):
        with pytest.raises(dg.ShapeError):
            dg.ones(2) + dg.ones(3)
    assert (dg.ones(2) + dg.ones(2)).numpy().tolist() == [2.0, 2.0]
