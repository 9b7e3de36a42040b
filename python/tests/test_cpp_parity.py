"""Python at parity with C++: the C++ public surface, read from the repository's sources, must be reachable from
Python, except the entries of docs/python.md's exception list (parity-exceptions), each with its reason.

The surface: every op of ops/op_table.cpp (dyngrad.ops.<name>); every class of nn/*.h deriving from Module,
Optimizer or LRScheduler (layers, optimizers, schedules); GradScaler (nn/amp.h); the *Guard classes of graph/*.h
(no_grad, autocast, detect_anomaly); the loaders of nn/dataset.h; CapturedStep (cuda/capture.h); the classes of
distributed/*.h. A class added to those headers without a Python binding (or an exception entry) fails this test.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import dyngrad as dg

ROOT = Path(__file__).resolve().parents[2]

# C++ names whose Python spelling differs from the default rule (category prefix + the same name).
RENAMED = {
    "Module": "nn.Module",
    "BatchNorm": "nn.BatchNorm2d",
    "Recurrent": "nn.RNNBase",
    "Optimizer": "optim.Optimizer",
    "LRScheduler": "optim.LRScheduler",
    "GradScaler": "amp.GradScaler",
    "NoGradGuard": "no_grad",
    "AutocastGuard": "autocast",
    "AnomalyModeGuard": "detect_anomaly",
    "SampleDataset": "data.Dataset",
    "DataLoader": "data.DataLoader",
    "TensorDataset": "data.TensorDataset",
    "TokenWindows": "data.TokenWindows",
    "TokenVocabulary": "data.TokenVocabulary",
    "BatchLoader": "BatchLoader",
    "CapturedStep": "cuda.CapturedStep",
    "DistributedDataParallel": "nn.parallel.DistributedDataParallel",
}
_CLASS = re.compile(r"^class (\w+)(?: final)?\s*:\s*public (\w+)", re.M)
_ANY_CLASS = re.compile(r"^class (\w+)(?: final)?\s*[:{]", re.M)


def surface_from_sources(files: dict[str, str]) -> dict[str, str]:
    """{C++ entry: Python path} for sources given as {repository path: text}. Entries are "op:<name>" for the
    op table and the class name otherwise."""
    entries: dict[str, str] = {}
    for path, text in files.items():
        if path == "ops/op_table.cpp":
            for name in re.findall(r'\{OpType::\w+, "(\w+)"', text):
                if name not in ("leaf", "custom"):
                    entries[f"op:{name}"] = f"ops.{name}"
    # Classes by their base, transitively over every nn/ header (Adam -> Optimizer, AdamW -> Adam).
    bases = {}
    for path, text in files.items():
        if path.startswith("nn/") and path.endswith(".h"):
            bases.update(dict(_CLASS.findall(text)))

    def root(name):
        seen = set()
        while name in bases and name not in seen:
            seen.add(name)
            name = bases[name]
        return name

    prefix = {"Module": "nn.", "Optimizer": "optim.", "LRScheduler": "optim."}
    for name in list(bases) + list(prefix):
        r = root(name)
        if r in prefix:
            entries[name] = RENAMED.get(name, prefix[r] + name)
    for path, text in files.items():
        if path == "nn/amp.h":
            entries.update({n: RENAMED.get(n, "amp." + n) for n in _ANY_CLASS.findall(text)})
        elif path.startswith("graph/") and path.endswith(".h"):
            entries.update({n: RENAMED.get(n, n) for n in _ANY_CLASS.findall(text) if n.endswith("Guard")})
        elif path in ("nn/dataset.h", "cuda/capture.h"):
            entries.update({n: RENAMED.get(n, n) for n in _ANY_CLASS.findall(text)})
        elif path.startswith("distributed/") and path.endswith(".h"):
            entries.update({n: RENAMED.get(n, "distributed." + n) for n in _ANY_CLASS.findall(text)})
    # A class of a public nn/ header that none of the rules above placed (no base the parse knows) is reported
    # rather than skipped: map it in RENAMED.
    for path, text in files.items():
        if path.startswith("nn/") and path.endswith(".h"):
            for name in _ANY_CLASS.findall(text):
                entries.setdefault(name, RENAMED.get(name, f"<unplaced:{path}>"))
    return entries


def reachable(path: str) -> bool:
    obj = dg
    for part in path.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def missing_in_python(surface: dict[str, str], exceptions: set[str]) -> list[str]:
    return sorted(f"{cpp} (dyngrad.{py})" for cpp, py in surface.items()
                  if cpp not in exceptions and not reachable(py))


def documented_exceptions(doc_text: str) -> set[str]:
    """The first `name` of each table row between docs/python.md's parity-exceptions markers."""
    block = re.search(r"<!-- parity-exceptions: begin -->(.*?)<!-- parity-exceptions: end -->", doc_text, re.S)
    assert block, "docs/python.md has no parity-exceptions block"
    return set(re.findall(r"^\|\s*`([\w:]+)`", block.group(1), re.M))


