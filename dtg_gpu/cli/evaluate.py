"""`dtg evaluate`: repeated 90/10 evaluation of feature sets on a sweep."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dtg_gpu.cli.common import (
    Command,
    _cluster,
    _executor,
    _family_flags,
    _features,
    _json_safe,
    _load_sweep,
    _scaling,
    _strict,
    _threshold,
    _user_model,
)


# --------------------------------------------------------------------------- evaluate
def _evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", help="sweep folder (sweep.json), or with --model a folder of your own run folders")
    _user_model(p)
    p.add_argument(
        "--threshold", default="median", help="sufficient accuracy: a number, 'median' or 'qX' (default median)"
    )
    p.add_argument("--repeats", type=int, default=20, help="stratified 90/10 splits to score on (default 20)")
    p.add_argument(
        "--features",
        nargs="+",
        default=["default", "dtg"],
        help="default (the library's default recipe and classifier), dtg (the seed's method), weight_stats, "
        "spectral, dtg+weight_stats, dtg+eigenvalue, dtg_per_layer, dtg_per_layer+eigenvalue, "
        "learning_curve, covariates (the hyper-parameters alone); default: default dtg",
    )
    p.add_argument("--json", action="store_true", help="print the scores as JSON instead of a table")
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="also write an HTML report (every run's P(sufficient) and verdict, plots) into DIR",
    )
    _features(p)
    _family_flags(p)
    _scaling(p)
    _strict(p)
    _cluster(p)


def _evaluate_run(a: argparse.Namespace) -> int:
    from dtg_gpu.predictor.estimator import PerformancePredictor
    from dtg_gpu.predictor.evaluation import METRICS
    from dtg_gpu.workflow.report import results_table
    from dtg_gpu.workflow.verdicts import FEATURE_SETS, compare, featurize_sweep

    unknown = [f for f in a.features if f not in FEATURE_SETS]
    if unknown:
        raise ValueError(f"unknown feature set(s) {unknown}; choose from {', '.join(FEATURE_SETS)}")
    sf = featurize_sweep(
        _load_sweep(a),
        alpha=a.alpha,
        device=a.device,
        progress=True,
        strict=a.strict,
        fold_batchnorm=a.fold_batchnorm,
        **_executor(a),
    )
    k = a.timesteps or sf.timesteps
    if k > sf.timesteps:
        from dtg_gpu.exceptions import InsufficientCheckpointsError

        raise InsufficientCheckpointsError(f"--timesteps {k}: the sweep's runs have only {sf.timesteps} checkpoints")
    weights = {"head_weights": a.head_weights} if a.head_weights else {}
    rows = compare(
        sf,
        [k],
        a.features,
        threshold=_threshold(a.threshold),
        repeats=a.repeats,
        clf=(
            None  # each row's own: the seed's MLP for dtg, the default classifier for the others
            if a.scaling is None and a.select is None and not a.auto
            else PerformancePredictor(
                **({"scaling": a.scaling} if a.scaling else {}), **weights, select=a.select, auto=a.auto
            )
        ),
        covariates=a.covariates,
        predictor_params=weights,
    )
    if a.report:
        from dtg_gpu.analysis import analyze
        from dtg_gpu.workflow.report import write_report
        from dtg_gpu.workflow.verdicts import run_verdicts

        usable = [r for r, ok in zip(sf.runs, sf.usable) if ok]
        example = analyze(usable[len(usable) // 2], device=a.device) if usable else None
        verdicts = run_verdicts(sf, [k], features=a.features[0], threshold=_threshold(a.threshold))
        index = write_report(
            Path(a.report), sf, rows, example, rows[0], title=f"dtg evaluate: {a.sweep}", verdicts=verdicts
        )
        print(f"report: {index}", file=sys.stderr)
    if a.json:
        print(
            json.dumps(
                _json_safe(
                    [{"features": r["features"], "k": r["k"], **{m: r["scores"][m] for m in METRICS}} for r in rows]
                ),
                indent=2,
                allow_nan=False,
            )
        )
    else:
        print(results_table(rows))
    return 0


evaluate = Command("evaluate", "repeated 90/10 evaluation of the predictor on a sweep", _evaluate_args, _evaluate_run)
