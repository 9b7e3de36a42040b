#!/usr/bin/env python3
"""Copies each program quoted by the documentation into its ```cpp file=NAME.cpp block.

The check itself is at configure time (samples/CMakeLists.txt, dyngrad_check_doc_snippets): every such block of
README.md and docs/guide/*.md must equal samples/NAME.cpp (README.md) or samples/guide/NAME.cpp (the guide).
After editing a program, run this to update the pages; it changes nothing else and prints each page it rewrote.
Usage: scripts/sync-doc-snippets.py [repository root]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
pages = [(root / "README.md", root / "samples")]
pages += [(page, root / "samples" / "guide") for page in sorted((root / "docs" / "guide").glob("*.md"))]
fence = re.compile(r"```cpp file=([A-Za-z0-9_]+\.cpp)")

for page, folder in pages:
    text = page.read_text()
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        match = fence.fullmatch(lines[i])
        out.append(lines[i])
        i += 1
        if not match:
            continue
        while i < len(lines) and lines[i] != "```":  # the old block, up to its closing fence
            i += 1
        if i == len(lines):
            sys.exit(f"{page}: the block of {match.group(1)} has no closing ``` line")
        program = (folder / match.group(1)).read_text()
        if not program.endswith("\n"):
            sys.exit(f"{folder / match.group(1)}: must end with a newline (the block's last line does)")
        out.extend(program[:-1].split("\n"))
    synced = "\n".join(out)
    if synced != text:
        page.write_text(synced)
        print(f"synced {page.relative_to(root)}")
