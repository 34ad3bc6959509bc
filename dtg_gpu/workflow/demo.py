r"""The main job end to end (`dtg demo`): train the embedded digits sweep, featurise
every run, evaluate the predictor early and on all checkpoints against baselines, and
write a report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from dtg_gpu.analysis import analyze
from dtg_gpu.core.files import atomic_write
from dtg_gpu.predictor.evaluation import METRICS
from dtg_gpu.sweeps.config import SweepConfig
from dtg_gpu.sweeps.loading import load_sweep
from dtg_gpu.sweeps.runner import run_sweep
from dtg_gpu.workflow.report import results_table, write_report
from dtg_gpu.workflow.verdicts import compare, featurize_sweep, run_verdicts

__all__ = ["demo_config", "run_demo"]


def demo_config(quick: bool = False) -> SweepConfig:
    """The default digits LeNet-5 sweep: 8 lr × 4 dropout × 3 seeds = 96 runs, 20 epochs, a
    checkpoint each epoch; `quick`: 4 × 2 × 2 = 16 runs, 6 epochs, a checkpoint every 12
    steps (10 checkpoints), long enough that most runs learn (sweep median about 0.8: the
    label *sufficient* means a run that learned well)."""
    if quick:
        return SweepConfig(
            model="lenet5",
            dataset="digits",
            lrs=(0.01, 0.03, 0.1, 0.5),
            dropouts=(0.0, 0.5),
            seeds=2,
            epochs=6,
            checkpoint_every=12,
            checkpoint_unit="step",
            batch_size=64,
        )
    return SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.03, 0.1, 0.3),
        dropouts=(0.0, 0.25, 0.5, 0.75),
        seeds=3,
        epochs=20,
        checkpoint_every=1,
        checkpoint_unit="epoch",
        batch_size=64,
    )


def run_demo(
    out: str | Path = "demo-out",
    quick: bool = False,
    device=None,
    progress: bool = True,
    repeats: int | None = None,
    echo=print,
    strict: bool = False,
) -> dict:
    """Run the demo into `out`; returns the results (also written to `out/results.json`).

    It finishes on any sweep: runs that cannot be read or solved are named, left out of the
    scores and listed in the report (`strict=True` stops at the first instead)."""
    out = Path(out)
    started = time.time()
    cfg = demo_config(quick)
    echo(f"[1/4] training {len(cfg.grid())} LeNet-5 runs on digits into {out / 'sweep'}")
    run_sweep(cfg, out / "sweep", device=device, progress=progress)
    runs = load_sweep(out / "sweep", strict=strict)
    echo(f"[2/4] eigenvector centrality of {sum(len(r) for r in runs)} checkpoint graphs")
    sf = featurize_sweep(runs, alpha=0.5, device=device, progress=progress, strict=strict)
    if sf.failed:
        echo(f"      {len(sf.failed)} run(s) left out (unreadable): {', '.join(sf.failed)}")
    t = sf.timesteps
    early = max(1, t // 4)
    ks = sorted({1, early, t} - {0})  # 5 feature sets x 3 k x 20 splits keeps the demo <= 10 min
    # the library's default first, then the seed's method, then the baselines
    names = ["default", "dtg", "weight_stats", "spectral", "learning_curve"]
    reps = repeats or (5 if quick else 20)
    echo(f"[3/4] evaluating {len(names)} feature sets at k={ks} over {reps} stratified 90/10 splits")
    rows = compare(sf, ks, names, threshold="median", repeats=reps, progress=progress)
    echo("")
    echo(f"Predicting sufficient accuracy (>= sweep median) from the first k of {t} checkpoints:")
    echo(results_table(rows))  # the same rows as the report's table
    echo("")
    head = next(r for r in rows if r["features"] == "default" and r["k"] == early)
    usable = [r for r, ok in zip(sf.runs, sf.usable) if ok]
    example = analyze(usable[len(usable) // 2], device=device) if usable else None
    verdicts = run_verdicts(sf, ks, features="default", threshold="median")
    index = write_report(
        out / "report", sf, rows, example, head, title="dtg_gpu demo: LeNet-5 on digits", verdicts=verdicts
    )
    results = {
        "runs": len(runs),
        "failed_runs": sf.failed,
        "timesteps": t,
        "early_k": early,
        "seconds": round(time.time() - started, 1),
        "rows": [
            {
                "features": r["features"],
                "k": r["k"],
                **{m: {kk: r["scores"][m][kk] for kk in ("mean", "ci_low", "ci_high")} for m in METRICS},
            }
            for r in rows
        ],
    }
    atomic_write(out / "results.json", json.dumps(results, indent=2))
    echo(f"[4/4] report: {index}  ({results['seconds']} s in all)")
    return results
