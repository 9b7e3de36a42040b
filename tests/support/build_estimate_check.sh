#!/usr/bin/env bash
# scripts/lib.sh's build estimate on a project of two source files, with each generator installed here: before the
# build it counts both files (for a --target: that target's one file), after it says "up to date". Ninja's path
# reads `ninja -t commands` (its dry run stops at a glob check's regeneration, which this project has too).
# Usage: build_estimate_check.sh WORK_DIR
set -uo pipefail
work=${1:?usage: build_estimate_check.sh WORK_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/lib.sh"
rm -rf "$work" && mkdir -p "$work/src" || exit 1
cat > "$work/src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(estimate CXX)
file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
add_library(first STATIC first.cpp)
add_executable(second second.cpp)
target_link_libraries(second PRIVATE first)
CMAKE
echo 'int first() { return 1; }' > "$work/src/first.cpp"
echo 'int first(); int main() { return first() - 1; }' > "$work/src/second.cpp"
generators=("Unix Makefiles")
command -v ninja >/dev/null && generators+=(Ninja)
failures=0
expect() {  # expect WHAT PATTERN TEXT
    if [[ "$3" =~ $2 ]]; then
        echo "ok: $1: $3"
    else
        echo "FAILED: $1: expected /$2/, got: $3"
        failures=$((failures + 1))
    fi
}
for generator in "${generators[@]}"; do
    build="$work/build-${generator// /-}"
    cmake -S "$work/src" -B "$build" -G "$generator" >/dev/null || { echo "FAILED: configure with $generator"; exit 1; }
    expect "$generator, fresh" "2 C\+\+ and 0 CUDA files" "$(DYNGRAD_JOBS=2 dg_print_build_estimate "$build")"
    expect "$generator, fresh, --target first" "1 C\+\+ and 0 CUDA files" \
        "$(DYNGRAD_JOBS=2 dg_print_build_estimate "$build" --target first)"
    cmake --build "$build" >/dev/null || { echo "FAILED: build with $generator"; exit 1; }
    expect "$generator, built" "is up to date" "$(dg_print_build_estimate "$build")"
done
exit $((failures > 0))
