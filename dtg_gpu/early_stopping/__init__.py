"""Early stopping: per-checkpoint records and the rule that turns them into a verdict."""

from dtg_gpu.early_stopping.rule import (
    FEATURE_SETS,
    StoppingRule,
    checkpoint_record,
    feature_vector,
    is_diverged,
    peer_score,
    run_records,
)

__all__ = [
    "FEATURE_SETS",
    "checkpoint_record",
    "run_records",
    "feature_vector",
    "peer_score",
    "is_diverged",
    "StoppingRule",
]
