"""The public surface is small and pinned: a name added to or dropped from ``dtg_gpu`` is a
decision, made here on purpose, not a side effect."""

from __future__ import annotations

import inspect

import dtg_gpu

PUBLIC = {
    # one run, many runs
    "Run",
    "analyze",
    "AnalysisResult",
    "featurize",
    "load_state_dict",
    # options and the full result of featurising (a deliberate addition: the options objects
    # replace featurize's sixteen parameters and its return_stats overloads)
    "SolverOptions",
    "FeatureRecipe",
    "feature_recipe",
    "extract_features",
    "FeatureResult",
    # graphs and centrality
    "ChannelTopology",
    "WeightLayer",
    "channel_topology",
    "BlockOperator",
    "filter_norms",
    "native_status",  # which kernel takes the CPU filter norms: benchmarks report it
    "eigenvector_centrality",
    "solve_perron",
    "EigenResult",
    # statistics and features
    "STATISTICS",
    "timestep_statistics",
    "temporal_features",
    "temporal_reinforcement",
    # prediction
    "PerformancePredictor",
    "label_runs",
    "split_runs",
    "evaluate",
    # errors and warnings
    "DTGError",
    "CheckpointError",
    "UnsafeCheckpointError",
    "TopologyError",
    "InsufficientCheckpointsError",
    "DatasetNotFoundError",
    "DTGWarning",
    "ConvergenceWarning",
    "DisconnectedGraphWarning",
    "FailedRunsWarning",
    "NonFiniteWeightsWarning",
    "TracingFallbackWarning",
    "UncoveredWeightsWarning",
    "__version__",
}


def test_all_is_pinned():
    assert set(dtg_gpu.__all__) == PUBLIC
    assert len(dtg_gpu.__all__) == len(set(dtg_gpu.__all__))


def test_every_public_name_exists_and_is_documented():
    for name in dtg_gpu.__all__:
        obj = getattr(dtg_gpu, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"dtg_gpu.{name} has no docstring"


def test_private_modules_stay_private():
    import dtg_gpu.core.files
    import dtg_gpu.topology.shape_pass

    assert not any(n.startswith("_") and n != "__version__" for n in dtg_gpu.__all__)
    assert dtg_gpu.topology.shape_pass.__all__ == ["trace_with_shapes"] and dtg_gpu.core.files.__all__
