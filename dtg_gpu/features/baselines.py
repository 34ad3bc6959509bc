r"""Baseline featurisers that plug into the same predictor and evaluation as DTG features.

* [`weight_statistics`][dtg_gpu.features.baselines.weight_statistics] — Unterthiner et al. 2020, "Predicting Neural Network
  Accuracy from Weights": per weight layer, mean, std and the 0/25/50/75/100 % quantiles of
  the weights at the last checkpoint used. Data-free.
* [`spectral_alpha`][dtg_gpu.features.baselines.spectral_alpha] — WeightWatcher's headline metric (Martin & Mahoney): per weight
  layer, the power-law exponent α of the empirical spectral density of the weight matrix
  at the last checkpoint used. Data-free. Computed here with `torch.linalg.svdvals` and
  the Clauset–Shalizi–Newman fit (continuous MLE, `x_min` by minimum KS distance), the
  fit WeightWatcher does through the `powerlaw` package; the `weightwatcher` package
  itself is not a dependency. A convolution's `k×k` slices `W[:, :, i, j]` (each
  `out×in`) pool their eigenvalues into one spectrum, as WeightWatcher does by default.
* [`learning_curve`][dtg_gpu.features.baselines.learning_curve] — validation accuracy at the checkpoints used (from `run.json`).
  Needs data, which DTG does not: the upper reference a data-free method competes with.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dtg_gpu.exceptions import InsufficientCheckpointsError
from dtg_gpu.io.run import Run

__all__ = [
    "weight_statistics",
    "tensor_statistics",
    "spectral_alpha",
    "powerlaw_alpha",
    "powerlaw_fit",
    "layer_eigenvalues",
    "learning_curve",
]


def _check(runs: Sequence[Run], k: int) -> None:
    if not runs:
        raise ValueError("no runs: the sweep is empty")
    for r in runs:
        if len(r) < k:
            raise InsufficientCheckpointsError(f"timesteps={k} but run {r.name!r} has only {len(r)} checkpoints")


def tensor_statistics(x: torch.Tensor) -> list[float]:
    """Mean, std (`ddof=0`) and 0/25/50/75/100 % quantiles of one weight tensor; all NaN
    when it holds a non-finite value."""
    x = x.detach().double().reshape(-1)
    if not torch.isfinite(x).all():
        return [float("nan")] * 7
    return [float(x.mean()), float(x.std(unbiased=False))] + np.quantile(x.numpy(), [0, 0.25, 0.5, 0.75, 1]).tolist()


def weight_statistics(runs: Sequence[Run], timesteps: int) -> np.ndarray:
    """`[runs, 7·layers]`: `tensor_statistics` of each layer at checkpoint `k`."""
    _check(runs, timesteps)
    rows = []
    for run in runs:
        w = run.weights(timesteps - 1)
        rows.append([v for p in run.topology.params for v in tensor_statistics(w[p])])
    return np.asarray(rows, dtype=float)


def layer_eigenvalues(w: torch.Tensor) -> torch.Tensor:
    r"""Eigenvalues $\lambda = \sigma^2$ of a layer's weight matrix (or matrices).

    A `Linear` weight `[out, in]` is one matrix; a convolution `[out, in/g, kh, kw]`
    gives `kh·kw` matrices `W[:, :, i, j]` whose eigenvalues are pooled.
    """
    w = w.detach().double()
    if w.dim() > 2:
        w = w.reshape(w.shape[0], w.shape[1], -1).permute(2, 0, 1)
    else:
        w = w.reshape(1, w.shape[0], -1)
    return (torch.linalg.svdvals(w) ** 2).reshape(-1)


def powerlaw_alpha(eigenvalues: np.ndarray, min_tail: int = 5) -> float:
    r"""α of `powerlaw_fit` (the fitted exponent alone).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = (1 - rng.random(20000)) ** (-1 / 1.5)   # Pareto, alpha = 2.5
    >>> round(powerlaw_alpha(x), 1)
    2.5
    """
    return powerlaw_fit(eigenvalues, min_tail)[0]


def powerlaw_fit(eigenvalues: np.ndarray, min_tail: int = 5) -> tuple[float, float]:
    r"""Exponent α of a power law $p(\lambda) \propto \lambda^{-\alpha}$ fitted to
    the tail $\lambda \ge x_{\min}$ (Clauset, Shalizi & Newman 2009).

    For each candidate $x_{\min}$ (every eigenvalue leaving at least `min_tail`
    values in the tail, or the smallest one when there are fewer) the continuous MLE is
    $\hat\alpha = 1 + n / \sum_i \ln(\lambda_i / x_{\min})$; the `x_min` with the
    smallest Kolmogorov–Smirnov distance between the tail's empirical CDF and
    $1 - (\lambda/x_{\min})^{1-\hat\alpha}$ is kept. α is scale-free, so the
    eigenvalues need no normalisation.

    Returns
    -------
    (alpha, x_min) : tuple of float
        Both NaN when fewer than two positive eigenvalues are distinct or any is not finite.
    """
    x = np.asarray(eigenvalues, dtype=float).ravel()
    nan = (float("nan"), float("nan"))
    if not np.isfinite(x).all():
        return nan
    x = np.sort(x[x > x.max(initial=0.0) * 1e-12]) if x.size else x
    n = x.size
    if n < 2 or x[0] == x[-1]:
        return nan
    logs = np.log(x)
    tail_sum = np.cumsum(logs[::-1])[::-1]  # sum_{j >= i} log x_j
    last = max(1, n - min_tail + 1)
    best, best_d = nan, np.inf
    for i in range(last):
        m = n - i
        denom = tail_sum[i] - m * logs[i]
        if denom <= 0:
            continue
        a = 1.0 + m / denom
        tail = x[i:]
        cdf = 1.0 - (tail / x[i]) ** (1.0 - a)
        emp_hi = np.arange(1, m + 1) / m
        d = max(np.max(np.abs(emp_hi - cdf)), np.max(np.abs(emp_hi - 1.0 / m - cdf)))
        if d < best_d:
            best, best_d = (float(a), float(x[i])), d
    return best


def spectral_alpha(runs: Sequence[Run], timesteps: int) -> np.ndarray:
    """`[runs, layers]`: power-law exponent α of each weight layer's spectrum at checkpoint `k`
    (see `powerlaw_alpha`; NaN for a layer with non-finite weights)."""
    _check(runs, timesteps)
    rows = []
    for run in runs:
        w = run.weights(timesteps - 1)
        rows.append(
            [
                powerlaw_alpha(layer_eigenvalues(w[p]).numpy()) if torch.isfinite(w[p]).all() else float("nan")
                for p in run.topology.params
            ]
        )
    return np.asarray(rows, dtype=float)


def learning_curve(runs: Sequence[Run], timesteps: int) -> np.ndarray:
    """`[runs, k]`: validation accuracy at the first `k` checkpoints (needs `run.json`)."""
    _check(runs, timesteps)
    out = []
    for run in runs:
        cps = run.meta.get("checkpoints")
        if not cps or any(not isinstance(c, dict) or "val_accuracy" not in c for c in cps[:timesteps]):
            raise ValueError(f"run {run.name!r} records no validation accuracy per checkpoint")
        out.append([float(c["val_accuracy"]) for c in cps[:timesteps]])
    return np.asarray(out, dtype=float)
