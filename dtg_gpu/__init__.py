"""dtg_gpu: predict from a run's checkpoints whether it ends with sufficient accuracy.

Checkpoints → channel graphs → batched eigenvector centrality → temporal statistics →
a small classifier. See the README and ``docs/method.md`` (the method, step by step).
"""

from __future__ import annotations

from ._native import native_status
from .analysis import AnalysisResult, analyze, featurize
from .centrality import EigenResult, eigenvector_centrality, solve_perron
from .checkpoints import Run, load_state_dict
from .evaluation import evaluate
from .exceptions import (
    CheckpointError,
    ConvergenceWarning,
    DatasetNotFoundError,
    DisconnectedGraphWarning,
    DTGError,
    DTGWarning,
    FailedRunsWarning,
    InsufficientCheckpointsError,
    NonFiniteWeightsWarning,
    TopologyError,
    TracingFallbackWarning,
    UncoveredWeightsWarning,
    UnsafeCheckpointError,
)
from .features import temporal_features, temporal_reinforcement
from .graph import BlockOperator, filter_norms
from .predictor import PerformancePredictor, label_runs, split_runs
from .statistics import STATISTICS, timestep_statistics
from .topology import ChannelTopology, WeightLayer, channel_topology

__version__ = "0.1.0"

__all__ = [
    "AnalysisResult",
    "analyze",
    "featurize",
    "EigenResult",
    "eigenvector_centrality",
    "solve_perron",
    "Run",
    "load_state_dict",
    "CheckpointError",
    "ConvergenceWarning",
    "DatasetNotFoundError",
    "DisconnectedGraphWarning",
    "DTGError",
    "DTGWarning",
    "FailedRunsWarning",
    "InsufficientCheckpointsError",
    "NonFiniteWeightsWarning",
    "TopologyError",
    "TracingFallbackWarning",
    "UncoveredWeightsWarning",
    "UnsafeCheckpointError",
    "evaluate",
    "PerformancePredictor",
    "label_runs",
    "split_runs",
    "temporal_features",
    "temporal_reinforcement",
    "BlockOperator",
    "filter_norms",
    "native_status",
    "STATISTICS",
    "timestep_statistics",
    "ChannelTopology",
    "WeightLayer",
    "channel_topology",
    "__version__",
]
