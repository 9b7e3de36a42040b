"""Python at parity with C++: the C++ public surface, read from the repository's sources, must be reachable from
Python, except the entries of docs/python.md's exception list (parity-exceptions), each with its reason.

The surface: every op of ops/op_table.cpp (dyngrad.ops.<name>); every class of nn/*.h deriving from Module,
Optimizer or LRScheduler (layers, optimizers, schedules); GradScaler (nn/optim.h); the *Guard classes of graph/*.h
(no_grad, autocast, detect_anomaly); the loaders of nn/dataset.h; CapturedStep (cuda/capture.h); the classes of
distributed/*.h; the fields of the settings structs in SETTINGS (GPTConfig, TransformerOptions, ZeroOptions, ZeroUnit:
"Struct::field", a field of the Python dataclass or a keyword of the Python constructor) and the ZeRO stages
(ZeroOptions::stage's documented values, each accepted by dyngrad.distributed.ZeroOptimizer). A class or field
added to those headers without a Python binding (or an exception entry) fails this test. The fusion compiler's
switch, counters and log (internal headers, bound as dyngrad.fusion) are checked apart: FUSION_FUNCTIONS.
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
        if path == "nn/optim.h":  # the loss scaler beside the optimizers whose step it gates
            entries.update({n: RENAMED.get(n, "amp." + n) for n in _ANY_CLASS.findall(text) if n.startswith("GradScaler")})
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


# Settings structs: {struct: (header, Python class whose fields or constructor keywords carry the fields)}.
SETTINGS = {
    "GPTConfig": ("nn/transformer.h", "nn.GPTConfig"),
    "TransformerOptions": ("nn/transformer.h", "nn.TransformerBlock"),
    "ZeroOptions": ("distributed/zero.h", "distributed.ZeroOptimizer"),
    "ZeroUnit": ("distributed/zero.h", "distributed.ZeroUnit"),
}
# Fields whose Python keyword is spelled otherwise (PyTorch's spelling).
RENAMED_FIELDS = {"TransformerOptions::causal": "is_causal"}


def struct_fields(text: str, struct: str) -> list[str]:
    """The data members of `struct Name { ... };` in a header (methods and comments skipped)."""
    block = re.search(rf"^struct {struct} \{{\n(.*?)^\}};", text, re.S | re.M)
    assert block, f"struct {struct} not found"
    fields = []
    for line in block.group(1).splitlines():
        decl = line.split("//")[0].strip()
        if not decl.endswith(";") or decl.startswith(("using", "static", "friend")):
            continue
        head = decl[:-1].split("=")[0].strip()
        if re.search(r"\)\s*(const)?\s*$", head):
            continue  # a method's declaration
        fields.append(re.search(r"(\w+)$", head).group(1))
    return fields


def settings_surface(files: dict[str, str]) -> dict[str, str]:
    """{"Struct::field": "<Python class path>:<field or keyword>"} for SETTINGS' structs."""
    entries = {}
    for struct, (header, py) in SETTINGS.items():
        for field in struct_fields(files[header], struct):
            entry = f"{struct}::{field}"
            entries[entry] = f"{py}:{RENAMED_FIELDS.get(entry, field)}"
    return entries


def reachable(path: str) -> bool:
    if ":" in path:  # a settings field: a dataclass field, a constructor keyword or an attribute
        import dataclasses
        import inspect
        owner, field = path.split(":")
        if not reachable(owner):
            return False
        obj = dg
        for part in owner.split("."):
            obj = getattr(obj, part)
        if dataclasses.is_dataclass(obj):
            return field in {f.name for f in dataclasses.fields(obj)}
        return field in inspect.signature(obj.__init__).parameters or field in getattr(obj, "__slots__", ())
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
    nn/optim_internal.h are not the user's surface)."""
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


def full_surface(files: dict[str, str]) -> dict[str, str]:
    return {**surface_from_sources(files), **settings_surface(files)}


