r"""Baseline featurisers that plug into the same predictor and evaluation as DTG features.

* :func:`weight_statistics` — Unterthiner et al. 2020, "Predicting Neural Network
  Accuracy from Weights": per weight layer, mean, std and the 0/25/50/75/100 % quantiles of
  the weights at the last checkpoint used. Data-free.
* :func:`learning_curve` — validation accuracy at the checkpoints used (from ``run.json``).
  Needs data, which DTG does not: the upper reference a data-free method competes with.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .checkpoints import Run
from .exceptions import InsufficientCheckpointsError

__all__ = ["weight_statistics", "learning_curve", "BASELINES"]


def _check(runs: Sequence[Run], k: int) -> None:
    if not runs:
        raise ValueError("no runs: the sweep is empty")
    for r in runs:
        if len(r) < k:
            raise InsufficientCheckpointsError(f"timesteps={k} but run {r.name!r} has only {len(r)} checkpoints")


def weight_statistics(runs: Sequence[Run], timesteps: int) -> np.ndarray:
    """``[runs, 7·layers]``: mean, std, 0/25/50/75/100 % quantiles per layer at checkpoint ``k``."""
    _check(runs, timesteps)
    rows = []
    q = [0.0, 0.25, 0.5, 0.75, 1.0]
    for run in runs:
        w = run.weights(timesteps - 1)
        feats = []
        for p in run.topology.params:
            x = w[p].detach().double().reshape(-1)
            if not torch.isfinite(x).all():
                feats.extend([float("nan")] * 7)
                continue
            feats.extend([float(x.mean()), float(x.std(unbiased=False))])
            feats.extend(np.quantile(x.numpy(), q).tolist())
        rows.append(feats)
    return np.asarray(rows, dtype=float)


def learning_curve(runs: Sequence[Run], timesteps: int) -> np.ndarray:
    """``[runs, k]``: validation accuracy at the first ``k`` checkpoints (needs ``run.json``)."""
    _check(runs, timesteps)
    out = []
    for run in runs:
        cps = run.meta.get("checkpoints")
        if not cps or any(not isinstance(c, dict) or "val_accuracy" not in c for c in cps[:timesteps]):
            raise ValueError(f"run {run.name!r} records no validation accuracy per checkpoint")
        out.append([float(c["val_accuracy"]) for c in cps[:timesteps]])
    return np.asarray(out, dtype=float)


BASELINES = {"weight_stats": weight_statistics, "learning_curve": learning_curve}
