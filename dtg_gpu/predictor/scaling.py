"""Feature scaling fitted on the training rows only: standard, or quantiles mapped to a normal (as scikit-learn's QuantileTransformer), and univariate F scores for feature selection."""

from __future__ import annotations

import numpy as np

__all__ = ["SCALINGS", "training_quantiles", "quantile_normal"]

SCALINGS = ("standard", "quantile")


_BOUND = 1e-7  # scikit-learn's QuantileTransformer clips the ranks to [1e-7, 1 - 1e-7] as well


def training_quantiles(X: np.ndarray, n_quantiles: int = 1000) -> np.ndarray:
    """`[min(n_quantiles, rows), d]` quantiles of `X` at evenly spaced levels, column-wise
    non-decreasing, computed as scikit-learn's `QuantileTransformer.fit` does (percentiles,
    so the rounding matches too)."""
    ref = np.linspace(0.0, 1.0, min(int(n_quantiles), X.shape[0]))
    return np.maximum.accumulate(np.nanpercentile(X, ref * 100, axis=0), axis=0)


def quantile_normal(X: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    r"""Map each feature through its empirical CDF to a standard normal score.

    .. math::
        z = \Phi^{-1}\bigl(\operatorname{clip}(\hat F(x), 10^{-7}, 1 - 10^{-7})\bigr)

    where $\hat F$ interpolates linearly between `quantiles[i]`, the quantile of
    level `i / (n - 1)` of the training data (ties take the mean of their ranks), exactly as
    `sklearn.preprocessing.QuantileTransformer(output_distribution="normal")` does, bounds
    included: values within 1e-7 of the training minimum or beyond map to about -5.2, of the
    maximum or beyond to about +5.2 (a constant feature becomes a constant -5.2).

    Parameters
    ----------
    X : ndarray `[rows, d]`
    quantiles : ndarray `[n, d]`
        Column-wise non-decreasing (`training_quantiles`).

    Returns
    -------
    ndarray `[rows, d]`
    """
    from scipy.special import ndtri

    ref = np.linspace(0.0, 1.0, quantiles.shape[0])
    u = np.empty_like(X, dtype=np.float64)
    for j in range(X.shape[1]):  # per feature; d is small (features, not runs)
        q, x = quantiles[:, j], X[:, j]
        u[:, j] = 0.5 * (np.interp(x, q, ref) - np.interp(-x, -q[::-1], -ref[::-1]))
        u[x + _BOUND > q[-1], j] = 1.0  # scikit-learn's bounds, in its order (a constant feature -> lower)
        u[x - _BOUND < q[0], j] = 0.0
    edge = _BOUND - np.spacing(1)
    return np.clip(ndtri(u), ndtri(edge), ndtri(1 - edge))


def _f_scores(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """scikit-learn's ANOVA F statistic of each column between the classes; NaN (a constant
    column) → 0."""
    import warnings

    from sklearn.feature_selection import f_classif

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        f, _ = f_classif(X, y)
    return np.clip(np.nan_to_num(f, nan=0.0, posinf=np.finfo(float).max), 0.0, None)
