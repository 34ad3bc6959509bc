r"""Labels and the performance predictor (method step 5).

[`PerformancePredictor`][dtg_gpu.PerformancePredictor] is a scikit-learn classifier around a small torch MLP trained
with binary cross-entropy

.. math::
    L(\omega) = -\frac1n \sum_i \bigl[l_i \log p_i + (1 - l_i) \log (1 - p_i)\bigr]

(the mean rather than the method's sum: the same minimiser, a learning rate independent of
the batch size). Features are standardised with statistics of the training data only.

**Diverged runs.** A run whose weights became NaN/Inf within the checkpoints used has
non-finite features. The rule, explicit and documented: such a row is *insufficient*
(`classes_[0]`) with probability 1 at prediction time, and is left out of the MLP's
training data (it carries no statistics to learn from). NaNs never reach the MLP.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from dtg_gpu.core.validation import is_int, is_number

__all__ = ["label_runs", "split_runs", "PerformancePredictor", "quantile_normal", "training_quantiles", "SCALINGS"]


#: the recipe's flags a saved predictor records in its feature_settings
FEATURE_FLAGS = ("per_layer", "eigenvalue", "fold_batchnorm", "weight_stats")


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


@contextmanager
def _one_thread(device: torch.device):
    """Train the MLP on one CPU thread, then restore the caller's count. Its tensors are tiny
    (a batch of 32 runs × ~100 features), so intra-op threads cost more than they share:
    measured on 2 cores, 0.34–0.48 s per default fit on one thread against 0.97–1.8 s on two."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def weight_layout(topology) -> list:
    """`[[param, [weight shape]], ...]` of a channel topology's weight layers, in forward
    order: what a saved predictor records about the runs it was trained on."""
    return [[layer.param, list(layer.weight_shape)] for layer in topology.layers]


class _BlockHeads(torch.nn.Module):
    """One linear head per block of columns (a logistic regression each), as one
    `Linear(d, B)` whose weight is masked to the blocks; `forward` gives the `B` logits."""

    def __init__(self, blocks: Sequence[int]):
        super().__init__()
        d, b = int(sum(blocks)), len(blocks)
        self.linear = torch.nn.Linear(d, b)
        mask = torch.zeros(b, d)
        start = 0
        for i, w in enumerate(blocks):
            mask[i, start : start + int(w)] = 1.0
            start += int(w)
        self.mask: torch.Tensor
        self.register_buffer("mask", mask, persistent=False)
        with torch.no_grad():
            self.linear.weight.mul_(mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.linear.weight * self.mask, self.linear.bias)


