#!/usr/bin/env python3
"""Copies each program quoted by the documentation into its ```cpp file=NAME.cpp or ```python file=NAME.py block.

The check itself is at configure time (samples/CMakeLists.txt, dyngrad_check_doc_snippets): every such block of
README.md and docs/guide/*.md must equal samples/NAME.cpp (README.md) or samples/guide/NAME.cpp (the guide).
The guide's Python blocks are python/examples/guide/NAME.py, checked by python/tests/test_guide_snippets.py.
After editing a program, run this to update the pages; it changes nothing else and prints each page it rewrote.
Usage: scripts/sync-doc-snippets.py [repository root]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
pages = [(root / "README.md", {"cpp": root / "samples"})]
pages += [(page, {"cpp": root / "samples" / "guide", "python": root / "python" / "examples" / "guide"})
          for page in sorted((root / "docs" / "guide").glob("*.md"))]
fence = re.compile(r"```(cpp|python) file=([A-Za-z0-9_]+\.(?:cpp|py))")

for page, folders in pages:
    text = page.read_text()
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        match = fence.fullmatch(lines[i])
        out.append(lines[i])
        i += 1
        if not match or match.group(1) not in folders:
            continue
        folder, name = folders[match.group(1)], match.group(2)
        while i < len(lines) and lines[i] != "```":  # the old block, up to its closing fence
            i += 1
        if i == len(lines):
            sys.exit(f"{page}: the block of {name} has no closing ``` line")
        program = (folder / name).read_text()
        if not program.endswith("\n"):
            sys.exit(f"{folder / name}: must end with a newline (the block's last line does)")
        out.extend(program[:-1].split("\n"))
    synced = "\n".join(out)
    if synced != text:
        page.write_text(synced)
        print(f"synced {page.relative_to(root)}")