def test_every_cpp_entry_is_reachable_from_python():
    surface = repository_sources_surface = full_surface(repository_sources())
    exceptions = documented_exceptions((ROOT / "docs" / "python.md").read_text())
    # The parse found what it must (a parse that finds nothing would pass vacuously).
    for must in ("op:matmul", "Linear", "MultiheadAttention", "GPT", "AdamW", "WarmupCosineLR", "GradScaler",
                 "AutocastGuard", "NoGradGuard", "LSTM", "DataLoader", "CapturedStep", "ProcessGroup",
                 "GPTConfig::padded_vocab_size", "GPTConfig::tie_embeddings", "GPTConfig::gelu",
                 "TransformerOptions::gelu", "ZeroOptions::stage", "ZeroUnit::forward"):
        assert must in repository_sources_surface, f"{must} not found in the C++ sources"
    missing = missing_in_python(surface, exceptions)
    assert not missing, ("C++ entries without a Python counterpart (bind them, or list them with a reason in "
                         f"docs/python.md's parity-exceptions): {missing}")


def test_exception_list_is_short_and_current():
    """Every exception names an entry that exists in C++ and is really missing in Python (no stale entries)."""
    surface = full_surface(repository_sources())
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


def test_the_check_fails_for_a_settings_field_added_without_a_binding():
    files = repository_sources()
    files["nn/transformer.h"] = files["nn/transformer.h"].replace(
        "    bool tie_embeddings = false;", "    bool tie_embeddings = false;\n    double rope_theta = 1e4;  // new")
    files["distributed/zero.h"] = files["distributed/zero.h"].replace("    int stage = 2;", "    int stage = 2;\n    bool offload = false;")
    exceptions = documented_exceptions((ROOT / "docs" / "python.md").read_text())
    missing = missing_in_python(full_surface(files), exceptions)
    assert missing == ["GPTConfig::rope_theta (dyngrad.nn.GPTConfig:rope_theta)",
                       "ZeroOptions::offload (dyngrad.distributed.ZeroOptimizer:offload)"]


def zero_stages(text: str) -> list[int]:
    """ZeroOptions::stage's documented stages ("// 1: ...; 2: ...; 3: ..." above the field)."""
    block = re.search(r"^struct ZeroOptions \{\n(.*?)^\s*int stage", text, re.S | re.M)
    assert block, "distributed/zero.h: ZeroOptions::stage not found"
    return [int(n) for n in re.findall(r"(\d): ", block.group(1))]


def test_every_zero_stage_of_cpp_is_accepted_from_python():
    """Each stage ZeroOptions documents is one dyngrad.distributed.ZeroOptimizer takes (a group of one), whose
    memory() has every field of ZeroMemory; a stage outside them is a ValueError naming the argument."""
    import dyngrad.distributed as dist
    files = repository_sources()
    stages = zero_stages(files["distributed/zero.h"])
    assert stages == [1, 2, 3]
    if not dist.is_available():
        pytest.skip("dyngrad was built without its distributed layer")
    dist.init_process_group()
    try:
        for stage in stages:
            layer = dg.nn.Linear(3, 2)
            model = [dist.ZeroUnit("fc", layer)] if stage == 3 else layer
            opt = dist.ZeroOptimizer(model, stage=stage)
            assert opt.stage == stage
            assert set(opt.memory()) == set(struct_fields(files["distributed/zero.h"], "ZeroMemory"))
        with pytest.raises(dg.ValueError, match=f"stage={max(stages) + 1}"):
            dist.ZeroOptimizer(dg.nn.Linear(3, 2), stage=max(stages) + 1)
    finally:
        dist.destroy_process_group()


# The fusion compiler's switch, counters and log (docs/fusion.md), declared in these installed headers:
# {C++ function: its dyngrad.fusion counterpart}. Every function of those headers that reads or sets a switch, reads
# the counters or reads or clears the log must be here (a setter or a reset added in C++ fails the check until it is
# bound); FusionSettings' and ReplayStats' fields must be the keys of settings() and stats(), in order, and the log's
# kinds the enumerators of FusionLogEntry::Kind in snake case.
FUSION_HEADERS = ("graph/fusion_plan.h", "graph/fusion_replay.h", "cuda/nvrtc_compiler.h")
FUSION_FUNCTIONS = {
    "fusion_settings": "fusion.settings",
    "set_fusion_enabled": "fusion.set_enabled",
    "set_fusion_mode": "fusion.set_mode",
    "replay_stats": "fusion.stats",
    "fusion_log": "fusion.log",
    "clear_fusion_log": "fusion.clear_log",
}
_FUSION_FUNCTION = re.compile(r"^[\w:<>, ]+?[ &*](\w*(?:fusion_settings|set_fusion_\w+|replay_stats|fusion_log)\w*)\(",
                              re.M)


