#!/usr/bin/env bash
# compute-sanitizer's four tools over every tag of the GPU tests, on a machine with a CUDA device.
#   scripts/gpu-sanitize.sh BUILD_DIR OUTDIR
# BUILD_DIR holds a CUDA build (tests/test_gpu); OUTDIR gets one log per tool and tag and summary.txt,
# the table docs/reliability.md records. memcheck runs with --leak-check full. The tests see
# DYNGRAD_UNDER_SANITIZER=1: the large cases shrink sixteenfold and the deliberate out-of-memory case is
# left out (minutes under the tools). The four tools run side by side (one process each, on one GPU).
# Exit status 0 when every run reported 0 errors and 0 leaked bytes.
set -uo pipefail
build=${1:?usage: gpu-sanitize.sh BUILD_DIR OUTDIR}
out=${2:?usage: gpu-sanitize.sh BUILD_DIR OUTDIR}
mkdir -p "$out"
test_gpu="$build/tests/test_gpu"
# Every tag but [gpu] and the subject tags (the folders of tests/ that hold test_gpu's cases), whose cases the finer
# tags run already; [capture] is both a subject and those cases' own tag, so it stays.
mapfile -t tags < <("$test_gpu" --list-tags | grep -o '\[[a-z_0-9]*\]' |
                    grep -vxE '\[(gpu|runtime|core|ops|nn|graph|verification)\]' | sort -u)
echo "tags: ${tags[*]}"
run_tool() {
    local tool=$1 extra=""
    [ "$tool" = memcheck ] && extra="--leak-check full"
    for tag in "${tags[@]}"; do
        local name=${tag//[\[\]]/}
        local log="$out/$tool-$name.txt"
        DYNGRAD_UNDER_SANITIZER=1 timeout "${TOOL_TIMEOUT:-400}" compute-sanitizer --tool "$tool" $extra \
            --error-exitcode 3 "$test_gpu" "$tag" > "$log" 2>&1
        local rc=$?
        local errors leaked
        # racecheck reports "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"
        errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard' "$log" | head -1 | grep -oE '[0-9]+')
        leaked=$(grep -o 'LEAK SUMMARY: [0-9]* bytes' "$log" | grep -o '[0-9]*')
        local tests
        tests=$(grep -E "^(All tests passed|test cases:)" "$log" | tail -1)
        printf '%-10s %-15s exit %-3s errors %-8s leaked %-10s %s\n' "$tool" "$tag" "$rc" "${errors:-?}" \
            "${leaked:--}" "$tests"
    done > "$out/summary-$tool.txt"
}
for tool in memcheck racecheck initcheck synccheck; do run_tool "$tool" & done
wait
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; compute-sanitizer --version | tail -1
  cat "$out"/summary-{memcheck,racecheck,initcheck,synccheck}.txt; } > "$out/summary.txt"
cat "$out/summary.txt"
! grep -vE ' exit 0 +errors 0 +leaked (0|-) ' "$out"/summary-*.txt | grep -q .
