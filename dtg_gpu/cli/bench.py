"""`dtg bench`: the centrality benchmark, from a source checkout."""

from __future__ import annotations

import argparse
from pathlib import Path

from dtg_gpu.cli.common import Command


# ------------------------------------------------------------------------------ bench
def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small graphs only")
    p.add_argument("--out", default="benchmarks/results", help="results folder")


def _bench_run(a: argparse.Namespace) -> int:
    import runpy

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_centrality.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} not found: 'dtg bench' runs from a source checkout")
    runpy.run_path(str(script))["main"]((["--quick"] if a.quick else []) + ["--out", a.out])
    return 0


bench = Command("bench", "run the centrality benchmark (from a source checkout)", _bench_args, _bench_run)
