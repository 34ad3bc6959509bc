"""The pruner's online fits on one BLAS thread: a replayed study, timed with and without the limit.

``StoppingRule`` refits a small logistic regression (a few dozen finished runs) whenever a run
finishes. OpenBLAS would run those fits on every core; in a training process (or beside one)
its threads wait for cores the training holds, and a fit of a 96 x 600 matrix is faster on one
thread anyway. The rule therefore fits under ``threadpool_limits(1, "blas")``. This script
replays one ordering of a recorded sweep as an Optuna study (``bench_early_stopping.replay``)
with the limit and with it lifted, alternating, and saves the wall times.

Usage: python benchmarks/bench_rule_threads.py SWEEP_DIR [--repeats 2] [--out benchmarks/results]
       [--work DIR]   (run it beside a training process for the case it is made for)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_early_stopping as replaying  # noqa: E402
import threadpoolctl  # noqa: E402

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.integrations.optuna import DTGPruner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "dtg-bench-early-stopping"))
    a = ap.parse_args()
    sweep = replaying.sweep_records(Path(a.sweep), Path(a.work))
    order = np.random.default_rng(0).permutation(len(sweep["runs"]))
    limited = threadpoolctl.threadpool_limits
    replaying.replay(sweep, order[:12], DTGPruner(use_values=False))  # imports, caches
    times: dict[str, list[float]] = {"one BLAS thread (shipped)": [], "every BLAS thread": []}
    for _ in range(a.repeats):
        for label, limit in (
            ("every BLAS thread", lambda **_: contextlib.nullcontext()),
            ("one BLAS thread (shipped)", limited),
        ):
            threadpoolctl.threadpool_limits = limit
            t = time.perf_counter()
            replaying.replay(sweep, order, DTGPruner(use_values=False))
            times[label].append(time.perf_counter() - t)
            print(f"{label:28s} {times[label][-1]:.1f} s", flush=True)
    threadpoolctl.threadpool_limits = limited
    blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    load = os.getloadavg()[0]
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "sweep": Path(a.sweep).name,
        "runs": len(sweep["runs"]),
        "cpus": os.cpu_count(),
        "load_average_1min": load,
        "blas": [f"{i['internal_api']} {i.get('version')} ({i['num_threads']} threads)" for i in blas],
        "seconds": times,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "rule_threads.json", json.dumps(doc, indent=1))
    cmd = "python benchmarks/bench_rule_threads.py " + " ".join(sys.argv[1:])
    lines = [
        "# The pruner's online fits on one BLAS thread",
        "",
        f"`{cmd}` ({doc['date']}; {doc['cpus']} CPUs, 1-minute load {load:.1f}; BLAS: {', '.join(doc['blas'])}).",
        f"One replayed Optuna study of {doc['sweep']} ({doc['runs']} trials, `DTGPruner(use_values=False)`), wall time per replay:",
        "",
        "| online fits | seconds (each repeat) | median |",
        "|---|---|---|",
    ]
    for label, ts in times.items():
        lines.append(f"| {label} | {', '.join(f'{t:.1f}' for t in ts)} | {np.median(ts):.1f} |")
    ratio = np.median(times["every BLAS thread"]) / np.median(times["one BLAS thread (shipped)"])
    lines += ["", f"Ratio of the medians: {ratio:.1f}x."]
    atomic_write(out / "rule_threads.md", "\n".join(lines) + "\n")
    print(f"-> {out / 'rule_threads.md'} ({ratio:.1f}x)")


if __name__ == "__main__":
    main()
