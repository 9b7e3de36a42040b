#!/usr/bin/env bash
# The size check beside the layer check (docs/architecture.md, "Where things live"): no library file over
# MAX_LINES lines, and every library file over EXPLAIN_LINES lines says why in its header comment (a line of its
# first 30 that contains "over 600 lines", any case). A file that grows past the limit is to be carved by role,
# as ops/attention*.cu were; the reason line keeps the long ones deliberate.
# Library files: the folders of scripts/check-layers.sh's LAYERS below the umbrella header, and dyngrad.h.
# Exit status: 0 when every file passes, 1 otherwise (each offender printed as file: lines). Usage:
# scripts/check-sizes.sh [repository root]
set -uo pipefail
MAX_LINES=800
EXPLAIN_LINES=600
LIBRARY=(core cuda graph ops nn distributed)

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 1

mapfile -t files < <(git ls-files --cached --others --exclude-standard -- "${LIBRARY[@]/%//}" dyngrad.h 2>/dev/null |
                     grep -E '\.(h|hpp|cuh|cpp|cc|cu)$')
if ((${#files[@]} == 0)); then
    echo "check-sizes: no library files found under $root (not a git checkout?)" >&2
    exit 1
fi
offenders=0
for file in "${files[@]}"; do
    [[ -f $file ]] || continue  # deleted in the work tree, still in the index
    lines=$(wc -l <"$file")
    if ((lines > MAX_LINES)); then
        echo "$file: $lines lines, over the limit of $MAX_LINES: carve it by role"
        offenders=$((offenders + 1))
    elif ((lines > EXPLAIN_LINES)) && ! head -n 30 "$file" | grep -qi "over $EXPLAIN_LINES lines"; then
        echo "$file: $lines lines and no 'Over $EXPLAIN_LINES lines: <why>' in its header comment"
        offenders=$((offenders + 1))
    fi
done
if ((offenders > 0)); then
    echo "check-sizes: $offenders of ${#files[@]} library files break the size rule"
    exit 1
fi
echo "check-sizes: ${#files[@]} library files, none over $MAX_LINES lines, each over $EXPLAIN_LINES says why"
