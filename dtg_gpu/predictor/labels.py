"""Labels (method step 5): which runs are sufficient, and stratified train/test splits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.model_selection import StratifiedShuffleSplit

__all__ = ["label_runs", "split_runs"]


def _threshold_value(acc: np.ndarray, threshold: float | str) -> float:
    finite = acc[np.isfinite(acc)]
    if isinstance(threshold, str):
        name = threshold.strip().lower()
        if not finite.size:
            raise ValueError("no finite accuracy to take a quantile of")
        if name == "median":
            return float(np.median(finite))
        if name.startswith("q"):
            try:
                q = float(name[1:])
            except ValueError:
                q = -1.0
            if 0.0 <= q <= 1.0:
                return float(np.quantile(finite, q))
        raise ValueError(f"threshold must be a number, 'median' or 'qX' (0 <= X <= 1, e.g. 'q0.75'), got {threshold!r}")
    try:
        return float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number or 'median', got {threshold!r}") from None


def label_runs(accuracies: Sequence[float] | np.ndarray, threshold: float | str = "median") -> np.ndarray:
    r"""Label runs sufficient (1) when final accuracy ≥ threshold, else insufficient (0).

    Parameters
    ----------
    accuracies : sequence of float
        Final test accuracy of each run. NaN (a diverged run) is insufficient.
    threshold : float or str, default "median"
        A fixed accuracy, `"median"`, or a quantile `"q0.75"` of the finite
        accuracies of this sweep.

    Returns
    -------
    ndarray of int `[runs]`

    Raises
    ------
    ValueError
        No runs, a bad threshold, or every run gets the same label (the message gives the
        accuracy range and suggests a threshold).

    Examples
    --------
    >>> label_runs([0.5, 0.91, 0.95, float("nan")], threshold=0.9)
    array([0, 1, 1, 0])
    """
    acc = np.asarray(accuracies, dtype=float).reshape(-1)
    if acc.size == 0:
        raise ValueError("no runs to label: the sweep is empty")
    thr = _threshold_value(acc, threshold)
    labels = (np.nan_to_num(acc, nan=-np.inf) >= thr).astype(int)
    if labels.min() == labels.max():
        finite = acc[np.isfinite(acc)]
        rng = f"{finite.min():.4g}..{finite.max():.4g}" if finite.size else "all NaN"
        raise ValueError(
            f"every one of the {acc.size} runs is labelled {'sufficient' if labels[0] else 'insufficient'} "
            f"with threshold {thr:.4g} (accuracies range {rng}); pick a threshold inside that "
            "range, e.g. threshold='median'"
        )
    return labels


def split_runs(y: Sequence[int] | np.ndarray, test_size: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded split: `test_size` of each class for testing (the method: 90/10).

    Returns the train and test indices.
    """
    labels = np.asarray(y)
    sss = StratifiedShuffleSplit(n_splits=1, test_size=test_size, random_state=seed)
    train, test = next(sss.split(np.zeros((len(labels), 1)), labels))
    return train, test
