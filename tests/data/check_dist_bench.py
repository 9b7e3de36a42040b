#!/usr/bin/env python3
"""CPU checks of scripts/run-dist-bench.sh's parts (issue 30): the script parses (bash -n), refuses a bad --gpus
before building, plans (--plan) 1, 2 and nvidia-smi's GPU count when larger (a stand-in nvidia-smi), and with
stand-in engines runs every count, names a failed and a timed-out run and still reports the others; bench/torch_ddp.py compiles; bench/dist_report.py, from synthetic dyngrad_N.txt / torch_N.txt /
dyngrad_zero_N.txt / dyngrad_zero3_N.txt / dyngrad_zero3r_N.txt /
torch_fsdp_N.txt files with random step times (N = 1, 2, 4), gives in report.md each row's
efficiency samples/s(N) / (N x samples/s(1)), dyngrad/torch step ratio, no-overlap times, all-reduce ratios,
ZeRO/DDP step ratios and peak MiB as computed here from the same numbers, names a missing file, and writes
scaling.png when matplotlib imports.

    check_dist_bench.py
"""
import os
import py_compile
import random
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(root, "bench"))
import dist_report  # noqa: E402

MODELS = {"mlp4096x4_tf32": 4096, "lenet_b256": 256, "gpt_char_bf16": 32}
COUNTS = (1, 2, 4)


def step_line(model, n, mode, optim, overlap, ms, peak):
    batch = MODELS[model]
    return (f"step model={model} world={n} mode={mode} optim={optim} overlap={overlap} batch_per_gpu={batch} "
            f"step_ms={ms:.4f} samples_per_s={1000.0 * batch * n / ms:.1f} peak_mib={peak:.1f}\n")


def synthetic(work, rng):
    """Writes the four files per count with random times; returns {(engine, model, n, mode, overlap): (ms, peak)}
    and {(engine, n, bytes): busbw}."""
    truth, bandwidth = {}, {}
    for n in COUNTS:
        for engine in ("dyngrad", "torch"):
            lines = [f"# {engine} header line, ignored\n"]
            for model in MODELS:
                optim = "adamw" if model.startswith("gpt") else "sgd"
                for overlap in ((1, 0) if n > 1 else (0,)):
                    ms, peak = round(rng.uniform(0.3, 40.0), 4), round(rng.uniform(100, 9000), 1)
                    truth[(engine, model, n, "ddp", overlap)] = (ms, peak)
                    lines.append(step_line(model, n, "ddp", optim, overlap, ms, peak))
            if n > 1:
                for size in (1 << 16, 1 << 18, 1 << 20):
                    bw = round(rng.uniform(1, 400), 2)
                    bandwidth[(engine, n, size)] = bw
                    lines.append(f"allreduce bytes={size} world={n} ms=0.1 algbw_GBps=1 busbw_GBps={bw:.2f}\n")
            with open(os.path.join(work, f"{engine}_{n}.txt"), "w") as f:
                f.writelines(lines)
            sharded = []
            for model in MODELS:
                modes = ("ddp", "zero1", "zero2", "zero3", "zero3np", "zero3r") if engine == "dyngrad" else ("ddp", "fsdp2")
                for mode in modes:
                    ms, peak = round(rng.uniform(0.3, 40.0), 4), round(rng.uniform(100, 9000), 1)
                    truth[(engine, model, n, "sharded-" + mode, 0)] = (ms, peak)
                    sharded.append(step_line(model, n, mode, "adamw", int(mode == "ddp" and n > 1), ms, peak))
            if engine == "dyngrad":  # ZeRO-3, kept and recomputing, from runs of their own
                with open(os.path.join(work, f"dyngrad_zero_{n}.txt"), "w") as f:
                    f.writelines(line for line in sharded if "mode=zero3" not in line)
                with open(os.path.join(work, f"dyngrad_zero3_{n}.txt"), "w") as f:
                    f.writelines(line for line in sharded if "mode=zero3 " in line)
                with open(os.path.join(work, f"dyngrad_zero3np_{n}.txt"), "w") as f:
                    f.writelines(line for line in sharded if "mode=zero3np " in line)
                with open(os.path.join(work, f"dyngrad_zero3r_{n}.txt"), "w") as f:
                    f.writelines(line for line in sharded if "mode=zero3r " in line)
            else:
                with open(os.path.join(work, f"torch_fsdp_{n}.txt"), "w") as f:
                    f.writelines(sharded)
        captured = ["# captured run\n"]  # dyngrad-dist-bench --capture: the DDP rows, replayed
        for model in MODELS:
            optim = "adamw" if model.startswith("gpt") else "sgd"
            for overlap in ((1, 0) if n > 1 else (0,)):
                ms = round(rng.uniform(0.3, 40.0), 4)
                truth[("dyngrad", model, n, "captured", overlap)] = (ms, 1.0)
                captured.append(step_line(model, n, "ddp", optim, overlap, ms, 1.0))
        with open(os.path.join(work, f"dyngrad_capture_{n}.txt"), "w") as f:
            f.writelines(captured)
    return truth, bandwidth


