#!/usr/bin/env bash
# The layer check (docs/architecture.md): a file may include its own folder and the folders BELOW it,
# never a folder above. Parses every `#include "dyngrad/<folder>/..."` / `<dyngrad/<folder>/...>` and
# every relative `#include "..."` (resolved against the including file's folder, else through INCLUDE_DIRS) in the library folders,
# the umbrella header and the tools, and prints file:line and the offending include for each violation.
# Exit status: 0 when the layering holds, 1 otherwise. Usage: scripts/check-layers.sh [repository root]
set -uo pipefail

# The order, bottom to top. `dyngrad.h` (the umbrella header at the top of the tree) sits above every
# library folder; cli/ (the command-line parser every program shares) sits above that; the tools sit on
# top and may include anything below them, but not each other (python/: the Python package's extension).
LAYERS=(core cuda graph ops nn distributed dyngrad.h cli)
TOOLS=(tests tools bench samples python)
# The folders the build puts on include paths besides the library's own <dyngrad/...> (target_include_directories
# in tests/ (tests/support) and samples/): a bare `#include "x.h"` not beside the including file is looked up there, so a tool
# reaching into another tool's folder through an include path is caught too.
INCLUDE_DIRS=(tests/support tests samples)

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 1

declare -A rank=()
for i in "${!LAYERS[@]}"; do rank[${LAYERS[$i]}]=$i; done
tool_rank=${#LAYERS[@]}
for t in "${TOOLS[@]}"; do rank[$t]=$tool_rank; done

# The layer of a repository path: its first component ("dyngrad.h" for the umbrella header); empty for
# anything outside the layered tree (system headers, third-party).
layer_of() {
    local path=$1 top=${1%%/*}
    [[ $path == dyngrad.h ]] && { echo dyngrad.h; return; }
    [[ -n ${rank[$top]+x} && $path == */* ]] && echo "$top"
}

# Normalises a/b/../c to a/c (relative includes).
normalise() {
    local -a parts=() out=()
    IFS=/ read -ra parts <<<"$1"
    for p in "${parts[@]}"; do
        case $p in
            '' | .) ;;
            ..) ((${#out[@]})) && unset 'out[${#out[@]}-1]' ;;
            *) out+=("$p") ;;
        esac
    done
    local IFS=/
    echo "${out[*]}"
}

violations=0
checked=0
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- "${LAYERS[@]/%//}" dyngrad.h "${TOOLS[@]/%//}" 2>/dev/null |
                     grep -E '\.(h|hpp|cuh|cpp|cc|cu)$')
if ((${#files[@]} == 0)); then
    echo "check-layers: no source files found under $root (not a git checkout?)" >&2
    exit 1
fi
for file in "${files[@]}"; do
    own=$(layer_of "$file")
    [[ -n $own ]] || continue
    own_rank=${rank[$own]}
    dir=$(dirname "$file")
    checked=$((checked + 1))
    while IFS=: read -r line text; do
        [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]([^\"\>]+)[\"\>] ]] || continue
        inc=${BASH_REMATCH[1]}
        if [[ $inc == dyngrad/* ]]; then
            target=${inc#dyngrad/}
        elif [[ $text =~ \" ]]; then
            target=$(normalise "$dir/$inc")
            if [[ ! -e $target ]]; then
                # A bare include found through an include directory of the build (INCLUDE_DIRS), or not ours.
                target=""
                for include_dir in "${INCLUDE_DIRS[@]}"; do
                    [[ -e $include_dir/$inc ]] && { target=$(normalise "$include_dir/$inc"); break; }
                done
                [[ -n $target ]] || continue
            fi
        else
            continue  # a system or third-party header
        fi
        layer=$(layer_of "$target")
        [[ -n $layer ]] || continue
        target_rank=${rank[$layer]}
        if ((target_rank > own_rank)) || { ((own_rank == tool_rank)) && [[ $layer != "$own" ]] &&
                                            ((target_rank == tool_rank)); }; then
            if ((target_rank == tool_rank)); then
                echo "$file:$line: tool '$own' includes '$inc' from tool '$layer' (tools include only the library)"
            else
                echo "$file:$line: layer '$own' includes '$inc' from layer '$layer' above it (order: ${LAYERS[*]} < ${TOOLS[*]})"
            fi
            violations=$((violations + 1))
        fi
    done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include' "$file")
done

if ((violations > 0)); then
    echo "check-layers: $violations include(s) against the layer order in $checked files (see docs/architecture.md)"
    exit 1
fi
echo "check-layers: $checked files follow the layer order ${LAYERS[*]} < ${TOOLS[*]}"
