"""Time and peak memory of the default digits LeNet-5 sweep (issue target: <= 3 min on 2 cores).

8 learning rates x 4 dropouts x 3 seeds, 20 epochs, a checkpoint each epoch.
Usage: python benchmarks/bench_sweep.py [--group-size 32] [--epochs 20] [--out benchmarks/results]

With `--preset NAME --workers 1 2`: the first `--lrs` learning rates x every dropout of a
suite preset (one seed, `--epochs` epochs), trained once per `--workers` value into a fresh
folder, back to back: seconds per run for each and the speed-up over the first
(`sweep_workers_NAME_DEVICE.{json,md}`).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.sweeps import SweepConfig, run_sweep  # noqa: E402
from dtg_gpu.sweeps.parallel import worker_threads  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--group-size",
        type=int,
        default=32,
        help="runs of one seed trained at once as one grouped network (1: one by one)",
    )
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--preset", default=None, help="time worker processes on this suite preset")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="with --preset (default 1 2)")
    p.add_argument("--lrs", type=int, default=2, help="with --preset: its first N learning rates (default 2)")
    a = p.parse_args(argv)
    if a.preset:
        return workers_main(a)
    cfg = SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.03, 0.1, 0.3),
        dropouts=(0.0, 0.25, 0.5, 0.75),
        seeds=3,
        epochs=a.epochs,
    )
    tmp = Path(tempfile.mkdtemp(prefix="dtg-bench-sweep-"))
    try:
        t0 = time.perf_counter()
        run_sweep(cfg, tmp, device=a.device, progress=False, group_size=a.group_size)
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {
        "runs": len(cfg.grid()),
        "epochs": a.epochs,
        "group_size": a.group_size,
        "seconds": round(seconds, 1),
        "seconds_per_run": round(seconds / len(cfg.grid()), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "device": a.device or ("cuda" if torch.cuda.is_available() else "cpu"),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps(res, indent=2))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"sweep_digits_lenet5_{res['device']}_g{a.group_size}.json", json.dumps(res, indent=2))


def workers_main(a) -> dict:
    """Seconds per run of part of a preset, once per number of worker processes."""
    base = SweepConfig.preset(a.preset)
    cfg = SweepConfig.preset(a.preset, lrs=base.lrs[: a.lrs], seeds=1, epochs=a.epochs)
    n = len(cfg.grid())
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for w in a.workers:
        tmp = Path(tempfile.mkdtemp(prefix="dtg-bench-workers-"))
        try:
            t0 = time.perf_counter()
            run_sweep(cfg, tmp, device=a.device, progress=False, group_size=a.group_size, workers=w)
            seconds = time.perf_counter() - t0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rows.append({"workers": w, "seconds": round(seconds, 1), "seconds_per_run": round(seconds / n, 2)})
        print(rows[-1], flush=True)
    for r in rows:
        r["speedup"] = round(rows[0]["seconds"] / r["seconds"], 2)
    res = {
        "preset": a.preset,
        "runs": n,
        "epochs": a.epochs,
        "group_size": a.group_size,
        "device": device,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "command": "python benchmarks/bench_sweep.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    lines = [
        f"# Worker processes on `{a.preset}` ({device}, {res['threads']} threads)",
        "",
        f"`{res['command']}` ({res['date']}): {n} runs (the first {a.lrs} learning rates x every dropout, "
        f"one seed), {a.epochs} epochs, trained once per row into a fresh folder, back to back.",
        "",
        "| workers | threads each | seconds | s / run | speed-up |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        each = worker_threads(r["workers"], res["threads"])
        lines.append(f"| {r['workers']} | {each} | {r['seconds']} | {r['seconds_per_run']} | {r['speedup']}x |")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"sweep_workers_{a.preset}_{device}"
    atomic_write(out / f"{stem}.json", json.dumps(res, indent=2))
    atomic_write(out / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return res


if __name__ == "__main__":
    main()