FAKE_MPIRUN = """#!/bin/sh
# mpirun -np N [options] BENCH ARGS...: runs BENCH ARGS with FAKE_WORLD=N
while [ "$1" != "-np" ]; do shift; done
FAKE_WORLD=$2; export FAKE_WORLD; shift 2
while [ "${1#-}" != "$1" ]; do [ "$1" = -x ] && shift; shift; done
exec "$@"
"""
# The stand-in engines print a step line per workload and mode; stage 3 fails, FSDP2 hangs past RUN_TIMEOUT.
FAKE_BENCH = """#!/bin/sh
case "$*" in *"--zero 3"*) echo "zero3 fails here" >&2; exit 1 ;; esac
modes="ddp"; case "$*" in *"--zero 0,1,2"*) modes="ddp zero1 zero2" ;; esac
for mode in $modes; do
  echo "step model=gpt_char_bf16 world=$FAKE_WORLD mode=$mode optim=adamw overlap=$((FAKE_WORLD > 1)) batch_per_gpu=32 step_ms=$((2 * FAKE_WORLD)).0 samples_per_s=$((16000)).0 peak_mib=10.0"
done
"""
FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *torch.distributed.run*)
    while [ "$1" != "--nproc-per-node" ]; do shift; done; n=$2
    case "$*" in *--fsdp*) exec sleep 30 ;; esac
    echo "step model=gpt_char_bf16 world=$n mode=ddp optim=adamw overlap=$((n > 1)) batch_per_gpu=32 step_ms=4.0 samples_per_s=$((8000 * n)).0 peak_mib=12.0" ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def script_run(rng):
    """The script's control flow with stand-in mpirun, bench and python (DYNGRAD_DIST_BENCH: nothing built): every
    run for every count, a failed run and a timed-out one named (their output kept as NAME.failed.txt), the report
    over the others, exit 1."""
    with tempfile.TemporaryDirectory() as work:
        bin_dir = os.path.join(work, "bin")
        os.mkdir(bin_dir)
        for name, text in (("mpirun", FAKE_MPIRUN), ("dyngrad-dist-bench", FAKE_BENCH), ("python", FAKE_PYTHON)):
            with open(os.path.join(bin_dir, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(bin_dir, name), 0o755)
        out = os.path.join(work, "out")
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], PYTHON=os.path.join(bin_dir, "python"),
                   REAL_PYTHON=sys.executable, DYNGRAD_DIST_BENCH=os.path.join(bin_dir, "dyngrad-dist-bench"),
                   RUN_TIMEOUT="1", DYNGRAD_RECORD="")
        result = subprocess.run([os.path.join(root, "scripts", "run-dist-bench.sh"), out, "--gpus", "1 2"],
                                capture_output=True, text=True, env=env)
        assert result.returncode == 1, result
        assert ("failed: dyngrad_zero3_1 dyngrad_zero3np_1 dyngrad_zero3r_1 torch_fsdp_1 dyngrad_zero3_2 dyngrad_zero3np_2 "
                "dyngrad_zero3r_2 torch_fsdp_2" in result.stderr), result.stderr
        assert "zero3 fails here" in open(os.path.join(out, "dyngrad_zero3_2.failed.txt")).read()
        report = open(os.path.join(out, "report.md")).read()
        assert ("missing (those runs failed or were not run): dyngrad_zero3_1.txt, dyngrad_zero3np_1.txt, "
                "dyngrad_zero3r_1.txt, torch_fsdp_1.txt") in report, report
        rows = {tuple(r[:2]): r for r in table_rows(report, "| row | GPUs | dyngrad ms")}
        # dyngrad: 2 ms on 1 GPU, 4 ms on 2 (16000 samples/s both): efficiency 0.5; torch: 8000·n samples/s: 1.0.
        assert rows[("gpt_char_bf16", "2")][4] == "0.500" and rows[("gpt_char_bf16", "2")][7] == "1.000", rows
        assert rows[("gpt_char_bf16", "2")][8] == "1.000", rows
        sharded = table_rows(report, "| row | GPUs | DDP ms")
        assert sharded[1][:6] == ["gpt_char_bf16", "2", "4.000", "4.000 (1.00x)", "4.000 (1.00x)", "-"], sharded
        assert "all-reduce bytes" not in report, report  # no sizes measured: no empty table
        captured = {tuple(r[:2]): r for r in table_rows(report, "| row | GPUs | captured ms")}
        assert captured[("gpt_char_bf16", "2")][2:5] == ["4.000", "16000", "0.500"], captured


