"""`dtg predict`: whether runs end sufficient, from a saved predictor."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from dtg_gpu.cli.common import Command, _build_user_model, _device, _strict, _user_model


# ---------------------------------------------------------------------------- predict
def _predict_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("predictor", help="file written by 'dtg train'")
    p.add_argument("runs", nargs="+", help="run folders")
    p.add_argument(
        "--min-probability",
        type=float,
        default=0.3,
        help="verdict 'stop' below this P(sufficient) (default 0.3, as dtg watch)",
    )
    _user_model(p)
    _device(p)
    _strict(p)


def _predict_run(a: argparse.Namespace) -> int:
    from dtg_gpu.core.failures import READ_ERRORS
    from dtg_gpu.io.run import Run
    from dtg_gpu.predictor.estimator import PerformancePredictor

    clf = PerformancePredictor.load(a.predictor)
    runs, bad = [], {}
    model = _build_user_model(a)
    for folder in a.runs:
        try:
            runs.append(Run.from_dir(folder, model=model, prefix=a.prefix, pattern=a.pattern))
        except READ_ERRORS as exc:
            if a.strict:
                raise
            bad[folder] = str(exc)
    proba: Any = clf.predict_runs(runs, device=a.device, strict=a.strict)[:, -1] if runs else []
    if not 0 <= a.min_probability <= 1:
        raise ValueError(f"--min-probability must be in [0, 1], got {a.min_probability}")
    for run, p in zip(runs, proba):
        verdict = "failed" if not np.isfinite(p) else ("sufficient" if p >= 0.5 else "insufficient")
        action = "" if not np.isfinite(p) else ("\tstop" if p < a.min_probability else "\tcontinue")
        print(f"{run.name}\tP(sufficient)={p:.3f}\t{verdict}{action}")
    for folder, why in bad.items():
        print(f"{folder}\tP(sufficient)=nan\tfailed: {why}")
    return 1 if bad or not np.isfinite(np.asarray(proba, dtype=float)).all() else 0


predict = Command("predict", "predict whether runs end sufficient", _predict_args, _predict_run)
