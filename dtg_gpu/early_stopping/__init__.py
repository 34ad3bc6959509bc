"""Early stopping: one record per checkpoint (`records`) and the rule that turns a run's
records into a stop/continue verdict (`rule`), which the Optuna and Ray Tune integrations
and `dtg watch` share."""

from dtg_gpu.early_stopping.records import (
    RECORD_FEATURE_SETS,
    checkpoint_record,
    feature_vector,
    is_diverged,
    many_run_records,
    peer_score,
    run_records,
)
from dtg_gpu.early_stopping.rule import RULE_PARAMS, StoppingRule, auto_covariates, is_seed_name, rule_options

__all__ = [
    "RECORD_FEATURE_SETS",
    "checkpoint_record",
    "run_records",
    "many_run_records",
    "feature_vector",
    "peer_score",
    "is_diverged",
    "StoppingRule",
    "rule_options",
    "RULE_PARAMS",
    "auto_covariates",
    "is_seed_name",
]
