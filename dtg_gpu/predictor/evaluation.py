r"""Evaluation over repeated stratified 90/10 splits (method step 5).

The test split of a ~100-run sweep holds ~10 runs, so one split is noise: `evaluate`
repeats the seeded split `R` times and reports each metric's mean with a 95 % Student-t
interval, $\bar m \pm t_{0.975, R-1}\, s / \sqrt R$, clipped to [0, 1].
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats as sps
from sklearn.base import clone
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    confusion_matrix,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
    roc_curve,
)

from dtg_gpu.predictor.estimator import marked_sets
from dtg_gpu.predictor.labels import split_runs

__all__ = ["METRICS", "evaluate", "summarize"]

METRICS = ("precision", "recall", "f1", "accuracy", "roc_auc", "average_precision")


def summarize(values) -> dict[str, Any]:
    """Mean, std, 95 % t-interval and the raw values of one metric (NaNs ignored)."""
    v = np.asarray(values, dtype=float)
    f = v[np.isfinite(v)]
    if f.size == 0:
        return {
            "mean": float("nan"),
            "std": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "n": 0,
            "values": v.tolist(),
        }
    mean = float(f.mean())
    std = float(f.std(ddof=1)) if f.size > 1 else 0.0
    half = float(sps.t.ppf(0.975, f.size - 1) * std / np.sqrt(f.size)) if f.size > 1 else 0.0
    return {
        "mean": mean,
        "std": std,
        "ci_low": max(0.0, mean - half),
        "ci_high": min(1.0, mean + half),
        "n": int(f.size),
        "values": v.tolist(),
    }


def evaluate(
    clf, X, y, *, repeats: int = 20, seed: int = 0, test_size: float = 0.1, positive: Any = 1
) -> dict[str, Any]:
    r"""Fit a fresh clone of `clf` on `repeats` stratified splits and score each.

    Parameters
    ----------
    clf : classifier
        Any scikit-learn classifier with `predict_proba` (cloned for every split).
    X : array-like `[runs, d]`
    y : array-like `[runs]`
    repeats : int, default 20
    seed : int, default 0
        Split `r` uses `random_state = seed + r`; a `clf` with a `random_state`
        parameter gets the same.
    test_size : float, default 0.1
        Fraction of each class tested (the method: 10 %); at least one run per class.
    positive : label, default 1
        The sufficient class: precision is reported for it (the headline).

    Returns
    -------
    dict
        `scores[m]` for `m` in `METRICS`: `mean`, `std`, `ci_low`,
        `ci_high`, `n`, `values`. Precision, recall, F1 and accuracy are those of the
        classifier's decisions (`predict`); `roc_auc` and `average_precision` (the area
        under the precision-recall curve of the sufficient class, scikit-learn's step-wise
        $\sum_n (R_n - R_{n-1}) P_n$) rank the test runs by `predict_proba` and do not
        depend on the decision cut. Both are NaN for a split whose test set holds one class.
        Also `confusion_matrix` (summed over splits, rows = true [insufficient,
        sufficient]), `roc` (pooled test scores for a curve) and `repeats`.

    Raises
    ------
    ValueError
        Fewer than 2 runs of a class, or `repeats < 1`.
    """
    marks = marked_sets(clf, X)  # featurize's feature sets, for PerformancePredictor(blocks="auto")
    if marks:
        clf = clone(clf).set_params(**marks)
    X = np.asarray(X, dtype=float)
    y = np.asarray(y)
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    classes, counts = np.unique(y, return_counts=True)
    if classes.size != 2:
        raise ValueError(f"evaluate needs two classes, got {classes.size} ({classes.tolist()})")
    if counts.min() < 2:
        raise ValueError(
            f"class {classes[counts.argmin()]!r} has only {counts.min()} run; "
            "a stratified split needs at least 2 of each"
        )
    if positive not in classes:
        raise ValueError(f"positive={positive!r} is not one of the labels {classes.tolist()}")
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    cm = np.zeros((2, 2), dtype=int)
    order = [c for c in classes if c != positive] + [positive]
    pooled_true, pooled_score = [], []
    # a sweep so small that 10 % is fewer test runs than classes (e.g. 10 runs) gets one per class
    split_size = test_size if np.ceil(test_size * y.size) >= classes.size else int(classes.size)
    for r in range(int(repeats)):
        train, test = split_runs(y, test_size=split_size, seed=seed + r)
        model = clone(clf)
        if "random_state" in model.get_params():
            model.set_params(random_state=seed + r)
        model.fit(X[train], y[train])
        proba = model.predict_proba(X[test])[:, list(model.classes_).index(positive)]
        pred = model.predict(X[test])
        yt = y[test]
        values["precision"].append(precision_score(yt, pred, pos_label=positive, zero_division=0))
        values["recall"].append(recall_score(yt, pred, pos_label=positive, zero_division=0))
        values["f1"].append(f1_score(yt, pred, pos_label=positive, zero_division=0))
        values["accuracy"].append(accuracy_score(yt, pred))
        both = np.unique(yt).size == 2
        values["roc_auc"].append(roc_auc_score(yt == positive, proba) if both else float("nan"))
        values["average_precision"].append(average_precision_score(yt == positive, proba) if both else float("nan"))
        cm += confusion_matrix(yt, pred, labels=order)
        pooled_true.append(yt == positive)
        pooled_score.append(proba)
    out: dict[str, Any] = {m: summarize(v) for m, v in values.items()}
    out["confusion_matrix"] = cm.tolist()
    t, s = np.concatenate(pooled_true), np.concatenate(pooled_score)
    if np.unique(t).size == 2:
        fpr, tpr, _ = roc_curve(t, s)
        out["roc"] = {"fpr": fpr.tolist(), "tpr": tpr.tolist()}
    else:  # every pooled test run in one class: no curve to draw
        out["roc"] = {"fpr": [0.0, 1.0], "tpr": [0.0, 1.0]}
    out["repeats"] = int(repeats)
    return out


summarise = summarize  # the spelling before 0.1.0: one spelling now, as analyze and featurize
