#!/usr/bin/env python3
"""The report of scripts/run-dist-bench.sh: reads OUT/dyngrad_N.txt and OUT/torch_N.txt (the data-parallel rows and
the all-reduce sizes, dyngrad-dist-bench and bench/torch_ddp.py), OUT/dyngrad_zero_N.txt, OUT/dyngrad_zero3_N.txt,
OUT/dyngrad_zero3np_N.txt, OUT/dyngrad_zero3r_N.txt and OUT/torch_fsdp_N.txt (the sharded rows: DDP with AdamW,
ZeRO-1/2, ZeRO-3 keeping each unit's activations (prefetching), the same without prefetch, ZeRO-3 recomputing them, FSDP2) for every N given, and writes OUT/report.md:

- per workload and N: step ms and samples/s of both engines, the scaling efficiency samples/s(N) / (N x samples/s(1))
  (same per-GPU batch), dyngrad's step time over PyTorch's, and the step time with the all-reduce after the backward
  (overlap off);
- per N: the all-reduce bus bandwidth of both by message size;
- per workload and N: step ms and peak MiB of DDP (AdamW), ZeRO-1/2/3 (their step time over DDP's) and PyTorch's
  DDP and FSDP2;
- per workload and N, from OUT/dyngrad_capture_N.txt (dyngrad-dist-bench --capture): the DDP step captured into a CUDA
  graph and replayed, its step ms, samples/s and efficiency, over the eager step, and with overlap off;
and OUT/scaling.png (efficiency against N, one line per workload and engine) when matplotlib imports.

    python3 bench/dist_report.py OUT 1 2 4
A file that is missing (a run that failed) leaves its cells as "-" and is named at the end of the report.
"""
import os
import sys

SHARDED = [("ddp", "dyngrad", "DDP"), ("zero1", "dyngrad", "ZeRO-1"), ("zero2", "dyngrad", "ZeRO-2"),
           ("zero3", "dyngrad", "ZeRO-3"), ("zero3np", "dyngrad", "ZeRO-3 no prefetch"),
           ("zero3r", "dyngrad", "ZeRO-3 recompute"), ("ddp", "torch", "torch DDP"),
           ("fsdp2", "torch", "FSDP2")]


def read(path):
    """({(model, world, mode, optim, overlap): (step_ms, samples_per_s, peak_mib)}, {bytes: busbw_GBps}) of one
    output; a line without mode, optim or peak_mib (an older bench) reads as ddp, sgd, None."""
    steps, bandwidth = {}, {}
    with open(path) as f:
        for line in f:
            fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            if line.startswith("step "):
                key = (fields["model"], int(fields["world"]), fields.get("mode", "ddp"), fields.get("optim", "sgd"),
                       int(fields["overlap"]))
                peak = float(fields["peak_mib"]) if "peak_mib" in fields else None
                steps[key] = (float(fields["step_ms"]), float(fields["samples_per_s"]), peak)
            elif line.startswith("allreduce "):
                bandwidth[int(fields["bytes"])] = float(fields["busbw_GBps"])
    return steps, bandwidth


def read_all(out, counts):
    """{(engine, kind, N): (steps, bandwidth)} for the files present, and the names of those missing."""
    runs, missing = {}, []
    for n in counts:
        for engine, kind, name in (("dyngrad", "ddp", f"dyngrad_{n}.txt"), ("torch", "ddp", f"torch_{n}.txt"),
                                   ("dyngrad", "sharded", f"dyngrad_zero_{n}.txt"),
                                   ("dyngrad", "sharded", f"dyngrad_zero3_{n}.txt"),
                                   ("dyngrad", "sharded", f"dyngrad_zero3np_{n}.txt"),
                                   ("dyngrad", "sharded", f"dyngrad_zero3r_{n}.txt"),
                                   ("torch", "sharded", f"torch_fsdp_{n}.txt"),
                                   ("dyngrad", "captured", f"dyngrad_capture_{n}.txt")):
            path = os.path.join(out, name)
            if os.path.exists(path):
                steps, bandwidth = read(path)
                merged = runs.setdefault((engine, kind, n), ({}, {}))  # ZeRO-3 joins ZeRO-1/2's rows
                merged[0].update(steps)
                merged[1].update(bandwidth)
            else:
                missing.append(name)
    return runs, missing


