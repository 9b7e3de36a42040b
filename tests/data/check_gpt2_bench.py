#!/usr/bin/env python3
"""CPU checks of scripts/run-gpt2-bench.sh's parts (issue 32): the script parses (bash -n); bench/torch_gpt.py's
token-file reader agrees with dyngrad-tokens on fresh random text and refuses a bad header naming the file;
bench/gpt2_report.py's throughput, MFU and report from a tiny char_gpt --model gpt2 run and a synthetic llm.c log,
its table of each engine's SM clock from synthetic nvidia-smi samples, its four-GPU table (efficiency, ratio to
llm.c) from synthetic multi-GPU runs and its reproducible-mode section;
and, when torch is importable, bench/torch_gpt.py --model gpt2 trains the tiny model on the CPU from the weights and
batches it prepared, with llm.c's parameter count.

    check_gpt2_bench.py DYNGRAD_TOKENS CHAR_GPT
"""
import importlib.util
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(root, "bench"))
import gpt2_report  # noqa: E402
import torch_gpt  # noqa: E402


def run(*command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def main():
    tokens_tool, char_gpt = sys.argv[1], sys.argv[2]
    run("bash", "-n", os.path.join(root, "scripts", "run-gpt2-bench.sh"))
    rng = random.Random()
    seed = rng.randrange(2**32)
    print(f"seed {seed}")
    rng.seed(seed)
    with tempfile.TemporaryDirectory() as work:
        # Fresh random text: printable words and random bytes, long enough for windows of 33 tokens.
        text = bytearray()
        while len(text) < 60000:
            text += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
            text += " ".join("".join(rng.choice("etaoinsh") for _ in range(rng.randrange(2, 6)))
                             for _ in range(rng.randrange(1, 6))).encode()
        with open(os.path.join(work, "text"), "wb") as f:
            f.write(text)
        train, val = os.path.join(work, "train.bin"), os.path.join(work, "val.bin")
        printed = run(tokens_tool, "--text", os.path.join(work, "text"), "--out", train, "--val-out", val)
        counts = [int(n) for n in re.findall(r"(\d+) (?:tokens )?in ", printed)[-2:]]
        assert [torch_gpt.read_token_header(train), torch_gpt.read_token_header(val)] == counts, (printed, counts)
        assert sum(counts) == len(text), "bytes: one token per byte"

        bad = os.path.join(work, "bad.bin")
        raw = bytearray(open(train, "rb").read())
        raw[0:4] = struct.pack("<i", 20240519)
        open(bad, "wb").write(raw)
        for contents, message in ((raw, "bad magic 20240519"), (open(train, "rb").read()[:-1], "make")):
            open(bad, "wb").write(contents)
            try:
                torch_gpt.read_token_header(bad)
            except ValueError as e:
                assert "bad.bin" in str(e) and message in str(e), e
            else:
                sys.exit(f"FAILED: read_token_header accepted a file with {message!r} expected")

        # A tiny GPT-2-shaped run, and the report over it and a synthetic llm.c log.
        B, T, steps, warmup = 4, 32, 14, 3
        out = os.path.join(work, "out")
        os.mkdir(out)
        model = ["--layers", "2", "--heads", "2", "--width", "32", "--context", str(T)]
        run(char_gpt, "--model", "gpt2", *model, "--train-tokens", train, "--val-tokens", val, "--vocab", "256",
            "--batch", str(B), "--steps", str(steps), "--warmup", "2", "--eval-every", str(steps), "--eval-batches", "1",
            "--device", "cpu", "--csv", os.path.join(out, "dyngrad.csv"))
        run(char_gpt, "--model", "gpt2", *model, "--train-tokens", train, "--val-tokens", val, "--vocab", "256",
            "--batch", str(B), "--steps", str(steps), "--warmup", "2", "--eval-every", str(steps), "--eval-batches", "1",
            "--device", "cpu", "--precision", "bf16", "--reduced-residual", "--csv",
            os.path.join(out, "dyngrad_reduced.csv"))
        llmc_ms = [rng.uniform(50, 150) for _ in range(steps)]
        with open(os.path.join(out, "llmc.txt"), "w") as f:
            f.write("val loss 5.5\n")
            for k, ms in enumerate(llmc_ms):
                f.write(f"step {k + 1:4d}/{steps} | loss 5.1 (+0.00z)| norm 1.0 (+0.00z)| lr 6.00e-04 | {ms:.2f} ms | "
                        f"40.0% bf16 MFU | 1000 tok/s\n")
        with open(os.path.join(out, "llmc_build.txt"), "w") as f:
            f.write("cudnn=0\n")
        gpt2_report.main([out, "--batch", str(B), "--context", str(T), "--layers", "2", "--width", "32", "--vocab", "256",
                          "--warmup-steps", str(warmup)])
        import json
        summary = json.load(open(os.path.join(out, "report.json")))
        timed = [round(ms, 2) / 1000 for ms in llmc_ms[warmup:]]
        expected = len(timed) * B * T / sum(timed)
        llmc = summary["engines"]["llmc"]
        assert abs(llmc["tokens_per_second"] - expected) <= 1e-9 * expected, (llmc, expected)
        per_token = 6 * summary["parameters"] + 12 * 2 * 32 * T
        assert abs(llmc["mfu"] - expected * per_token / 989e12) <= 1e-12, llmc
        ours = summary["engines"]["dyngrad"]
        assert ours["steps"] == steps and ours["timed_steps"] == steps - warmup and ours["tokens_per_second"] > 0, ours
        assert summary["llmc_cudnn_attention"] is False
        reduced = summary["engines"]["dyngrad_reduced"]
        assert reduced["timed_steps"] == steps - warmup and reduced["tokens_per_second"] > 0, reduced
        text = gpt2_report.markdown(summary)
        ratio = reduced["tokens_per_second"] / llmc["tokens_per_second"]
        assert f"dyngrad, reduced residual / llm.c train_gpt2cu: {ratio:.2f}x" in text, text
        assert "GPU 0 while each engine ran" not in text, "no samples, no clocks table"

        # nvidia-smi's samples (MiB, SM MHz, W, reasons): idle seconds at low power around busy ones with random
        # clocks, some at the power cap (bit 0x4); an older driver's memory-only samples give no clocks.
        busy = [(rng.choice([1980, 1755, 1500, 1425]), round(rng.uniform(600, 700), 2), rng.choice([0, 0x4, 0x44, 0x40]))
                for _ in range(rng.randrange(5, 30))]
        idle = [(345, round(rng.uniform(70, 120), 2), 0x1) for _ in range(rng.randrange(1, 10))]
        with open(os.path.join(out, "llmc.samples"), "w") as f:
            for clock, power, reasons in idle + busy + idle:
                f.write(f"{rng.randrange(1000, 90000)}, {clock}, {power:.2f}, 0x{reasons:016x}\n")
        with open(os.path.join(out, "dyngrad.samples"), "w") as f:
            f.write("1234\n5678\n")
        clocks = gpt2_report.gpu_clocks(out, "llmc")
        want = sorted(clock for clock, _, _ in busy)
        assert clocks == {"busy_samples": len(busy), "sm_clock_median_mhz": want[len(want) // 2],
                          "sm_clock_lowest_mhz": want[0],
                          "power_capped_share": sum(1 for _, _, r in busy if r & 0x4) / len(busy),
                          "peak_power_w": max(power for _, power, _ in busy)}, (clocks, busy)
        assert gpt2_report.gpu_clocks(out, "dyngrad") is None and gpt2_report.gpu_clocks(out, "torch") is None
        summary = gpt2_report.summarise(out, B, T, 2, 32, 256, warmup, 989)
        text = gpt2_report.markdown(summary)
        row = (f"| llm.c train_gpt2cu | {len(busy)} | {want[len(want) // 2]:.0f} | {want[0]:.0f} | "
               f"{clocks['power_capped_share']:.0%} | {clocks['peak_power_w']:.0f} |")
        assert row in text and "| dyngrad (char_gpt --model gpt2) | " not in text.split("GPU 0 while")[1], text

        # G GPUs: a synthetic llm.c log (B·T·G tokens a step) and a char_gpt CSV of random per-step rates; the
        # reproducible phase's file, the two deterministic runs differing from step 7.
        G = 4
        multi_ms = [rng.uniform(60, 200) for _ in range(steps)]
        with open(os.path.join(out, "llmc_multi.txt"), "w") as f:
            f.write(f"batch_size B={B} * seq_len T={T} * num_processes={G} and total_batch_size={B * T * G}\n")
            for k, ms in enumerate(multi_ms):
                f.write(f"step {k + 1:4d}/{steps} | loss 5.1 (+0.00z)| norm 1.0 (+0.00z)| lr 6.00e-04 | {ms:.2f} ms | "
                        f"40.0% bf16 MFU | 1000 tok/s\n")
        multi_rates = [rng.uniform(1e5, 4e5) for _ in range(steps)]
        with open(os.path.join(out, "dyngrad_multi.csv"), "w") as f:
            f.write("step,train_loss,val_loss,lr,tokens_per_second,loss_scale,skipped_steps\n")
            for k, r in enumerate(multi_rates):
                f.write(f"{k + 1},5.0,,0.0006,{r:.1f},1,0\n")
        rates = {"deterministic_1": rng.uniform(1e5, 2e5), "normal": rng.uniform(2e5, 3e5),
                 "deterministic_2": rng.uniform(1e5, 2e5)}
        with open(os.path.join(out, "reproducible.txt"), "w") as f:
            f.write(f"# a comment\nidentical=no\nparameters_identical=yes\nsteps={steps}\nfirst_differing_step=7\n")
            f.write("".join(f"tokens_per_second_{run}={r:.1f}\n" for run, r in rates.items()))
        gpt2_report.main([out, "--batch", str(B), "--context", str(T), "--layers", "2", "--width", "32", "--vocab", "256",
                          "--warmup-steps", str(warmup), "--gpus", str(G)])
        summary = json.load(open(os.path.join(out, "report.json")))
        multi = summary["multi_gpu"]
        timed = [round(ms, 2) / 1000 for ms in multi_ms[warmup:]]
        llmc_multi = len(timed) * B * T * G / sum(timed)
        close = lambda a, b: abs(a - b) <= 1e-9 * abs(b)  # noqa: E731
        assert close(multi["llmc_multi"]["tokens_per_second"], llmc_multi), (multi, llmc_multi)
        assert close(multi["llmc_multi"]["efficiency"], llmc_multi / (G * expected)), multi
        dyngrad_multi = (steps - warmup) / sum(1 / round(r, 1) for r in multi_rates[warmup:])
        assert close(multi["dyngrad_multi"]["tokens_per_second"], dyngrad_multi), (multi, dyngrad_multi)
        assert close(multi["dyngrad_multi"]["efficiency"], dyngrad_multi / (G * ours["tokens_per_second"])), multi
        assert close(multi["dyngrad_multi"]["ratio_to_llmc_multi"], dyngrad_multi / llmc_multi), multi
        assert multi["dyngrad_multi"]["timed_steps"] == steps - warmup, multi
        repro = summary["reproducible"]
        relative = (round(rates["deterministic_1"], 1) + round(rates["deterministic_2"], 1)) / 2 / round(rates["normal"], 1)
        assert repro["identical"] is False and repro["first_differing_step"] == 7 and repro["steps"] == steps, repro
        assert repro["parameters_identical"] is True, repro
        assert close(repro["relative_to_normal"], relative), (repro, relative)
        text = gpt2_report.markdown(summary)
        assert f"## {G} GPUs" in text and "no (first at step 7)" in text and f"{relative:.3f} of the normal" in text, text
        assert "final parameters bit for bit identical: yes" in text, text

        if importlib.util.find_spec("torch") is None:
            print("torch is not importable here: bench/torch_gpt.py --model gpt2 not run (the GPU machine runs it)")
        else:
            config = ["--model", "gpt2", *model, "--train-tokens", train, "--val-tokens", val, "--vocab", "256",
                      "--batch", str(B), "--steps", "6", "--warmup", "1", "--eval-every", "6", "--eval-batches", "1",
                      "--lr", "3e-3", "--precision", "f32"]
            prepared = os.path.join(work, "prepared")
            printed = run(sys.executable, os.path.join(root, "bench", "torch_gpt.py"), *config, "--prepare", prepared)
            parameters = int(re.search(r"\((\d+) parameters\)", printed).group(1))
            assert parameters == gpt2_report.gpt2_parameters(2, 32, T, 256), printed
            shared = ["--init-weights", os.path.join(prepared, "init.safetensors"),
                      "--batch-order", os.path.join(prepared, "batch_order.txt")]
            for program in ([sys.executable, os.path.join(root, "bench", "torch_gpt.py")], [char_gpt]):
                run(*program, *config, *shared, "--device", "cpu",
                    "--csv", os.path.join(work, f"curve_{len(program)}.csv"))
            first = [gpt2_report.csv_rows(os.path.join(work, f"curve_{n}.csv")) for n in (2, 1)]
            agreement = gpt2_report.curve_agreement(first[1], first[0])
            assert agreement["max_train_relative"] < 1e-3, agreement
            print(f"PyTorch and dyngrad from the same weights and batches: {agreement}")
    print("gpt2 bench parts: OK")


if __name__ == "__main__":
    main()
