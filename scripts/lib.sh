# Shared by the scripts of this folder (source it: . "$(dirname "$0")/lib.sh"): the package-install block
# and the configure/build block they would otherwise each repeat, and the CUDA architecture choice.

# Installs the Debian/Ubuntu packages among "$@" that are not installed yet, with apt-get (as root, or
# through sudo). Fails (exit status 1, with a message) without dpkg-query/apt-get or without root.
dg_install_packages() {
    if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
        echo "$(basename "$0"): this script needs Debian or Ubuntu (dpkg-query and apt-get);" \
             "elsewhere install g++ >= 12, CMake >= 3.24, Eigen 3.4, Catch2, zlib and pkg-config yourself" >&2
        return 1
    fi
    local package status missing=()
    for package in "$@"; do
        status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
        [[ "$status" == "install ok installed" ]] || missing+=("$package")
    done
    if ((${#missing[@]} == 0)); then
        echo "==> build dependencies present: $*"
        return 0
    fi
    local as_root=()
    if [[ $(id -u) -ne 0 ]]; then
        if ! command -v sudo >/dev/null; then
            echo "$(basename "$0"): installing ${missing[*]} needs root: run as root or install sudo" >&2
            return 1
        fi
        as_root=(sudo)
    fi
    echo "==> installing ${missing[*]}"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update &&
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# The CMake argument that picks the CUDA architectures: DYNGRAD_CUDA_ARCHITECTURES when set, else "native"
# (the GPUs of this machine) when nvidia-smi sees one; else nothing, and CMakeLists.txt's default applies.
dg_cuda_architectures_arg() {
    if [[ -n "${DYNGRAD_CUDA_ARCHITECTURES:-}" ]]; then
        echo "-DCMAKE_CUDA_ARCHITECTURES=$DYNGRAD_CUDA_ARCHITECTURES"
    elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        echo "-DCMAKE_CUDA_ARCHITECTURES=native"
    fi
}

# Whether nvidia-smi sees a GPU on this machine.
dg_gpu_visible() {
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# The CMake argument that decides the CUDA backend for the scripts' builds: DYNGRAD_CUDA when set (ON, OFF, AUTO);
# else AUTO (CUDA when nvcc and cuDNN are found) where a GPU is seen, OFF elsewhere: on a machine that cannot run
# the kernels, compiling them is most of the build's time and tests nothing that runs.
dg_cuda_arg() {
    if [[ -n "${DYNGRAD_CUDA:-}" ]]; then
        echo "-DDYNGRAD_CUDA=$DYNGRAD_CUDA"
    elif dg_gpu_visible; then
        echo "-DDYNGRAD_CUDA=AUTO"
    else
        echo "-DDYNGRAD_CUDA=OFF"
    fi
}

# ccache as the compilers' launcher where it is installed (scripts/setup.sh installs it): a second build of the
# same sources (the consumer tests' libraries, another checkout, a rebuild after switching branches) is a copy.
# DYNGRAD_CCACHE=0 turns it off.
# Paths inside the checkout hash as relative ones (CCACHE_BASEDIR), and the working directory is left out of the hash
# of -g builds (CCACHE_NOHASHDIR; the sanitizer build's -g1): a clean clone at another path, as CI's, reuses what an
# earlier clone compiled. The cost: debug information may name that earlier clone's directory.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
dg_launcher_args() {
    if [[ "${DYNGRAD_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null; then
        echo "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
    else
        echo "-DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER="
    fi
}

# Prints how many files the build of BUILD_DIR (for the targets in "$@", e.g. --target dyngrad-verify) still has to
# compile and about how long that takes on this machine's cores, idle. The seconds per file are this project's own
# CPU-time averages from its 2-core machine (docs/reliability.md, "First contact": the library's 45 C++ files took
# 204 s of CPU; the CUDA figure is a round guess from the attention files, 6–171 s each on a loaded machine, and the
# whole CUDA library, 13 min with 2 jobs there); a ccache hit is far faster.
DG_SECONDS_PER_CXX=${DG_SECONDS_PER_CXX:-5}
DG_SECONDS_PER_CUDA=${DG_SECONDS_PER_CUDA:-60}
dg_print_build_estimate() {
    local build_dir=$1
    shift
    local plan cxx cuda cores seconds
    if [[ -f "$build_dir/build.ninja" ]]; then
        # Ninja's dry run stops at the regeneration its glob check always asks for; instead, the compile commands
        # of the targets (`ninja -t commands`) whose object file is not there yet (a fresh directory: all).
        local ninja_targets=() object source
        while (($# > 0)); do
            [[ "$1" == --target ]] && ninja_targets+=("$2") && shift
            shift
        done
        plan=$(cd "$build_dir" && ninja -t commands "${ninja_targets[@]}" 2>/dev/null |
            awk '/ -c /{o=""; for (i = 1; i < NF; ++i) if ($i == "-o") o = $(i + 1); print o, $NF}' |
            while read -r object source; do
                [[ -e "$object" ]] && continue
                [[ "$source" == *.cu ]] && echo "Building CUDA object $object" || echo "Building CXX object $object"
            done || true)
    elif [[ -f "$build_dir/Makefile" ]]; then
        # `make -n` lists the compile steps without running them; -k: past targets whose prerequisites (a library
        # not built yet) stop a dry run.
        plan=$(cmake --build "$build_dir" "$@" -- -n -k 2>/dev/null || true)
    else
        return 0
    fi
    cxx=$(grep -cE 'Building CXX object' <<<"$plan" || true)
    cuda=$(grep -cE 'Building CUDA object' <<<"$plan" || true)
    cores=${DYNGRAD_JOBS:-$(nproc)}
    seconds=$(((cxx * DG_SECONDS_PER_CXX + cuda * DG_SECONDS_PER_CUDA + cores - 1) / cores))
    if ((cxx + cuda == 0)); then
        echo "==> $build_dir is up to date"
    else
        echo "==> building $build_dir: $cxx C++ and $cuda CUDA files to compile on $cores cores," \
             "about $(((seconds + 59) / 60)) min (less for files ccache has seen)"
    fi
}

# Configures and builds one build directory:
#   dg_configure_and_build BUILD_DIR [--log FILE] [--estimate] [--target T]... -- CMAKE_ARGUMENTS...
# Source directory: the repository root. Jobs: DYNGRAD_JOBS (default nproc). Without --log it announces
# each step and CMake prints as it goes; with --log the output goes to FILE, and on failure its last 60
# lines are shown. Exit status: CMake's (0 when both steps succeeded).
dg_configure_and_build() {
    local build_dir=$1 log="" estimate=0 targets=()
    shift
    while (($# > 0)) && [[ "$1" != "--" ]]; do
        case "$1" in
            --log) log=$2; shift 2 ;;
            --estimate) estimate=1; shift ;;
            --target) targets+=(--target "$2"); shift 2 ;;
            *) echo "dg_configure_and_build: unknown option $1" >&2; return 2 ;;
        esac
    done
    [[ "${1:-}" == "--" ]] && shift
    # Ninja as the generator of a new build directory where it is installed (scripts/setup.sh installs ninja-build;
    # an existing directory keeps its generator; a CMAKE_GENERATOR of the caller's wins; exported, so that the
    # consumer tests' nested builds use it too). CMake's Makefiles build the targets of one call one after another:
    # on CI's 2 cores the sanitized library's last unity unit compiled alone for over 5 minutes while the test
    # programs waited for its link; Ninja compiles a target's objects before the libraries it links are built.
    if [[ -z "${CMAKE_GENERATOR:-}" ]] && command -v ninja >/dev/null; then
        export CMAKE_GENERATOR=Ninja
    fi
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local configure=(cmake -S "$root" -B "$build_dir" "$@")
    local build=(cmake --build "$build_dir" "${targets[@]}" --parallel "${DYNGRAD_JOBS:-$(nproc)}")
    if [[ -z "$log" ]]; then
        echo "==> configuring $build_dir"
        "${configure[@]}" || return
        if ((estimate)); then
            dg_print_build_estimate "$build_dir" "${targets[@]}"
        else
            echo "==> building $build_dir"
        fi
        local start=$SECONDS
        "${build[@]}" || return
        echo "==> built $build_dir in $((SECONDS - start)) s"
    else
        { "${configure[@]}" && "${build[@]}"; } > "$log" 2>&1 || { local rc=$?; tail -60 "$log"; return $rc; }
    fi
}

# The output folder of a script that measures: DIR, created, as an absolute path in `out`; and `python` (PYTHON,
# default python3), which runs the PyTorch side.
#   dg_out_dir DIR
dg_out_dir() {
    mkdir -p "$1" && out=$(cd "$1" && pwd) || return 1
    python=${PYTHON:-python3}
}

# The start of a run-*-bench.sh script, given the script's own arguments (OUT_DIR first): sets dg_command (for
# dg_record), `out` and `python` (dg_out_dir: OUT_DIR, default the repository's DEFAULT_DIR), `status` to 0 (the
# script's exit status, which dg_bench_side sets to 1), and builds TARGET (dg_build_bench, which sets `build`).
# The caller then shifts OUT_DIR off its arguments. Exit status 1 when the folder or the build failed.
#   dg_bench_setup DEFAULT_DIR TARGET "$@"
dg_bench_setup() {
    local default_dir=$1 target=$2 repository
    shift 2
    repository=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    dg_command="scripts/$(basename "$0") $*"
    status=0
    dg_out_dir "${1:-$repository/$default_dir}" && dg_build_bench "$target"
}

# One side of a benchmark: "==> TITLE", then the command, its output (stdout and stderr, Python unbuffered so
# that progress shows as it comes) also written to TXT. Sets `status` to 1 when the command failed.
#   dg_bench_side TITLE TXT COMMAND...
dg_bench_side() {
    local title=$1 txt=$2
    shift 2
    echo "==> $title"
    PYTHONUNBUFFERED=1 "$@" 2>&1 | tee "$txt"
    ((PIPESTATUS[0] == 0)) || status=1
}

# The build step of the run-*-bench.sh scripts: configures and builds the bench targets given (Release, CUDA,
# no tests) into DYNGRAD_BUILD_DIR (default build-perf/ under the repository root), logging to BUILD.log.
# Sets `build` to that directory. Exit status 1 (with a message naming the log) when the build failed.
#   dg_build_bench TARGET...
dg_build_bench() {
    local repository cuda_architectures target targets=()
    repository=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    build=${DYNGRAD_BUILD_DIR:-build-perf}
    [[ "$build" == /* ]] || build="$repository/$build"
    for target in "$@"; do targets+=(--target "$target"); done
    echo "==> building $* in $build"
    cuda_architectures=$(dg_cuda_architectures_arg)
    if ! dg_configure_and_build "$build" --log "$build.log" "${targets[@]}" -- -DCMAKE_BUILD_TYPE=Release \
             -DDYNGRAD_CUDA=ON -DDYNGRAD_BUILD_TESTS=OFF -DDYNGRAD_BUILD_BENCH=ON ${cuda_architectures:+"$cuda_architectures"}; then
        echo "$(basename "$0"): build failed (log: $build.log)" >&2
        return 1
    fi
}

# ---- records (docs/performance.md, "Records") ----
# docs/ holds one record per benchmark and GPU kind under a stable name; the script that measures it
# overwrites it, and git keeps the history. A script writes its records only when DYNGRAD_RECORD names a docs
# directory: DYNGRAD_RECORD=docs (a relative path is taken from the repository root), or, on a lent machine
# where only $OUT comes back, DYNGRAD_RECORD=$OUT/docs and then `cp -r <that>/docs/. docs/` here. Without it
# the scripts write their OUT directory only, as before. Partial runs (--quick, --only, a subset of sizes) are
# not recorded.

# The GPU kind in record names: DYNGRAD_GPU_KIND, else the first word of the first GPU's name after "NVIDIA",
# lower case ("NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200); "cpu" without nvidia-smi.
dg_gpu_kind() {
    if [[ -n "${DYNGRAD_GPU_KIND:-}" ]]; then
        echo "$DYNGRAD_GPU_KIND"
        return
    fi
    local name
    # `|| true`: without nvidia-smi the pipeline fails, which a caller's `set -eo pipefail` would turn into an exit
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
    [[ -n "$name" ]] || { echo cpu; return; }
    tr 'A-Z' 'a-z' <<<"$name" | sed -E 's/^nvidia //; s/[ -].*//'
}

# Writes one record when DYNGRAD_RECORD is set (else does nothing and succeeds):
#   dg_record SOURCE PATH      PATH relative to the docs directory, e.g. performance/perf-h100.md
# The date, the commit, the command (the caller's `dg_command`, set before it shifts its arguments) and the
# GPU go inside the record: a .json record gains a "recorded" object first, a .md record a first line. Other
# files (csv, txt, png) and directories are copied as they are; the doc that cites them gives their date.
# DYNGRAD_RECORD_COMMIT names the commit instead of git: for a copy of the tree whose git metadata is not that
# tree's (the lent GPU machines receive the working tree with an older .git).
dg_record() {
    [[ -n "${DYNGRAD_RECORD:-}" ]] || return 0
    local source=$1 path=$2 repository docs target date commit gpu
    repository=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    docs=$DYNGRAD_RECORD
    [[ "$docs" == /* ]] || docs="$repository/$docs"
    target="$docs/$path"
    if [[ ! -e "$source" ]]; then
        echo "$(basename "$0"): no $source: record $path not written" >&2
        return 1
    fi
    mkdir -p "$(dirname "$target")"
    date=$(date -u '+%Y-%m-%d %H:%M UTC')
    commit="$(git -C "$repository" rev-parse --short HEAD 2>/dev/null)$(git -C "$repository" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    [[ -n "${DYNGRAD_RECORD_COMMIT:-}" ]] && commit="$DYNGRAD_RECORD_COMMIT (as given by DYNGRAD_RECORD_COMMIT)"
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/, / (driver /; s/$/)/' || true)
    case "$source" in
        *.json)
            "${PYTHON:-python3}" - "$source" "$target" "$date" "$commit" "${dg_command:-$0}" "${gpu:-no GPU}" <<'PY' || return 1
import json, sys
source, target, date, commit, command, gpu = sys.argv[1:]
data = json.load(open(source))
recorded = {"date": date, "commit": commit, "command": command, "gpu": gpu}
if isinstance(data, dict):  # a list stays as it is (its readers index it)
    data = {"recorded": recorded, **data}
with open(target, "w") as f:
    json.dump(data, f, indent=1)
    f.write("\n")
PY
            ;;
        *.md)
            { echo "Recorded $date on ${gpu:-no GPU} by \`${dg_command:-$0}\`, commit $commit."; echo; cat "$source"; } \
                > "$target" || return 1 ;;
        *)
            rm -rf "$target"
            cp -r "$source" "$target" || return 1 ;;
    esac
    echo "==> record: $path"
}

# The records of one run: dg_record for each SOURCE PATH pair, unless WHY_NOT is non-empty (a partial run),
# when it says that nothing is recorded and why. Does nothing without DYNGRAD_RECORD. Status 1 when a record
# could not be written.
#   dg_records WHY_NOT SOURCE PATH [SOURCE PATH]...
dg_records() {
    [[ -n "${DYNGRAD_RECORD:-}" ]] || return 0
    local why_not=$1 failed=0
    shift
    if [[ -n "$why_not" ]]; then
        echo "==> no record: $why_not"
        return 0
    fi
    while (($# >= 2)); do
        dg_record "$1" "$2" || failed=1
        shift 2
    done
    return $failed
}
