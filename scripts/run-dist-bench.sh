#!/usr/bin/env bash
# Data-parallel scaling on one host's GPUs (issue 18): builds dyngrad-dist-bench, runs it on 1 and 2 GPUs
# (mpirun), runs bench/torch_ddp.py on the same workloads (torchrun, PyTorch DDP over NCCL), and writes
# OUT/report.md: per row the step time and throughput on 1 and 2 GPUs, the scaling efficiency
# throughput(2) / (2 × throughput(1)), dyngrad's step time against PyTorch's, the time with and without
# overlapping the all-reduce, and the all-reduce bus bandwidth of both by message size.
#   scripts/run-dist-bench.sh OUT        (environment: DYNGRAD_BUILD_DIR (default build-dist), PYTHON, STEPS)
# DYNGRAD_RECORD=docs (scripts/lib.sh, dg_record) also writes performance/dist-bench-GPUx2.md (report.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dg_command="scripts/run-dist-bench.sh $*"
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
out=${1:?usage: scripts/run-dist-bench.sh OUT}
mkdir -p "$out"
build=${DYNGRAD_BUILD_DIR:-build-dist}
python=${PYTHON:-python3}
steps=${STEPS:-30}
mpi_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)

cuda_architectures=$(dg_cuda_architectures_arg)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${cuda_architectures:+"$cuda_architectures"} >"$out/configure.log"
cmake --build "$build" -j"$(nproc)" --target dyngrad-dist-bench >"$out/build.log"
bench=$build/bench/dyngrad-dist-bench

for n in 1 2; do
    echo "==> dyngrad, $n GPU(s)"
    mpirun -np "$n" "${mpi_flags[@]}" -x NCCL_NVLS_ENABLE "$bench" --steps "$steps" | tee "$out/dyngrad_$n.txt"
    echo "==> PyTorch DDP, $n GPU(s)"
    "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" bench/torch_ddp.py --steps "$steps" |
        tee "$out/torch_$n.txt"
done

"$python" - "$out" <<'PY'
import re, sys
out = sys.argv[1]
def read(path):
    steps, bw = {}, {}
    for line in open(path):
        f = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        if line.startswith("step "):
            steps[(f["model"], int(f["world"]), int(f["overlap"]))] = float(f["step_ms"]), float(f["samples_per_s"])
        elif line.startswith("allreduce "):
            bw[int(f["bytes"])] = float(f["busbw_GBps"])
    return steps, bw
d1, _ = read(f"{out}/dyngrad_1.txt"); d2, dbw = read(f"{out}/dyngrad_2.txt")
t1, _ = read(f"{out}/torch_1.txt"); t2, tbw = read(f"{out}/torch_2.txt")
rows = ["| row | dyngrad 1 GPU ms | dyngrad 2 GPU ms | dyngrad eff. | torch 1 GPU ms | torch 2 GPU ms | torch eff. | "
        "step dyngrad/torch (2 GPU) | dyngrad no-overlap ms | torch no-overlap ms |", "|" + " --- |" * 10]
for model in sorted({k[0] for k in d2}):
    a1, a2, b1, b2 = d1[(model, 1, 0)], d2[(model, 2, 1)], t1[(model, 1, 0)], t2[(model, 2, 1)]
    eff_d, eff_t = a2[1] / (2 * a1[1]), b2[1] / (2 * b1[1])
    rows.append(f"| {model} | {a1[0]:.3f} | {a2[0]:.3f} | {eff_d:.3f} | {b1[0]:.3f} | {b2[0]:.3f} | {eff_t:.3f} | "
                f"{a2[0] / b2[0]:.3f} | {d2[(model, 2, 0)][0]:.3f} | {t2[(model, 2, 0)][0]:.3f} |")
rows += ["", "| all-reduce bytes | dyngrad busbw GB/s | torch (NCCL) busbw GB/s | ratio |", "| --- | --- | --- | --- |"]
for size in sorted(dbw):
    rows.append(f"| {size} | {dbw[size]:.1f} | {tbw.get(size, float('nan')):.1f} | {dbw[size] / tbw[size]:.3f} |"
                if size in tbw else f"| {size} | {dbw[size]:.1f} | - | - |")
text = "\n".join(rows) + "\n"
open(f"{out}/report.md", "w").write(text)
print(text)
PY
dg_record "$out/report.md" "performance/dist-bench-$(dg_gpu_kind)x2.md"