def _mlp(n_in: int, hidden: Sequence[int], n_out: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [torch.nn.Linear(width, int(h)), torch.nn.ReLU()]
        width = int(h)
    layers.append(torch.nn.Linear(width, n_out))
    return torch.nn.Sequential(*layers)


class PerformancePredictor(ClassifierMixin, BaseEstimator):
    r"""Predict whether a run ends sufficient from its temporal features.

    Parameters
    ----------
    hidden_sizes : tuple of int, default ()
        Widths of the network's hidden layers. `()` (the default): no hidden layer, a
        logistic regression on the scaled features, whose L2 penalty is `weight_decay`:
        the small model ~100 training runs support (the benchmark suite chose it,
        `benchmarks/results/prediction_suite.md`). The seed's method: `(32,)`, see
        [`spec`][dtg_gpu.PerformancePredictor.spec].
    epochs : int, default 300
    batch_size : int, default 32
    optimizer : {"adam", "sgd"}, default "adam"
    learning_rate : float, default 1e-2
    weight_decay : float, default 0.1
        L2 penalty (AdamW-free: added to the gradient, as `torch.optim.Adam` does). The
        seed's MLP: `1e-4`.
    random_state : int, RandomState or None
        Seeds weight init and batch order; results are reproducible given it.
    device : str or None, default "cpu"
        `None`: CUDA when available. On CPU the MLP trains on one thread (restored
        afterwards): its tensors are tiny, and that is 2–4× faster than two threads here.
    feature_settings : dict, optional
        How the features were made (`alpha`, `timesteps`, `threshold`, ...); saved
        with the model so [`predict_runs`][dtg_gpu.PerformancePredictor.predict_runs] featurises new runs the same way.
    scaling : {"standard", "quantile"}, default "quantile"
        How features are scaled before the network, fitted on the training data only.
        `"standard"` (the seed's method): $(x - \bar x) / s$. `"quantile"` (the
        default): each feature through its training CDF to a normal score
        (`quantile_normal`, scikit-learn's `QuantileTransformer`). Centrality
        skewness and kurtosis are heavy-tailed across a sweep: a few collapsed runs set the
        standard deviation and squeeze the other runs into a sliver (digits LeNet-5 sweep,
        k = 5: the interquartile range is under 0.2 std for 21 of the 25 DTG features).
        Ranks keep the bulk of the sweep apart; it helps DTG features and hurts the weight
        statistics (README, prediction table).
    select : int or None, default None
        **Option beyond the method.** Keep only the `select` features with the largest ANOVA
        F statistic between the classes (scikit-learn's `f_classif`) on the scaled
        training data, and train the MLP on those; `None` (the method) keeps all, as does a
        `select` at or above the number of features. The choice is made in [`fit`][dtg_gpu.PerformancePredictor.fit],
        from the training split only, and saved with the model. It helps where a few of
        many features carry the signal (one convolution of LeNet-5) and hurts where it is
        spread over layers; the measurements are in
        `benchmarks/results/prediction_selection.md`.
    auto : bool, default False
        **Option beyond the method.** Choose `scaling` (standard, quantile), `select`
        (all, or the 5 with the largest F statistic) and, when `column_sets` is given, the feature set, by stratified
        `auto_folds`-fold cross-validation (ROC AUC) *on the training data of* [`fit`][dtg_gpu.PerformancePredictor.fit]
        only: nested inside any outer split, so a number measured on a held-out split stays
        honest. Ties go to the earlier candidate (the method's settings come first). The
        choice is in `scaling_`, `select_`, `columns_` and saved with the model.
    column_sets : dict of str to list of int, optional
        With `auto`: candidate feature sets, each a list of column indices of `X` (e.g.
        the DTG columns, the DTG and covariate columns); default: all columns.
    auto_folds : int, default 3
    blocks : "auto", sequence of int or None, default "auto"
        Column blocks (feature sets, in order) that each get a model of their own, their
        probabilities averaged: one small model per set rather than one on every column.
        `"auto"`: the blocks [`featurize`][dtg_gpu.featurize] marks on its default features
        (`X.column_blocks`: the DTG columns, the weight statistics, the covariates), and
        none for any other `X`. Only with `hidden_sizes=()`, `select=None`, no `auto`;
        otherwise one model reads every column.

    Attributes
    ----------
    classes_ : ndarray
    n_features_in_ : int
    mean_, scale_ : ndarray
        Standardisation fitted on the training data (`scaling="standard"`).
    quantiles_ : ndarray `[n, d]`
        Training quantiles (`scaling="quantile"`), `n = min(1000, rows)`.
    selected_ : ndarray of int
        Indices of the features the MLP sees, in increasing order (all of them unless
        `select` is set), counted within `columns_`.
    scaling_, select_ : the scaling and `select` used: the parameters, or `auto`'s choice.
    columns_ : ndarray of int
        The columns of `X` the predictor reads (all, unless `auto` chose one of
        `column_sets`).
    auto_scores_ : list of dict
        With `auto`: each candidate and its mean cross-validated ROC AUC, in the order tried.
    scores_ : ndarray `[d]`
        Their F statistics on the scaled training data (`select` set; 0 for a feature
        constant in the training data).
    network_ : torch.nn.Sequential

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 4)); y = (X[:, 0] > 0).astype(int)
    >>> clf = PerformancePredictor(random_state=0).fit(X, y)
    >>> clf.score(X, y) > 0.9
    True
    """

    def __init__(
        self,
        *,
        hidden_sizes: Sequence[int] = (),
        epochs: int = 300,
        batch_size: int = 32,
        optimizer: str = "adam",
        learning_rate: float = 1e-2,
        weight_decay: float = 0.1,
        random_state: Any = None,
        device: str | None = "cpu",
        feature_settings: dict | None = None,
        scaling: str = "quantile",
        select: int | None = None,
        auto: bool = False,
        column_sets: dict | None = None,
        auto_folds: int = 3,
        blocks: Any = "auto",
    ):
        self.hidden_sizes = hidden_sizes
        self.epochs = epochs
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device
        self.feature_settings = feature_settings
        self.scaling = scaling
        self.select = select
        self.auto = auto
        self.column_sets = column_sets
        self.auto_folds = auto_folds
        self.blocks = blocks

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    # ------------------------------------------------------------------ fitting
    def _device(self) -> torch.device:
        from dtg_gpu.core.devices import resolve_device

        return resolve_device(self.device)

    def _check_params(self) -> None:
        if not (
            self.blocks in ("auto", None)
            or (isinstance(self.blocks, (list, tuple)) and all(is_int(w) for w in self.blocks))
        ):
            raise ValueError(f"blocks must be 'auto', None or a list of column widths, got {self.blocks!r}")
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.select is not None and (not is_int(self.select) or self.select < 1):
            raise ValueError(f"select must be None or a positive integer, got {self.select!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate!r}")
        if any(int(h) < 1 for h in self.hidden_sizes):
            raise ValueError(f"hidden_sizes must be positive, got {self.hidden_sizes!r}")
        if (
            isinstance(self.auto_folds, bool)
            or not isinstance(self.auto_folds, (int, np.integer))
            or self.auto_folds < 2
        ):
            raise ValueError(f"auto_folds must be an integer >= 2, got {self.auto_folds!r}")
        if self.column_sets is not None:
            if not isinstance(self.column_sets, dict) or not self.column_sets:
                raise ValueError("column_sets must be a non-empty dict of name -> list of column indices")
            for name, cols in self.column_sets.items():
                if isinstance(cols, (str, bytes)) or not len(cols) or not all(is_int(c) and c >= 0 for c in cols):
                    raise ValueError(f"column_sets[{name!r}] must be a non-empty list of column indices, got {cols!r}")

    #: The seed's classifier (step 5 of docs/method.md): an MLP with one hidden layer of 32, standard scaling.
    SPEC_PARAMS: dict[str, Any] = {"hidden_sizes": (32,), "scaling": "standard", "weight_decay": 1e-4, "blocks": None}

    @classmethod
    def spec(cls, **params: Any) -> "PerformancePredictor":
        """The seed's method exactly: `SPEC_PARAMS` (an MLP of 32 hidden units on
        standardised features), with `params` (`random_state`, `feature_settings`, ...).

        Examples
        --------
        >>> PerformancePredictor.spec(random_state=0).hidden_sizes
        (32,)
        """
        return cls(**{**cls.SPEC_PARAMS, **params})

    def fit(self, X, y) -> "PerformancePredictor":
        """Fit on features `X [runs, d]` and labels `y [runs]`; returns `self`.

        The steps: validate and encode the labels; with `auto`, choose the settings
        (`_search`); scale and select on the finite training rows; train the MLP
        (`_train`)."""
        self._check_params()
        marked = self.blocks if self.blocks != "auto" else getattr(X, "column_blocks", None)
        X, y = validate_data(self, X, y, ensure_all_finite=False, dtype=np.float64)
        self.blocks_ = self._resolve_blocks(marked, X.shape[1])
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"only one class ({self.classes_[0]!r}) is present in the training labels; "
                "the predictor needs both sufficient and insufficient runs: pick a threshold "
                "that splits the sweep (e.g. threshold='median')"
            )
        finite = np.isfinite(X).all(1)
        if not finite.any():
            raise ValueError("every training row has non-finite features (all runs diverged)")
        columns = np.arange(X.shape[1])
        if self.column_sets is not None:
            bad = [n for n, c in self.column_sets.items() if max(c) >= X.shape[1]]
            if bad:
                raise ValueError(f"column_sets[{bad[0]!r}] names a column beyond X's {X.shape[1]}")
        self.scaling_, self.select_, self.columns_ = self.scaling, self.select, columns
        if self.auto:
            self.scaling_, self.select_, self.columns_ = self._search(X[finite], y_enc[finite])
        seed = self._seed()
        Xc = X[:, self.columns_]
        rows = np.isfinite(Xc).all(1)  # as predict_proba judges them: on the columns read
        self._prepare(Xc[rows], y_enc[rows])
        self._train(Xc[rows], y_enc[rows], seed)
        return self

    def _resolve_blocks(self, marked: Any, d: int) -> tuple[int, ...] | None:
        """The column blocks the fit uses (see `blocks`), or `None` for one model."""
        if marked is None or self.hidden_sizes or self.select is not None or self.auto or self.column_sets:
            return None
        widths = tuple(int(w) for w in marked)
        if any(w < 1 for w in widths) or sum(widths) != d:
            raise ValueError(f"blocks {list(widths)} must be positive widths that add up to X's {d} columns")
        return widths if len(widths) > 1 else None

    def _seed(self) -> int:
        from sklearn.utils import check_random_state

        # an int seeds torch as given; None or a RandomState (scikit-learn's convention) draws one
        return (
            int(self.random_state)
            if isinstance(self.random_state, (int, np.integer))
            else int(check_random_state(self.random_state).randint(0, 2**31 - 1))
        )

    def _search(self, X: np.ndarray, y: np.ndarray) -> tuple[str, int | None, np.ndarray]:
        """`auto`: the (scaling, select, columns) with the best mean ROC AUC over stratified
        folds of the training rows `X` (finite, encoded labels `y`)."""
        from sklearn.metrics import roc_auc_score
        from sklearn.model_selection import StratifiedKFold

        sets = {"all": list(range(X.shape[1]))} if self.column_sets is None else dict(self.column_sets)
        folds = int(min(self.auto_folds, np.bincount(y).min()))
        seed = self._seed()
        candidates = [
            (name, scaling, select)
            for name in sets
            for scaling in SCALINGS
            for select in (None, 5)
            if select is None or select < len(sets[name])
        ]
        self.auto_scores_ = []
        best, best_score = candidates[0], -np.inf
        if folds >= 2 and len(candidates) > 1:
            splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed % (2**31)).split(X, y))
            for name, scaling, select in candidates:
                cols = np.asarray(sets[name], dtype=int)
                scores = []
                for train, test in splits:
                    inner = PerformancePredictor(**{**self.get_params(), "auto": False, "column_sets": None})
                    inner.set_params(scaling=scaling, select=select, random_state=seed)
                    inner.fit(X[train][:, cols], y[train])
                    p = inner.predict_proba(X[test][:, cols])[:, 1]
                    scores.append(roc_auc_score(y[test], p) if np.unique(y[test]).size == 2 else 0.5)
                score = float(np.mean(scores))
                self.auto_scores_.append({"columns": name, "scaling": scaling, "select": select, "auc": score})
                if score > best_score + 1e-12:
                    best, best_score = (name, scaling, select), score
        name, scaling, select = best
        return scaling, select, np.asarray(sets[name], dtype=int)

    def _prepare(self, Xf: np.ndarray, yf: np.ndarray) -> None:
        """Scaling statistics and the selected features, from the finite training rows."""
        self.mean_ = Xf.mean(0)
        scale = Xf.std(0)
        self.scale_ = np.where(scale > 0, scale, 1.0)
        if self.scaling_ == "quantile":
            self.quantiles_ = training_quantiles(Xf)
        self.selected_ = np.arange(Xf.shape[1])
        if self.select_ is not None and self.select_ < Xf.shape[1]:
            self.scores_ = np.where(scale > 0, _f_scores(self._scale_all(Xf), yf), 0.0)  # constant → 0
            self.selected_ = np.sort(np.argsort(-self.scores_, kind="stable")[: int(self.select_)])

    def _train(self, Xf: np.ndarray, yf: np.ndarray, seed: int) -> None:
        """The MLP on the scaled, selected rows (binary cross-entropy, seeded)."""
        gen = torch.Generator().manual_seed(seed)
        torch_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        n_out = 1 if len(self.classes_) == 2 else len(self.classes_)
        blocks = getattr(self, "blocks_", None) if n_out == 1 else None
        self.blocks_ = blocks
        net = _BlockHeads(blocks) if blocks else _mlp(self.selected_.size, self.hidden_sizes, n_out)
        torch.random.set_rng_state(torch_state)
        dev = self._device()
        net = net.to(dev)
        xt = torch.as_tensor(self._scale(Xf), dtype=torch.float32, device=dev)
        yt = torch.as_tensor(yf, device=dev)
        opt: torch.optim.Optimizer
        if self.optimizer == "adam":
            opt = torch.optim.Adam(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)
        else:
            opt = torch.optim.SGD(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay, momentum=0.9)
        loss_fn = torch.nn.BCEWithLogitsLoss() if n_out == 1 else torch.nn.CrossEntropyLoss()
        n = xt.shape[0]
        bs = min(int(self.batch_size), n)
        net.train()
        with _one_thread(dev):
            for _ in range(int(self.epochs)):
                order = torch.randperm(n, generator=gen).to(dev)
                for start in range(0, n, bs):
                    idx = order[start : start + bs]
                    out = net(xt[idx])
                    target = yt[idx].float().unsqueeze(1) if n_out == 1 else yt[idx]
                    if blocks:  # every head its own logistic regression: the sum of their losses
                        target = target.expand_as(out)
                        loss = loss_fn(out, target) * out.shape[1]
                    else:
                        loss = loss_fn(out, target)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        net.eval()
        self.network_ = net.cpu()
        self.loss_ = float(loss.detach())

    def _scale_all(self, X: np.ndarray) -> np.ndarray:
        if self.scaling_ == "quantile":
            return quantile_normal(X, self.quantiles_)
        return (X - self.mean_) / self.scale_

    def _scale(self, X: np.ndarray) -> np.ndarray:
        """What the MLP sees: the scaled selected features (`X`: the `columns_`)."""
        Z = self._scale_all(X)
        return Z if self.selected_.size == Z.shape[1] else Z[:, self.selected_]

    # --------------------------------------------------------------- prediction
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities `[runs, n_classes]`; non-finite rows are `classes_[0]`."""
        check_is_fitted(self, "network_")
        X = validate_data(self, X, reset=False, ensure_all_finite=False, dtype=np.float64)[:, self.columns_]
        finite = np.isfinite(X).all(1)
        proba = np.zeros((X.shape[0], len(self.classes_)))
        proba[~finite, 0] = 1.0
        if finite.any():
            xt = torch.as_tensor(self._scale(X[finite]), dtype=torch.float32)
            with torch.no_grad():
                out = self.network_(xt)
            if len(self.classes_) == 2:
                p = torch.sigmoid(out).mean(1).double().numpy()  # one head, or the heads' mean
                proba[finite] = np.stack([1 - p, p], 1)
            else:
                proba[finite] = torch.softmax(out, 1).double().numpy()
        return proba

    def predict(self, X) -> np.ndarray:
        """The most probable class of each row."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def predict_runs(self, runs, device=None, strict: bool = False) -> np.ndarray:
        """Featurise `runs` with the saved `feature_settings`, then [`predict_proba`][dtg_gpu.PerformancePredictor.predict_proba].

        A run that cannot be read or traced gets a row of NaN probabilities (named in a
        [`FailedRunsWarning`][dtg_gpu.exceptions.FailedRunsWarning]); `strict=True` raises instead. A
        diverged run (non-finite weights) is insufficient by rule, as in [`predict_proba`][dtg_gpu.PerformancePredictor.predict_proba].
        """
        from dtg_gpu.analysis import extract_features
        from dtg_gpu.core.failures import READ_ERRORS, warn_failures
        from dtg_gpu.engine.options import SolverOptions
        from dtg_gpu.features.temporal import FeatureRecipe

        fs = self.feature_settings or {}
        if "timesteps" not in fs or "alpha" not in fs:
            raise ValueError(
                "this predictor has no feature_settings (alpha, timesteps): "
                "featurise the runs yourself and call predict_proba"
            )
        k, alpha = fs["timesteps"], fs["alpha"]
        if not is_int(k) or k < 1:
            raise ValueError(f"this predictor's feature_settings.timesteps is not a positive integer: {k!r}")
        if not is_number(alpha) or not 0 < alpha <= 1:
            raise ValueError(f"this predictor's feature_settings.alpha is not in (0, 1]: {alpha!r}")
        covariates = fs.get("covariates") or []
        if not isinstance(covariates, list) or not all(isinstance(c, str) for c in covariates):
            raise ValueError(f"this predictor's feature_settings.covariates is not a list of names: {covariates!r}")
        runs = list(runs)
        failures: dict[str, str] = {}
        arch = fs.get("architecture")
        if arch is not None:  # trained on one architecture: refuse runs of another, by name
            for r in runs:
                try:
                    sig = weight_layout(r.topology)
                except READ_ERRORS:
                    continue  # featurize reports it
                if sig != arch:
                    why = (
                        f"its architecture ({len(sig)} weight layers, first {sig[0] if sig else None}) is "
                        f"not the predictor's ({len(arch)} weight layers, first {arch[0] if arch else None})"
                    )
                    if strict:
                        raise ValueError(f"run {r.name!r}: {why}")
                    failures[r.name] = why
        for r in runs:  # a run still short of k checkpoints is named; the others are judged
            if r.name not in failures and len(r) < k:
                why = f"has {len(r)} checkpoint(s); this predictor reads the first {k}"
                if strict:
                    from dtg_gpu.exceptions import InsufficientCheckpointsError

                    raise InsufficientCheckpointsError(f"run {r.name!r}: {why}")
                failures[r.name] = why
        todo_idx = [i for i, r in enumerate(runs) if r.name not in failures]
        proba = np.full((len(runs), len(self.classes_)), np.nan)
        if todo_idx:
            # every flag explicit: a file saved before the default recipe reads the same
            recipe = FeatureRecipe(**{f: bool(fs.get(f, False)) for f in FEATURE_FLAGS})
            res = extract_features(
                [runs[i] for i in todo_idx],
                k,
                features=recipe,
                alpha=float(alpha),
                device=device,
                solver=SolverOptions(tol=float(fs.get("tol", 1e-6)), method=fs.get("method", "auto")),
                strict=strict,
                covariates=covariates,
            )
            failures.update(res.failures)
            proba[todo_idx] = self.predict_proba(res.features.double().numpy())
        warn_failures(failures, stacklevel=2)
        proba[[r.name in failures for r in runs]] = np.nan
        return proba

    # -------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the fitted predictor and its feature settings to one `.safetensors` file."""
        from safetensors.torch import save_file

        check_is_fitted(self, "network_")
        tensors = {f"network.{k}": v.detach().contiguous() for k, v in self.network_.state_dict().items()}
        tensors["mean"] = torch.as_tensor(self.mean_)
        tensors["scale"] = torch.as_tensor(self.scale_)
        if self.scaling_ == "quantile":
            tensors["quantiles"] = torch.as_tensor(self.quantiles_).contiguous()
        if self.select_ is not None:
            tensors["selected"] = torch.as_tensor(self.selected_, dtype=torch.int64)
        if self.columns_.size != self.n_features_in_:
            tensors["columns"] = torch.as_tensor(self.columns_, dtype=torch.int64)
        params = self.get_params()
        params["hidden_sizes"] = [int(h) for h in params["hidden_sizes"]]
        if params["blocks"] not in ("auto", None):
            params["blocks"] = [int(w) for w in params["blocks"]]
        if not isinstance(params["random_state"], (int, type(None))):
            params["random_state"] = None
        meta = {
            "format": "dtg_gpu.PerformancePredictor/1",
            "params": params,
            "classes": self.classes_.tolist(),
            "n_features_in": int(self.n_features_in_),
            "fitted": {
                "scaling": self.scaling_,
                "select": None if self.select_ is None else int(self.select_),
                **({"blocks": [int(w) for w in blocks]} if (blocks := getattr(self, "blocks_", None)) else {}),
            },
        }
        from dtg_gpu.core.files import atomic_write

        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"dtg_predictor": json.dumps(meta)}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PerformancePredictor":
        """Read a predictor written by [`save`][dtg_gpu.PerformancePredictor.save] (no pickle, no code), validated.

        Predictor files are untrusted: every field is checked before it is used, and the
        network's shapes against the tensors the file holds before anything is built, so a
        tampered file is refused with one line instead of predicting nonsense.

        Raises
        ------
        CheckpointError
            Not a predictor file, or a field that is missing, malformed or inconsistent
            (the message names the file and the field).
        """
        from safetensors import SafetensorError, safe_open

        from dtg_gpu.exceptions import CheckpointError

        def bad(what: str) -> CheckpointError:
            return CheckpointError(f"{path}: not a valid dtg_gpu predictor file: {what}")

        try:
            with safe_open(os.fspath(path), framework="pt") as f:
                raw = (f.metadata() or {}).get("dtg_predictor")
                if raw is None:
                    raise bad("no 'dtg_predictor' metadata")
                meta = json.loads(raw)
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except CheckpointError:
            raise
        except (SafetensorError, OSError, ValueError, TypeError, RuntimeError, RecursionError) as exc:
            raise bad(" ".join(str(exc).split()) or type(exc).__name__) from None
        clf = cls._from_parts(meta, tensors, bad)
        return clf

    @classmethod
    def _from_parts(cls, meta: Any, tensors: dict, bad) -> "PerformancePredictor":
        """A predictor from a file's metadata and tensors, every field checked (`bad(why)`
        makes the error that names the file)."""
        clf, classes, d, fitted = cls._meta_from(meta, bad)
        expected, d = clf._scaling_from(tensors, d, bad)
        clf._network_from(tensors, fitted, classes, d, expected, bad)
        return clf

    @classmethod
    def _meta_from(cls, meta: Any, bad) -> tuple["PerformancePredictor", list, int, dict]:
        if not isinstance(meta, dict) or meta.get("format") != "dtg_gpu.PerformancePredictor/1":
            raise bad("unknown format")
        params = meta.get("params")
        known = set(cls().get_params())
        if not isinstance(params, dict) or not set(params) <= known:
            raise bad(f"params must be an object with keys among {sorted(known)}")
        hidden = params.get("hidden_sizes", (32,))
        if not isinstance(hidden, list) or not all(is_int(h) and 1 <= h <= 65536 for h in hidden):
            raise bad(f"hidden_sizes must be a list of integers in [1, 65536], got {hidden!r}")
        params["hidden_sizes"] = tuple(hidden)
        if isinstance(params.get("blocks"), list):
            params["blocks"] = tuple(params["blocks"])
        if params.get("feature_settings") is not None and not isinstance(params["feature_settings"], dict):
            raise bad("feature_settings must be an object")
        try:
            clf = cls(**params)
            clf._check_params()
        except (ValueError, TypeError) as exc:
            raise bad(str(exc)) from None
        classes = meta.get("classes")
        if (
            not isinstance(classes, list)
            or len(classes) < 2
            or len(set(map(repr, classes))) != len(classes)
            or not all(isinstance(c, (int, str)) and not isinstance(c, bool) for c in classes)
        ):
            raise bad(f"classes must list at least two distinct labels, got {classes!r}")
        d = meta.get("n_features_in")
        if not is_int(d) or not 1 <= d <= 10_000_000:
            raise bad(f"n_features_in must be a positive integer, got {d!r}")
        fitted = meta.get("fitted", {"scaling": clf.scaling, "select": clf.select})  # files before auto
        if (
            not isinstance(fitted, dict)
            or fitted.get("scaling") not in SCALINGS
            or not (
                fitted.get("select") is None
                or (
                    isinstance(fitted["select"], int)
                    and not isinstance(fitted["select"], bool)
                    and fitted["select"] >= 1
                )
            )
        ):
            raise bad(f"fitted must hold a scaling among {SCALINGS} and select (null or a positive integer)")
        clf.scaling_, clf.select_ = fitted["scaling"], fitted.get("select")
        clf.classes_ = np.array(classes)
        clf.n_features_in_ = d
        return clf, classes, d, fitted

    def _scaling_from(self, tensors: dict, d: int, bad) -> tuple[set[str], int]:
        """Columns, scaling and selected features; returns the tensors read and the width."""
        clf = self
        columns = tensors.get("columns")
        if columns is not None:
            if columns.dim() != 1 or columns.dtype != torch.int64 or not 1 <= columns.numel() <= d:
                raise bad("'columns' must be an int64 vector of at most n_features_in indices")
            c = columns.numpy()
            if c.min() < 0 or c.max() >= d or (np.diff(c) == 0).any():
                raise bad("'columns' must be distinct indices below n_features_in")
            clf.columns_ = c
            d = c.size
        else:
            clf.columns_ = np.arange(d)

        def vector(name: str, positive: bool = False) -> np.ndarray:
            t = tensors.get(name)
            if t is None or tuple(t.shape) != (d,) or not t.is_floating_point():
                raise bad(f"{name!r} must be a float vector of {d} values")
            v = t.double().numpy()
            if not np.isfinite(v).all() or (positive and not (v > 0).all()):
                raise bad(f"{name!r} holds {'non-positive or ' if positive else ''}non-finite values")
            return v

        clf.mean_ = vector("mean")
        clf.scale_ = vector("scale", positive=True)
        expected = {"mean", "scale"} | ({"columns"} if columns is not None else set())
        if clf.scaling_ == "quantile":
            q = tensors.get("quantiles")
            if q is None or q.dim() != 2 or q.shape[1] != d or q.shape[0] < 1:
                raise bad(f"a quantile-scaled predictor needs 'quantiles' of shape [n, {d}]")
            qn = q.double().numpy()
            if not np.isfinite(qn).all() or (np.diff(qn, axis=0) < 0).any():
                raise bad("'quantiles' must be finite and non-decreasing down each column")
            clf.quantiles_ = qn
            expected.add("quantiles")
        sel = tensors.get("selected")
        if clf.select_ is not None:
            if sel is None or sel.dim() != 1 or sel.dtype != torch.int64:
                raise bad(f"a predictor with select={clf.select_} needs its 'selected' features (int64)")
            s = sel.numpy()
            if (
                s.size != min(int(clf.select_), d)
                or (s.size and (s.min() < 0 or s.max() >= d))
                or (np.diff(s) <= 0).any()
            ):
                raise bad("'selected' must be increasing feature indices within range")
            clf.selected_ = s
            expected.add("selected")
        else:
            clf.selected_ = np.arange(d)
        return expected, d

    def _network_from(self, tensors: dict, fitted: dict, classes: list, d: int, expected: set[str], bad) -> None:
        """The network's weights, their shapes checked against the rest of the file."""
        clf = self
        n_out = 1 if len(classes) == 2 else len(classes)
        blocks = fitted.get("blocks")
        if blocks is not None and (
            not isinstance(blocks, list)
            or len(blocks) < 2
            or not all(is_int(w) and w >= 1 for w in blocks)
            or sum(blocks) != clf.selected_.size
            or n_out != 1
            or clf.hidden_sizes
        ):
            raise bad(f"fitted.blocks must be positive widths adding up to the {clf.selected_.size} features")
        clf.blocks_ = tuple(blocks) if blocks else None
        shapes: dict[str, tuple[int, ...]] = {}
        if blocks:
            shapes["network.linear.weight"], shapes["network.linear.bias"] = (len(blocks), d), (len(blocks),)
        widths = [int(clf.selected_.size), *clf.hidden_sizes, n_out]
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            if blocks:
                break
            shapes[f"network.{2 * i}.weight"], shapes[f"network.{2 * i}.bias"] = (b, a), (b,)
        for k, shape in shapes.items():
            t = tensors.get(k)
            if t is None or tuple(t.shape) != shape or not t.is_floating_point() or not torch.isfinite(t).all():
                raise bad(f"{k!r} must be a finite float tensor of shape {list(shape)}")
        extra = set(tensors) - expected - set(shapes)
        if extra:
            raise bad(f"unexpected tensors {sorted(extra)[:5]}")
        clf.network_ = (  # sizes checked against the file
            _BlockHeads(blocks) if blocks else _mlp(clf.selected_.size, clf.hidden_sizes, n_out)
        )
        clf.network_.load_state_dict({k[len("network.") :]: tensors[k].float() for k in shapes})
        clf.network_.eval()
