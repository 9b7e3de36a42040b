"""Runs a PyTorch program of this folder on dyngrad with only its import lines changed (issue 29, item 3).

The PyTorch programs (<name>_torch.py) are the only copies: their dyngrad ports are derived from them here, by
rewriting each line that imports from torch to import the same path from dyngrad, and nothing else. So "a PyTorch
training program runs with only the import lines changed" holds by construction, and
python/tests/test_ported_scripts.py checks the rewritten lines against docs/python.md's "Ported PyTorch scripts"
table and runs the ports.

    python port.py regression --quick              # regression_torch.py on dyngrad
    python port.py --diff char_transformer         # the port as a diff against the PyTorch original
"""
import difflib
import pathlib
import re
import sys
import types

HERE = pathlib.Path(__file__).resolve().parent

# The only lines a port changes: `import torch`, `import torch.x as y` and `from torch.x import ...`. A line that
# imports torch any other way (`import torch.nn` binds the name torch to the package, which a rewrite cannot keep)
# is refused rather than ported by hand.
_REWRITES = [
    (re.compile(r"import torch"), lambda m: "import dyngrad as torch"),
    (re.compile(r"import torch(\.[\w.]+) as (\w+)"), lambda m: f"import dyngrad{m[1]} as {m[2]}"),
    (re.compile(r"from torch((?:\.\w+)*) import (.+)"), lambda m: f"from dyngrad{m[1]} import {m[2]}"),
]
_IMPORTS_TORCH = re.compile(r"\s*(import|from)\s+torch\b")


def port_lines(lines):
    """The port of a PyTorch program's lines: the same lines, its torch imports importing from dyngrad."""
    ported = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        for pattern, rewrite in _REWRITES:
            match = pattern.fullmatch(stripped)
            if match:
                line = line[:len(line) - len(line.lstrip())] + rewrite(match)
                break
        else:
            if _IMPORTS_TORCH.match(line):
                raise ValueError(f"line {number} imports torch in a form port.py does not rewrite: {line!r}")
        ported.append(line)
    return ported


def source(name):
    """<name>_torch.py's path and text."""
    path = HERE / f"{name}_torch.py"
    return path, path.read_text()


def load(name, engine="dyngrad"):
    """<name>_torch.py as a module: on PyTorch as written (engine "torch"), or its dyngrad port."""
    path, text = source(name)
    if engine == "dyngrad":
        text = "\n".join(port_lines(text.splitlines())) + "\n"
    elif engine != "torch":
        raise ValueError(f"engine is 'dyngrad' or 'torch', not {engine!r}")
    module = types.ModuleType(f"ported_{name}" + ("" if engine == "dyngrad" else "_torch"))
    module.__file__ = str(path)
    exec(compile(text, str(path), "exec"), module.__dict__)
    return module


def main(argv):
    if len(argv) >= 2 and argv[0] == "--diff":
        _, text = source(argv[1])
        original = text.splitlines()
        for line in difflib.unified_diff(original, port_lines(original), f"{argv[1]}_torch.py",
                                         f"{argv[1]} (dyngrad)", lineterm=""):
            print(line)
        return None
    if not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    names = sorted(p.name[:-len("_torch.py")] for p in HERE.glob("*_torch.py"))
    if argv[0] not in names:
        raise SystemExit(f"port.py: no {argv[0]}_torch.py here (there are: {', '.join(names)})")
    return load(argv[0]).main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
