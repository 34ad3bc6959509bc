"""dtg_gpu: predict from a run's checkpoints whether it ends with sufficient accuracy.

Checkpoints → channel graphs → batched eigenvector centrality → temporal statistics →
a small classifier. See the README and `docs/method.md` (the method, step by step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtg_gpu.exceptions import (
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

# The rest is imported when first used (PEP 562): `import dtg_gpu` and `dtg --help` do not
# pay for torch until something needs it.
_LAZY = {
    "native_status": "dtg_gpu.graph.native",
    "AnalysisResult": "dtg_gpu.analysis",
    "analyze": "dtg_gpu.analysis",
    "featurize": "dtg_gpu.analysis",
    "extract_features": "dtg_gpu.analysis",
    "FeatureResult": "dtg_gpu.analysis",
    "SolverOptions": "dtg_gpu.engine.options",
    "FeatureRecipe": "dtg_gpu.features.temporal",
    "feature_recipe": "dtg_gpu.features.temporal",
    "EigenResult": "dtg_gpu.centrality",
    "eigenvector_centrality": "dtg_gpu.centrality",
    "solve_perron": "dtg_gpu.centrality",
    "Run": "dtg_gpu.io.run",
    "load_state_dict": "dtg_gpu.io.checkpoints",
    "evaluate": "dtg_gpu.predictor.evaluation",
    "temporal_features": "dtg_gpu.features.temporal",
    "temporal_reinforcement": "dtg_gpu.features.temporal",
    "BlockOperator": "dtg_gpu.graph.operators",
    "filter_norms": "dtg_gpu.graph.norms",
    "PerformancePredictor": "dtg_gpu.predictor.estimator",
    "label_runs": "dtg_gpu.predictor.labels",
    "split_runs": "dtg_gpu.predictor.labels",
    "STATISTICS": "dtg_gpu.features.statistics",
    "timestep_statistics": "dtg_gpu.features.statistics",
    "ChannelTopology": "dtg_gpu.topology.types",
    "WeightLayer": "dtg_gpu.topology.types",
    "channel_topology": "dtg_gpu.topology.trace",
}

if TYPE_CHECKING:
    from dtg_gpu.analysis import AnalysisResult, FeatureResult, analyze, extract_features, featurize
    from dtg_gpu.centrality import EigenResult, eigenvector_centrality, solve_perron
    from dtg_gpu.engine.options import SolverOptions
    from dtg_gpu.features.statistics import STATISTICS, timestep_statistics
    from dtg_gpu.features.temporal import FeatureRecipe, feature_recipe, temporal_features, temporal_reinforcement
    from dtg_gpu.graph.native import native_status
    from dtg_gpu.graph.norms import filter_norms
    from dtg_gpu.graph.operators import BlockOperator
    from dtg_gpu.io.checkpoints import load_state_dict
    from dtg_gpu.io.run import Run
    from dtg_gpu.predictor.estimator import PerformancePredictor
    from dtg_gpu.predictor.evaluation import evaluate
    from dtg_gpu.predictor.labels import label_runs, split_runs
    from dtg_gpu.topology.trace import channel_topology
    from dtg_gpu.topology.types import ChannelTopology, WeightLayer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module 'dtg_gpu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


from dtg_gpu.core.version import __version__  # noqa: E402

__all__ = [
    "AnalysisResult",
    "analyze",
    "featurize",
    "extract_features",
    "FeatureResult",
    "SolverOptions",
    "FeatureRecipe",
    "feature_recipe",
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
