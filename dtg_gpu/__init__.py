"""dtg_gpu: predict from a run's checkpoints whether it ends with sufficient accuracy.

Checkpoints → channel graphs → batched eigenvector centrality → temporal statistics →
a small classifier. See the README and `docs/method.md` (the method, step by step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtg_gpu.exceptions import CheckpointError, ConvergenceWarning, DatasetNotFoundError, DisconnectedGraphWarning, DTGError, DTGWarning, FailedRunsWarning, InsufficientCheckpointsError, NonFiniteWeightsWarning, TopologyError, TracingFallbackWarning, UncoveredWeightsWarning, UnsafeCheckpointError

# The rest is imported when first used (PEP 562): `import dtg_gpu` and `dtg --help` do not
# pay for torch until something needs it.
_LAZY = {
    "native_status": "._native",
    "AnalysisResult": ".analysis",
    "analyze": ".analysis",
    "featurize": ".analysis",
    "EigenResult": ".centrality",
    "eigenvector_centrality": ".centrality",
    "solve_perron": ".centrality",
    "Run": ".checkpoints",
    "load_state_dict": ".checkpoints",
    "evaluate": ".evaluation",
    "temporal_features": ".features",
    "temporal_reinforcement": ".features",
    "BlockOperator": ".graph",
    "filter_norms": ".graph",
    "PerformancePredictor": ".predictor",
    "label_runs": ".predictor",
    "split_runs": ".predictor",
    "STATISTICS": ".statistics",
    "timestep_statistics": ".statistics",
    "ChannelTopology": ".topology",
    "WeightLayer": ".topology",
    "channel_topology": ".topology",
}

if TYPE_CHECKING:
    from dtg_gpu._native import native_status
    from dtg_gpu.analysis import AnalysisResult, analyze, featurize
    from dtg_gpu.centrality import EigenResult, eigenvector_centrality, solve_perron
    from dtg_gpu.checkpoints import Run, load_state_dict
    from dtg_gpu.evaluation import evaluate
    from dtg_gpu.features import temporal_features, temporal_reinforcement
    from dtg_gpu.graph import BlockOperator, filter_norms
    from dtg_gpu.predictor import PerformancePredictor, label_runs, split_runs
    from dtg_gpu.statistics import STATISTICS, timestep_statistics
    from dtg_gpu.topology import ChannelTopology, WeightLayer, channel_topology


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module 'dtg_gpu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