def ddp_row(steps, model, n, overlap=True):
    """(step_ms, samples_per_s, peak) of the data-parallel row of `model` on n GPUs (world 1: the plain model)."""
    for (m, world, mode, _optim, ov), value in steps.items():
        if m == model and world == n and mode == "ddp" and ov == (int(overlap) if n > 1 else 0):
            return value
    return None


def efficiencies(runs, counts, kind="ddp", engines=("dyngrad", "torch")):
    """{(engine, model): {N: efficiency}} from the data-parallel rows (kind "ddp") or the captured ones ("captured")."""
    table = {}
    for engine in engines:
        models = sorted({k[0] for n in counts for k in runs.get((engine, kind, n), ({}, {}))[0]})
        for model in models:
            base = ddp_row(runs.get((engine, kind, 1), ({}, {}))[0], model, 1)
            for n in counts:
                row = ddp_row(runs.get((engine, kind, n), ({}, {}))[0], model, n)
                if base and row:
                    table.setdefault((engine, model), {})[n] = row[1] / (n * base[1])
    return table


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def scaling_table(runs, counts, eff):
    rows = ["| row | GPUs | dyngrad ms | dyngrad samples/s | dyngrad eff. | torch ms | torch samples/s | torch eff. | "
            "step dyngrad/torch | dyngrad no-overlap ms | torch no-overlap ms |", "|" + " --- |" * 11]
    models = sorted({m for _e, m in eff} | {k[0] for (e, kind, n), r in runs.items() if kind == "ddp" for k in r[0]})
    for model in models:
        for n in counts:
            d = ddp_row(runs.get(("dyngrad", "ddp", n), ({}, {}))[0], model, n)
            t = ddp_row(runs.get(("torch", "ddp", n), ({}, {}))[0], model, n)
            d_off = ddp_row(runs.get(("dyngrad", "ddp", n), ({}, {}))[0], model, n, False) if n > 1 else None
            t_off = ddp_row(runs.get(("torch", "ddp", n), ({}, {}))[0], model, n, False) if n > 1 else None
            rows.append(f"| {model} | {n} | {fmt(d and d[0])} | {fmt(d and d[1], 0)} | "
                        f"{fmt(eff.get(('dyngrad', model), {}).get(n))} | {fmt(t and t[0])} | {fmt(t and t[1], 0)} | "
                        f"{fmt(eff.get(('torch', model), {}).get(n))} | {fmt(d[0] / t[0] if d and t else None)} | "
                        f"{fmt(d_off and d_off[0])} | {fmt(t_off and t_off[0])} |")
    return rows


def allreduce_tables(runs, counts):
    rows = []
    for n in counts:
        if n < 2:
            continue
        dbw = runs.get(("dyngrad", "ddp", n), ({}, {}))[1]
        tbw = runs.get(("torch", "ddp", n), ({}, {}))[1]
        if not dbw and not tbw:  # both runs failed, or an --only without the all-reduce
            continue
        rows += ["", f"| all-reduce bytes ({n} GPUs) | dyngrad busbw GB/s | torch (NCCL) busbw GB/s | ratio |",
                 "| --- | --- | --- | --- |"]
        for size in sorted(set(dbw) | set(tbw)):
            d, t = dbw.get(size), tbw.get(size)
            rows.append(f"| {size} | {fmt(d, 1)} | {fmt(t, 1)} | {fmt(d / t if d and t else None)} |")
    return rows


def sharded_row(steps, model, n, mode):
    for (m, world, md, optim, _ov), value in steps.items():
        if m == model and world == n and md == mode and optim == "adamw" and (md != "ddp" or _ov == (1 if n > 1 else 0)):
            return value
    return None