def table_rows(text, first_header):
    """The rows (lists of cells) of the table whose header starts with first_header."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def close(cell, value, digits=3):
    assert abs(float(cell.split()[0]) - value) <= 0.6 * 10 ** -digits + 1e-4 * abs(value), (cell, value)


def main():
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    subprocess.run(["bash", "-n", os.path.join(root, "scripts", "run-dist-bench.sh")], check=True)
    bad = subprocess.run([os.path.join(root, "scripts", "run-dist-bench.sh"), "/nonexistent-out", "--gpus", "1 x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--gpus: 'x' is not a GPU count" in bad.stderr, bad
    # The default counts: 1, 2 and nvidia-smi's GPU count when larger (a stand-in nvidia-smi lists `gpus` GPUs).
    with tempfile.TemporaryDirectory() as bin_dir:
        for gpus, expected in ((0, "1 2"), (2, "1 2"), (rng.randrange(3, 9), None)):
            env = dict(os.environ, DYNGRAD_GPU_KIND="h200", PATH=bin_dir + os.pathsep + os.environ["PATH"])
            smi = os.path.join(bin_dir, "nvidia-smi")
            if gpus:
                with open(smi, "w") as f:
                    f.write("#!/bin/sh\n" + "echo 'NVIDIA H200'\n" * gpus)
                os.chmod(smi, 0o755)
            plan = subprocess.run([os.path.join(root, "scripts", "run-dist-bench.sh"), "/nonexistent-out", "--plan"],
                                  capture_output=True, text=True, env=env, check=True).stdout
            expected = expected or f"1 2 {gpus}"
            assert f"counts: {expected}\n" in plan, (gpus, plan)
            assert f"record: performance/dist-bench-h200x{expected.split()[-1]}.md" in plan, plan
            assert plan.count("-x NCCL_NVLS_ENABLE") == len(expected.split()), plan
            assert plan.count("dyngrad_zero3_") == len(expected.split()), plan
    plan = subprocess.run([os.path.join(root, "scripts", "run-dist-bench.sh"), "/nonexistent-out", "--gpus", "4 1 2",
                           "--plan"], capture_output=True, text=True, check=True,
                          env=dict(os.environ, DYNGRAD_GPU_KIND="h100")).stdout
    assert "counts: 4 1 2\n" in plan and "dist-bench-h100x4.md" in plan, plan
    script_run(rng)
    with tempfile.TemporaryDirectory() as work:
        py_compile.compile(os.path.join(root, "bench", "torch_ddp.py"), cfile=os.path.join(work, "t.pyc"),
                           doraise=True)
        truth, bandwidth = synthetic(work, rng)
        text = dist_report.report(work, list(COUNTS))
        assert open(os.path.join(work, "report.md")).read() == text

        rows = table_rows(text, "| row | GPUs | dyngrad ms")
        assert len(rows) == len(MODELS) * len(COUNTS), rows
        for row in rows:
            model, n = row[0], int(row[1])
            ov = 1 if n > 1 else 0
            d, t = truth[("dyngrad", model, n, "ddp", ov)], truth[("torch", model, n, "ddp", ov)]
            close(row[2], d[0])
            close(row[5], t[0])
            for engine, cell in (("dyngrad", row[4]), ("torch", row[7])):
                one = truth[(engine, model, 1, "ddp", 0)][0]
                # Same per-GPU batch: efficiency = (batch·n / ms_n) / (n · batch / ms_1) = ms_1 / ms_n.
                close(cell, one / truth[(engine, model, n, "ddp", ov)][0])
            close(row[8], d[0] / t[0])
            if n > 1:
                close(row[9], truth[("dyngrad", model, n, "ddp", 0)][0])
                close(row[10], truth[("torch", model, n, "ddp", 0)][0])
            else:
                assert row[9] == row[10] == "-", row

        for n in COUNTS[1:]:
            rows = table_rows(text, f"| all-reduce bytes ({n} GPUs)")
            assert len(rows) == 3, rows
            for row in rows:
                d, t = bandwidth[("dyngrad", n, int(row[0]))], bandwidth[("torch", n, int(row[0]))]
                close(row[3], d / t)

        rows = table_rows(text, "| row | GPUs | DDP ms")
        assert len(rows) == len(MODELS) * len(COUNTS), rows
        modes = [("dyngrad", "ddp"), ("dyngrad", "zero1"), ("dyngrad", "zero2"), ("dyngrad", "zero3"),
                 ("dyngrad", "zero3np"), ("dyngrad", "zero3r"), ("torch", "ddp"), ("torch", "fsdp2")]
        for row in rows:
            model, n = row[0], int(row[1])
            values = [truth[(engine, model, n, "sharded-" + mode, 0)] for engine, mode in modes]
            for i, (ms, peak) in enumerate(values):
                close(row[2 + i], ms)
                close(row[2 + len(modes) + i], peak, 1)
            for i in (1, 2, 3, 4, 5):  # ZeRO-k (ZeRO-3 with prefetch, recomputing): its step time over dyngrad's DDP
                ratio = float(row[2 + i].split("(")[1].rstrip("x)"))
                assert abs(ratio - values[i][0] / values[0][0]) <= 0.006, (row, values)

        rows = table_rows(text, "| row | GPUs | captured ms")
        assert len(rows) == len(MODELS) * len(COUNTS), rows
        for row in rows:
            model, n = row[0], int(row[1])
            ov = 1 if n > 1 else 0
            c, e = truth[("dyngrad", model, n, "captured", ov)][0], truth[("dyngrad", model, n, "ddp", ov)][0]
            close(row[2], c)
            close(row[4], truth[("dyngrad", model, 1, "captured", 0)][0] / c)  # ms_1 / ms_n, as above
            close(row[5], e)
            close(row[6], c / e)
            if n > 1:
                close(row[7], truth[("dyngrad", model, n, "captured", 0)][0])
            else:
                assert row[7] == "-", row

        try:
            import matplotlib  # noqa: F401
            assert os.path.getsize(os.path.join(work, "scaling.png")) > 1000
        except ImportError:
            assert "matplotlib is not installed" in text

        # A failed run's file is missing: its cells read "-" and the report names it.
        os.remove(os.path.join(work, "torch_4.txt"))
        text = dist_report.report(work, list(COUNTS))
        assert "missing (those runs failed or were not run): torch_4.txt" in text, text
        for row in table_rows(text, "| row | GPUs | dyngrad ms"):
            if row[1] == "4":
                assert row[5] == row[7] == row[8] == "-" and row[2] != "-", row
    print("dist bench parts: ok")


if __name__ == "__main__":
    main()
