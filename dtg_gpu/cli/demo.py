"""`dtg demo`: train the digits sweep, featurise, evaluate, write a report."""

from __future__ import annotations

import argparse

from dtg_gpu.cli.common import Command, _device, _strict


# ------------------------------------------------------------------------------- demo
def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a one-minute version")
    p.add_argument(
        "--out", default="demo-out", help="folder for the sweep, results.json and report/ (default demo-out)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _device(p)
    _strict(p)


def _demo_run(a: argparse.Namespace) -> int:
    from dtg_gpu.workflow.demo import run_demo

    run_demo(a.out, quick=a.quick, device=a.device, progress=not a.quiet, strict=a.strict)
    return 0


demo = Command("demo", "train the digits sweep, featurise, evaluate, write a report", _demo_args, _demo_run)
