"""The guide's Python blocks (docs/guide/*.md) are programs of python/examples/guide/, and each one runs here.

A block opens with ```python file=NAME.py and must equal python/examples/guide/NAME.py (scripts/sync-doc-snippets.py
pastes the files into the blocks); every file there must be quoted by a page. This is the Python counterpart of the
configure-time check of the C++ blocks (samples/CMakeLists.txt, dyngrad_check_doc_snippets). Each program checks its
own results with assert statements.
"""
import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = ROOT / "python" / "examples" / "guide"
BLOCK = re.compile(r"^```python file=([A-Za-z0-9_]+\.py)\n(.*?)^```$", re.S | re.M)


def _blocks():
    found = {}
    for page in sorted((ROOT / "docs" / "guide").glob("*.md")):
        text = page.read_text()
        opened = len(re.findall(r"^```python file=", text, re.M))
        assert opened == len(BLOCK.findall(text)), f"{page.name}: an unclosed python block"
        for name, body in BLOCK.findall(text):
            assert name not in found, f"{name} is quoted by {found[name][0]} and {page.name}"
            found[name] = (page.name, body)
    return found


def test_blocks_equal_their_programs():
    blocks = _blocks()
    assert blocks, "the guide quotes no Python program"
    for name, (page, body) in blocks.items():
        assert (FOLDER / name).is_file(), f"{page}: block {name} has no file python/examples/guide/{name}"
        assert body == (FOLDER / name).read_text(), \
            f"{page}: block {name} differs from python/examples/guide/{name}: run scripts/sync-doc-snippets.py"
    unquoted = {p.name for p in FOLDER.glob("*.py")} - set(blocks)
    assert not unquoted, f"programs of python/examples/guide/ that no page quotes: {unquoted}"


@pytest.mark.parametrize("name", sorted(p.name for p in FOLDER.glob("*.py")))
def test_program_runs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(FOLDER / name), run_name="__main__")
