"""Step 5: labels, the classifier (its scaling, networks and files) and its evaluation."""

from dtg_gpu.predictor.estimator import PerformancePredictor
from dtg_gpu.predictor.evaluation import METRICS, evaluate, summarize
from dtg_gpu.predictor.labels import label_runs, split_runs
from dtg_gpu.predictor.scaling import SCALINGS, quantile_normal, training_quantiles

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