def public_headers() -> list[str]:
    """The installed headers: CMakeLists.txt's DYNGRAD_PUBLIC_HEADERS (internal ones such as
    nn/optim_kernels.h are not the user's surface)."""
    block = re.search(r"set\(DYNGRAD_PUBLIC_HEADERS(.*?)\)", (ROOT / "CMakeLists.txt").read_text(), re.S)
    assert block, "CMakeLists.txt has no DYNGRAD_PUBLIC_HEADERS list"
    return block.group(1).split()


def repository_sources() -> dict[str, str]:
    if not (ROOT / "ops" / "op_table.cpp").exists():
        pytest.skip("the repository's sources are not at hand (installed package)")
    files = {"ops/op_table.cpp": (ROOT / "ops" / "op_table.cpp").read_text()}
    headers = [h for h in public_headers() if h.split("/")[0] in ("nn", "graph") or h == "cuda/capture.h"]
    # distributed/ is its own library (the package's component dist): all of its headers count.
    headers += [str(p.relative_to(ROOT)) for p in ROOT.glob("distributed/*.h")]
    for h in headers:
        files[h] = (ROOT / h).read_text()
    return files


def test_every_cpp_entry_is_reachable_from_python():
    surface = repository_sources_surface = surface_from_sources(repository_sources())
    exceptions = documented_exceptions((ROOT / "docs" / "python.md").read_text())
    # The parse found what it must (a parse that finds nothing would pass vacuously).
    for must in ("op:matmul", "Linear", "MultiheadAttention", "GPT", "AdamW", "WarmupCosineLR", "GradScaler",
                 "AutocastGuard", "NoGradGuard", "LSTM", "DataLoader", "CapturedStep", "ProcessGroup"):
        assert must in repository_sources_surface, f"{must} not found in the C++ sources"
    missing = missing_in_python(surface, exceptions)
    assert not missing, ("C++ entries without a Python counterpart (bind them, or list them with a reason in "
                         f"docs/python.md's parity-exceptions): {missing}")


def test_exception_list_is_short_and_current():
    """Every exception names an entry that exists in C++ and is really missing in Python (no stale entries)."""
    surface = surface_from_sources(repository_sources())
    exceptions = documented_exceptions((ROOT / "docs" / "python.md").read_text())
    assert len(exceptions) <= 8, f"the exception list is meant to stay short: {sorted(exceptions)}"
    for name in exceptions:
        assert name in surface, f"exception '{name}' is not a C++ entry the check knows"
        assert not reachable(surface[name]), f"'{name}' is reachable as dyngrad.{surface[name]}: drop the exception"


def test_the_check_fails_for_a_layer_added_without_a_binding():
    files = repository_sources()
    files["nn/new_layer.h"] = "class FancyNorm : public Module {\npublic:\n};\nclass Lion : public Optimizer {\n};\n"
    files["nn/optim_extra.h"] = "class OneCycleLR : public LRScheduler {\n};\n"
    files["ops/op_table.cpp"] += '\n    {OpType::Frobnicate, "frobnicate", 1},\n'
    files["nn/layers.h"] += "\nclass Mystery\n    : public Module {\n};\n"  # split over lines: still a layer
    files["nn/layers.h"] += "\nclass Helper {\n};\n"  # no known base: reported, not skipped
    exceptions = documented_exceptions((ROOT / "docs" / "python.md").read_text())
    missing = missing_in_python(surface_from_sources(files), exceptions)
    assert missing == sorted(["FancyNorm (dyngrad.nn.FancyNorm)", "Lion (dyngrad.optim.Lion)",
                              "OneCycleLR (dyngrad.optim.OneCycleLR)", "op:frobnicate (dyngrad.ops.frobnicate)",
                              "Mystery (dyngrad.nn.Mystery)", "Helper (dyngrad.<unplaced:nn/layers.h>)"])


def test_schedules_are_under_lr_scheduler_too():
    surface = surface_from_sources(repository_sources())
    schedules = [n for n, py in surface.items() if py.startswith("optim.") and n.endswith("LR")]
    assert "WarmupCosineLR" in schedules
    for name in schedules:
        assert getattr(dg.optim.lr_scheduler, name) is getattr(dg.optim, name)
