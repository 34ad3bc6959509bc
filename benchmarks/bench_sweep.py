"""Time and peak memory of the default digits LeNet-5 sweep (issue target: <= 3 min on 2 cores).

8 learning rates x 4 dropouts x 3 seeds, 20 epochs, a checkpoint each epoch.
Usage: python benchmarks/bench_sweep.py [--group-size 32] [--epochs 20] [--out benchmarks/results]
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
from dtg_gpu.sweeps import SweepConfig, run_sweep  # noqa: E402


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
    a = p.parse_args(argv)
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
    (out / f"sweep_digits_lenet5_{res['device']}_g{a.group_size}.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
