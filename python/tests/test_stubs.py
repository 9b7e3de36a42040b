"""The type stubs nanobind's stubgen wrote at build time name the module's whole public surface."""
import re
from pathlib import Path

import dyngrad as dg


def test_stub_file_lists_the_module():
    stub = Path(dg._core.__file__).with_name("_core.pyi")
    assert stub.exists(), f"no {stub}: the build runs nanobind_add_stub"
    text = stub.read_text()
    declared = set(re.findall(r"^(?:class|def) (\w+)", text, re.M)) | set(re.findall(r"^(\w+)\s*[:=]", text, re.M))
    # Exception classes are made with PyErr_NewException (two bases each, which nanobind's classes cannot
    # have) and stubgen leaves out names ending in "_" (clip_grad_norm_): both are in dyngrad/__init__.pyi's
    # re-exports at run time only.
    public = {n for n in dir(dg._core) if not n.startswith("_") and not n.endswith("_")
              and not (isinstance(getattr(dg._core, n), type) and issubclass(getattr(dg._core, n), BaseException))}
    missing = sorted(public - declared)
    assert not missing, f"names of dyngrad._core missing from {stub.name}: {missing}"
    assert (stub.parent / "py.typed").exists()


def test_stub_types_the_operators():
    """The arithmetic operators are number slots (no nanobind signature): python/stubs.pattern types them."""
    text = Path(dg._core.__file__).with_name("_core.pyi").read_text()
    for name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv"):
        assert f"def __{name}__(self, other: Tensor | float, /) -> Tensor" in text, name
    assert "def __matmul__(self, other: Tensor, /) -> Tensor" in text
