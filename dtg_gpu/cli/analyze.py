"""`dtg analyze`: centrality statistics of every checkpoint of one run."""

from __future__ import annotations

import argparse
import json

from dtg_gpu.cli.common import Command, _build_user_model, _device, _json_safe, _user_model


def _analyze_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run",
        help="a run folder: run.json + checkpoints, or (with --model) Lightning "
        "*.ckpt, Hugging Face checkpoint-N/ or numbered checkpoint files",
    )
    _user_model(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--alpha", type=float, default=0.5, help="temporal reinforcement in (0, 1] (default 0.5)")
    p.add_argument(
        "--dtype", choices=["float32", "float64"], default="float32", help="solver precision (default float32)"
    )
    p.add_argument("--tol", type=float, default=1e-6, help="convergence tolerance of the centrality (default 1e-6)")
    p.add_argument(
        "--method",
        choices=["auto", "lanczos", "networkx"],
        default="auto",
        help="eigen-solver: auto (Lanczos), lanczos, or networkx's (A + I) power iteration (default auto)",
    )
    p.add_argument(
        "--registration-order",
        action="store_true",
        help="a model that cannot be traced: chain its conv/linear layers in registration order "
        "(right only for plain chains) instead of refusing it",
    )
    _device(p)


def _analyze_run(a: argparse.Namespace) -> int:
    import torch

    from dtg_gpu.analysis import analyze
    from dtg_gpu.io.run import Run

    run = Run.from_dir(a.run, model=_build_user_model(a), prefix=a.prefix, pattern=a.pattern)
    run.fallback = a.registration_order
    res = analyze(run, alpha=a.alpha, device=a.device, dtype=getattr(torch, a.dtype), tol=a.tol, method=a.method)
    if a.json:
        print(json.dumps(_json_safe(res.to_dict()), indent=2, allow_nan=False))
    else:
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_columns", 30):
            cols = [
                "t",
                "mean",
                "std",
                "median",
                "skewness",
                "kurtosis",
                "eigenvalue",
                "iterations",
                "converged",
                "connected",
            ]
            print(
                f"{res.run.name}: {res.topology.num_nodes} nodes, {res.topology.num_edges} edges, "
                f"{len(res)} checkpoints"
            )
            cov = res.coverage
            mats = cov[cov["shape"].map(len) >= 2]
            graphed = int((mats["role"] == "graphed").sum())
            print(
                f"coverage: {graphed} of {len(mats)} weight matrices in the graph; "
                + ", ".join(f"{n} {role}" for role, n in cov["role"].value_counts().items())
            )
            for _, row in mats[mats["role"] != "graphed"].iterrows():
                print(f"  not graphed: {row['parameter']} {list(row['shape'])}: {row['reason']}")
            print(res.table()[cols].to_string(index=False))
    return 0


analyze = Command("analyze", "centrality statistics of every checkpoint of one run", _analyze_args, _analyze_run)
