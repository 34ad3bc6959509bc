"""Step 5: labels, the classifier, its files and its evaluation."""

from dtg_gpu.predictor.estimator import (
    SCALINGS,
    PerformancePredictor,
    label_runs,
    quantile_normal,
    split_runs,
    training_quantiles,
)
from dtg_gpu.predictor.evaluation import METRICS, evaluate, summarize

__all__ = [
    "label_runs",
    "split_runs",
    "PerformancePredictor",
    "quantile_normal",
    "training_quantiles",
    "SCALINGS",
    "METRICS",
    "evaluate",
    "summarize",
]
