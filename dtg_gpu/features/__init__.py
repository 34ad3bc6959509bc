"""Steps 3–4 and the baselines: statistics of a centrality vector, temporal smoothing, weight statistics."""

from dtg_gpu.features.layout import StatisticsLayout
from dtg_gpu.features.statistics import STATISTICS, layer_node_groups, layer_statistics, timestep_statistics
from dtg_gpu.features.temporal import (
    FEATURE_RECIPES,
    FeatureRecipe,
    check_alpha,
    feature_recipe,
    reinforcement_weights,
    temporal_features,
    temporal_reinforcement,
)

__all__ = [
    "STATISTICS",
    "timestep_statistics",
    "layer_node_groups",
    "layer_statistics",
    "check_alpha",
    "reinforcement_weights",
    "temporal_reinforcement",
    "temporal_features",
    "FeatureRecipe",
    "FEATURE_RECIPES",
    "feature_recipe",
    "StatisticsLayout",
]
