#!/usr/bin/env bash
# The perf rows of this tree against another commit's, in one command on one GPU (issue 28's "no slower than
# before within noise"): builds dyngrad-perf for both, then runs them alternately, ROUNDS times each (head, base,
# head, base, ...), so drift of clocks and temperature falls on both sides alike; bench/compare_perf_commits.py
# writes OUT/report.md: per workload and mode the median over rounds of each side's per-step time, their ratio, and
# the spread between rounds of the same side (the noise), with a verdict per row.
#
#   scripts/run-perf-against.sh OUT_DIR BASE [--rounds N] [--quick] [--only NAMES] [--base-build DIR]
#
# --base-build DIR: a CUDA build of BASE made earlier (DIR/bench/dyngrad-perf), used instead of building it here.
# BASE: a commit (git archive'd into OUT_DIR/base-src), or a .tar/.tar.gz of a source tree (`git archive BASE`) for
# a machine without this repository's history (the lent GPU). The head side is built into DYNGRAD_BUILD_DIR
# (default build-perf/), the base side into OUT_DIR/build-base. DYNGRAD_RECORD=docs writes
# performance/perf-against-BASE-GPU.md (a full run only: no --quick, no --only).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib.sh"
dg_command="scripts/run-perf-against.sh $*"
usage="usage: scripts/run-perf-against.sh OUT_DIR BASE [--rounds N] [--quick] [--only NAMES] [--base-build DIR]"
out_arg=${1:?$usage}
base=${2:?$usage}
shift 2
rounds=2
perf_args=()
partial=""
base_build=""
while (($# > 0)); do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --quick) perf_args+=(--quick); partial="--quick"; shift ;;
        --only) perf_args+=(--only "$2"); partial="--only"; shift 2 ;;
        --base-build) base_build=$2; shift 2 ;;
        *) echo "run-perf-against.sh: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
    esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "run-perf-against.sh: --rounds wants a positive integer, got '$rounds'" >&2; exit 2; }
dg_out_dir "$out_arg" || exit 1

base_src=$out/base-src
rm -rf "$base_src"
mkdir -p "$base_src"
if [[ -f "$base" ]]; then
    tar -xf "$base" -C "$base_src" || { echo "run-perf-against.sh: cannot unpack '$base'" >&2; exit 1; }
    base_name=$(basename "$base" | sed -E 's/\.tar(\.gz)?$//')
else
    git -C "$root" archive "$base" | tar -x -C "$base_src" ||
        { echo "run-perf-against.sh: '$base' is neither a source archive nor a commit of this repository" >&2; exit 1; }
    base_name=$(git -C "$root" rev-parse --short "$base")
fi

dg_build_bench dyngrad-perf || exit 1
head_perf=$build/bench/dyngrad-perf
if [[ -n "$base_build" ]]; then
    base_perf=$base_build/bench/dyngrad-perf
    [[ -x "$base_perf" ]] || { echo "run-perf-against.sh: --base-build: no $base_perf" >&2; exit 1; }
else
    echo "==> building the base's dyngrad-perf in $out/build-base"
    cuda_architectures=$(dg_cuda_architectures_arg)
    if ! { cmake -S "$base_src" -B "$out/build-base" -DCMAKE_BUILD_TYPE=Release -DDYNGRAD_CUDA=ON -DDYNGRAD_BUILD_TESTS=OFF \
            -DDYNGRAD_BUILD_BENCH=ON ${cuda_architectures:+"$cuda_architectures"} &&
           cmake --build "$out/build-base" --target dyngrad-perf --parallel "${DYNGRAD_JOBS:-$(nproc)}"; } > "$out/build-base.log" 2>&1; then
        tail -40 "$out/build-base.log"
        echo "run-perf-against.sh: the base did not build (log: $out/build-base.log)" >&2
        exit 1
    fi
    base_perf=$out/build-base/bench/dyngrad-perf
fi

status=0
for ((round = 1; round <= rounds; ++round)); do
    for side in head base; do
        binary=$head_perf
        [[ $side == base ]] && binary=$base_perf
        echo "==> round $round: $side"
        "$binary" "${perf_args[@]}" --json "$out/$side-$round.json" > "$out/$side-$round.txt" 2>&1 || {
            status=1
            tail -20 "$out/$side-$round.txt"
        }
    done
done
"$python" "$root/bench/compare_perf_commits.py" --base-name "$base_name" --out "$out/report.md" \
    --head "$out"/head-*.json --base "$out"/base-*.json || status=1
cat "$out/report.md"
dg_records "$partial" "$out/report.md" "performance/perf-against-$base_name-$(dg_gpu_kind).md" || status=1
exit $status