def fusion_sources() -> dict[str, str]:
    if not all((ROOT / h).exists() for h in FUSION_HEADERS):
        pytest.skip("the repository's sources are not at hand (installed package)")
    return {h: (ROOT / h).read_text() for h in FUSION_HEADERS}


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def missing_fusion_bindings(files: dict[str, str]) -> list[str]:
    """What of the fusion headers' switch, counters and log dyngrad.fusion lacks, one line each."""
    problems = []
    declared = {name for text in files.values() for name in _FUSION_FUNCTION.findall(text)}
    for name in sorted(declared - set(FUSION_FUNCTIONS)):
        problems.append(f"{name}(): no entry in FUSION_FUNCTIONS")
    for name in sorted(set(FUSION_FUNCTIONS) - declared):
        problems.append(f"{name}(): in FUSION_FUNCTIONS but not declared in {', '.join(FUSION_HEADERS)}")
    for name, py in FUSION_FUNCTIONS.items():
        if not reachable(py):
            problems.append(f"{name}(): dyngrad.{py} missing")
    for header, struct, keys in (("graph/fusion_plan.h", "FusionSettings", list(dg.fusion.settings())),
                                 ("graph/fusion_replay.h", "ReplayStats", list(dg.fusion.stats()))):
        fields = struct_fields(files[header], struct)
        if keys != fields:
            problems.append(f"{struct}: fields {fields}, dyngrad.fusion keys {keys}")
    kind = re.search(r"enum class Kind\s*:\s*[\w ]+\{([^}]*)\}", files["cuda/nvrtc_compiler.h"])
    assert kind, "cuda/nvrtc_compiler.h: FusionLogEntry::Kind not found"
    kinds = tuple(snake_case(k.strip()) for k in kind.group(1).split(",") if k.strip())
    if kinds != dg.fusion.LOG_KINDS:
        problems.append(f"FusionLogEntry::Kind: {kinds}, dyngrad.fusion.LOG_KINDS {dg.fusion.LOG_KINDS}")
    return problems


def test_the_fusion_switch_counters_and_log_are_reachable_from_python():
    problems = missing_fusion_bindings(fusion_sources())
    assert not problems, "bind them in python/src/fusion.cpp and python/dyngrad/fusion.py: " + "; ".join(problems)


def test_the_fusion_check_fails_for_what_is_added_without_a_binding():
    files = fusion_sources()
    plan, replay, log = (files[h] for h in FUSION_HEADERS)
    plan = plan.replace("    bool check = false;\n", "    bool check = false;\n    bool trace = false;  // new\n")
    plan = plan.replace("void set_fusion_enabled(bool enabled);",
                        "void set_fusion_enabled(bool);\nvoid set_fusion_print(bool);")
    replay = replay.replace("ReplayStats replay_stats();", "ReplayStats replay_stats();\nvoid reset_replay_stats();")
    log = log.replace("GraphDiffers }", "GraphDiffers, LoadFailed }")
    files = dict(zip(FUSION_HEADERS, (plan, replay, log)))
    problems = missing_fusion_bindings(files)
    assert problems[:2] == ["reset_replay_stats(): no entry in FUSION_FUNCTIONS",
                            "set_fusion_print(): no entry in FUSION_FUNCTIONS"], problems
    assert any(p.startswith("FusionSettings: fields") and "'trace'" in p for p in problems), problems
    assert any(p.startswith("FusionLogEntry::Kind:") and "'load_failed'" in p for p in problems), problems
    assert len(problems) == 4, problems