def sharded_table(runs, counts):
    """Step ms (and, for ZeRO, its ratio to dyngrad's DDP) and peak MiB of DDP, ZeRO-1/2/3, torch DDP and FSDP2."""
    models = sorted({k[0] for (e, kind, n), r in runs.items() if kind == "sharded" for k in r[0]})
    if not models:
        return []
    names = [label for _m, _e, label in SHARDED]
    rows = ["", "| row | GPUs | " + " | ".join(f"{label} ms" for label in names) + " | " +
            " | ".join(f"{label} MiB" for label in names) + " |", "|" + " --- |" * (2 + 2 * len(names))]
    for model in models:
        for n in counts:
            values = [sharded_row(runs.get((engine, "sharded", n), ({}, {}))[0], model, n, mode)
                      for mode, engine, _label in SHARDED]
            ddp = values[0]
            times = []
            for (mode, _engine, _label), v in zip(SHARDED, values):
                cell = fmt(v and v[0])
                if mode.startswith("zero") and v and ddp:
                    cell += f" ({v[0] / ddp[0]:.2f}x)"
                times.append(cell)
            peaks = [fmt(v and v[2], 1) for v in values]
            rows.append(f"| {model} | {n} | " + " | ".join(times) + " | " + " | ".join(peaks) + " |")
    return rows


def captured_table(runs, counts):
    """The DDP step captured (dyngrad-dist-bench --capture): step ms, samples/s, efficiency, captured / eager step,
    and the captured step with overlap off."""
    if not any(runs.get(("dyngrad", "captured", n)) for n in counts):
        return []
    eff = efficiencies(runs, counts, "captured", ("dyngrad",))
    rows = ["", "| row | GPUs | captured ms | captured samples/s | captured eff. | eager ms | captured / eager | "
            "captured no-overlap ms |", "|" + " --- |" * 8]
    models = sorted({k[0] for n in counts for k in runs.get(("dyngrad", "captured", n), ({}, {}))[0]})
    for model in models:
        for n in counts:
            c = ddp_row(runs.get(("dyngrad", "captured", n), ({}, {}))[0], model, n)
            e = ddp_row(runs.get(("dyngrad", "ddp", n), ({}, {}))[0], model, n)
            c_off = ddp_row(runs.get(("dyngrad", "captured", n), ({}, {}))[0], model, n, False) if n > 1 else None
            rows.append(f"| {model} | {n} | {fmt(c and c[0])} | {fmt(c and c[1], 0)} | "
                        f"{fmt(eff.get(('dyngrad', model), {}).get(n))} | {fmt(e and e[0])} | "
                        f"{fmt(c[0] / e[0] if c and e else None)} | {fmt(c_off and c_off[0])} |")
    return rows


def plot(eff, counts, path):
    """The scaling PNG; returns a note when matplotlib is missing (nothing written), else None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no scaling.png"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {model: f"C{i}" for i, model in enumerate(sorted({m for _e, m in eff}))}  # one per workload
    for (engine, model), by_n in sorted(eff.items()):
        ns = sorted(by_n)
        ax.plot(ns, [by_n[n] for n in ns], marker="o", color=colours[model],
                linestyle="-" if engine == "dyngrad" else "--", label=f"{model} ({engine})")
    ax.set_xticks(counts)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("efficiency: samples/s(N) / (N x samples/s(1))")
    ax.set_ylim(0, max([1.1] + [e + 0.05 for by_n in eff.values() for e in by_n.values()]))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def report(out, counts):
    """Writes OUT/report.md (and OUT/scaling.png) and returns the report's text."""
    counts = sorted(set(counts))
    runs, missing = read_all(out, counts)
    eff = efficiencies(runs, counts)
    rows = (scaling_table(runs, counts, eff) + allreduce_tables(runs, counts) + sharded_table(runs, counts) +
            captured_table(runs, counts))
    note = plot(eff, counts, os.path.join(out, "scaling.png"))
    if note:
        rows += ["", note]
    if missing:
        rows += ["", "missing (those runs failed or were not run): " + ", ".join(missing)]
    text = "\n".join(rows) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: dist_report.py OUT N [N...]")
    print(report(sys.argv[1], [int(n) for n in sys.argv[2:]]), end="")
