"""Whole-sweep work: featurise a sweep, compare feature sets, verdicts, the report, the demo and the watcher."""

from dtg_gpu.workflow.verdicts import (
    FEATURE_SETS,
    SweepFeatures,
    compare,
    default_blocks,
    default_predictor,
    feature_sets,
    featurize_sweep,
    run_verdicts,
)

__all__ = [
    "SweepFeatures",
    "featurize_sweep",
    "feature_sets",
    "compare",
    "run_verdicts",
    "FEATURE_SETS",
    "default_blocks",
    "default_predictor",
]
