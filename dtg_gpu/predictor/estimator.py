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

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from dtg_gpu.core.validation import check_choice, is_int, is_number
from dtg_gpu.predictor.networks import BLOCK_MODELS, _BlockHeads, _mlp, _one_thread
from dtg_gpu.predictor.persistence import load_predictor, save_predictor
from dtg_gpu.predictor.scaling import SCALINGS, _f_scores, quantile_normal, training_quantiles
from dtg_gpu.topology.types import weight_layout

__all__ = ["PerformancePredictor", "FEATURE_FLAGS", "HEAD_WEIGHTS", "marked_sets", "mixture_weights"]


#: the recipe's flags a saved predictor records in its feature_settings
FEATURE_FLAGS = ("per_layer", "eigenvalue", "fold_batchnorm", "weight_stats", "spec_block")


#: how the blocks' probabilities are combined (`PerformancePredictor(head_weights=...)`)
HEAD_WEIGHTS = ("equal", "stacked")


def mixture_weights(P: np.ndarray, y: np.ndarray, *, iterations: int = 5000, tol: float = 1e-12) -> np.ndarray:
    r"""The weights on the simplex whose mixture of the heads' probabilities is most likely.

    Maximises $\sum_n \log \sum_i w_i\, q_{ni}$ with $q_{ni} = P_{ni}$ where $y_n = 1$ and
    $1 - P_{ni}$ where $y_n = 0$, over $w_i \ge 0$, $\sum_i w_i = 1$: concave in $w$, solved by
    EM for mixture proportions ($w_i \leftarrow \frac1n \sum_n w_i q_{ni} / \sum_j w_j q_{nj}$,
    monotone, from equal weights).

    Parameters
    ----------
    P : ndarray `[n, h]`
        Each head's probability of class 1 for each row (out of fold).
    y : ndarray `[n]` of {0, 1}

    Returns
    -------
    ndarray `[h]`

    Examples
    --------
    >>> y = np.array([0, 0, 1, 1])
    >>> P = np.array([[0.1, 0.5], [0.2, 0.5], [0.9, 0.5], [0.8, 0.5]])
    >>> mixture_weights(P, y).round(3).tolist()
    [1.0, 0.0]
    """
    q = np.clip(np.where(np.asarray(y)[:, None] == 1, P, 1.0 - P), 1e-12, 1.0)
    w = np.full(q.shape[1], 1.0 / q.shape[1])
    for _ in range(int(iterations)):
        r = q * w
        new = (r / r.sum(1, keepdims=True)).mean(0)
        done = np.abs(new - w).max() < tol
        w = new
        if done:
            break
    return w / w.sum()


def marked_sets(clf: Any, X: Any) -> dict[str, tuple]:
    """The parameters that give `clf` the feature sets [`featurize`][dtg_gpu.featurize] marked
    on `X` (`column_blocks`, `column_block_models`) where its `blocks` / `block_models` are
    `"auto"`: the marks do not survive turning `X` into an array (splits, `.numpy()`)."""
    params = clf.get_params()
    blocks, models = getattr(X, "column_blocks", None), getattr(X, "column_block_models", None)
    if blocks is None or params.get("blocks", None) != "auto":
        return {}
    out = {"blocks": tuple(blocks)}
    if models and params.get("block_models", None) == "auto":
        out["block_models"] = tuple(models)
    return out


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
        probabilities combined (`head_weights`): one small model per set rather than one on every column.
        `"auto"`: the blocks [`featurize`][dtg_gpu.featurize] marks on its default features
        (`X.column_blocks`: the DTG columns, the weight statistics, the seed's block, the
        covariates), and
        none for any other `X`. Only with `hidden_sizes=()`, `select=None`, no `auto`;
        otherwise one model reads every column.
    block_models : "auto" or sequence of {"linear", "mlp"}, default "auto"
        **Option beyond the method.** The model of each block (with `blocks`): `"linear"`, a
        logistic regression on the predictor's `scaling` with its `weight_decay`; `"mlp"`, the
        seed's MLP on that block alone ([`SPEC_PARAMS`][dtg_gpu.PerformancePredictor.SPEC_PARAMS]:
        32 hidden units, standard scaling, weight decay 1e-4, with this predictor's epochs,
        batch size, optimiser and learning rate). The heads' probabilities are combined as
        `head_weights` says. `"auto"`: the models [`featurize`][dtg_gpu.featurize] marks
        (`X.column_block_models`: `"mlp"` for the seed's block of `spec_block=True`), else
        all linear. At least one block must be linear.
    head_weights : {"stacked", "equal"}, default "stacked"
        How the blocks' probabilities are combined (with `blocks`). `"stacked"`: a weighted
        mean whose weights come from the training data of [`fit`][dtg_gpu.PerformancePredictor.fit]
        only: every block's model is fitted on `auto_folds - 1` of `auto_folds` stratified folds
        and predicts the fold left out; $w^\star$ maximises the likelihood of those out-of-fold
        probabilities' mixture $\sum_i w_i p_i$ over the simplex (a concave problem: EM for
        mixture proportions, `mixture_weights`); the weights used are halfway between it and
        equal, $w = (w^\star + 1/h) / 2$, so that ~100 runs cannot hand one block everything.
        It costs `auto_folds` more fits; equal weights when a class has fewer than 2 runs.
        `"equal"`: their plain mean (the default until 2026-12-07; chosen against it on ten
        sweeps, `benchmarks/results/prediction_default_choice.md`). Saved in `block_weights_`.

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
    network_ : torch.nn.Module
        The MLP, or the linear heads of the blocks (`blocks_`).
    blocks_, block_models_ : tuple or None
        The column blocks each with a model of their own, and each block's model.
    block_mlps_ : list of PerformancePredictor
        The fitted seed's MLP of each `"mlp"` block, in block order.
    block_weights_ : ndarray `[blocks]` or None
        Each block's weight in the mean (`head_weights`): fitted for `"stacked"`, `1 / h` each
        for `"equal"`.

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
        block_models: Any = "auto",
        head_weights: str = "stacked",
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
        self.block_models = block_models
        self.head_weights = head_weights

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
        if not (
            (isinstance(self.block_models, str) and self.block_models == "auto")
            or (
                isinstance(self.block_models, (list, tuple))
                and all(m in BLOCK_MODELS for m in self.block_models)
                and "linear" in self.block_models
            )
        ):
            raise ValueError(
                "block_models must be 'auto' or a list of 'linear' / 'mlp' (one per block, at least one "
                f"'linear'), got {self.block_models!r}"
            )
        check_choice("scaling", self.scaling, SCALINGS)
        check_choice("head_weights", self.head_weights, HEAD_WEIGHTS)
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

    #: The seed's classifier (step 5 of docs/method.md): an MLP with one hidden layer of 32, standard
    #: scaling. One network, so no heads to weight: `head_weights="equal"` only keeps its files free of
    #: the newer parameter (format /1, as older versions wrote and read them).
    SPEC_PARAMS: dict[str, Any] = {
        "hidden_sizes": (32,),
        "scaling": "standard",
        "weight_decay": 1e-4,
        "blocks": None,
        "head_weights": "equal",
    }

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
        models = self.block_models if self.block_models != "auto" else getattr(X, "column_block_models", None)
        X, y = validate_data(self, X, y, ensure_all_finite=False, dtype=np.float64)
        self.blocks_ = self._resolve_blocks(marked, X.shape[1])
        self.block_models_ = self._resolve_models(models)
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
        self.block_weights_ = None
        if self.blocks_:
            h = len(self.blocks_)
            self.block_weights_ = np.full(h, 1.0 / h)
            if self.head_weights == "stacked":
                self.block_weights_ = self._stacked_weights(Xc[rows], y_enc[rows], seed)
        return self

    def _inner_splits(self, X: np.ndarray, y: np.ndarray, seed: int) -> list:
        """Stratified `auto_folds`-fold splits of training rows (encoded labels `y`), seeded; at
        most as many folds as the smaller class has runs, none below two (`auto`, stacking)."""
        from sklearn.model_selection import StratifiedKFold

        folds = int(min(self.auto_folds, np.bincount(y, minlength=2).min()))
        if folds < 2:
            return []
        return list(StratifiedKFold(folds, shuffle=True, random_state=seed % (2**31)).split(X, y))

    def _stacked_weights(self, Xf: np.ndarray, yf: np.ndarray, seed: int) -> np.ndarray:
        """`head_weights="stacked"`: the blocks' weights from out-of-fold probabilities of the
        finite training rows (see `head_weights`); equal when a class has fewer runs than 2 folds."""
        h = len(self.blocks_ or ())
        splits = self._inner_splits(Xf, yf, seed)
        if not splits:
            return np.full(h, 1.0 / h)
        params = {**self.get_params(), "head_weights": "equal", "blocks": self.blocks_}
        params.update(block_models=self.block_models_, random_state=seed)
        oof = np.empty((yf.size, h))
        for train, test in splits:
            inner = PerformancePredictor(**params).fit(Xf[train], yf[train])
            oof[test] = inner._block_probabilities(Xf[test])
        return (mixture_weights(oof, yf) + 1.0 / h) / 2

    def _resolve_blocks(self, marked: Any, d: int) -> tuple[int, ...] | None:
        """The column blocks the fit uses (see `blocks`), or `None` for one model."""
        if marked is None or self.hidden_sizes or self.select is not None or self.auto or self.column_sets:
            return None
        widths = tuple(int(w) for w in marked)
        if any(w < 1 for w in widths) or sum(widths) != d:
            raise ValueError(f"blocks {list(widths)} must be positive widths that add up to X's {d} columns")
        return widths if len(widths) > 1 else None

    def _resolve_models(self, models: Any) -> tuple[str, ...] | None:
        """Each block's model (see `block_models`), or `None` without blocks."""
        if self.blocks_ is None:
            return None
        if models is None:
            return ("linear",) * len(self.blocks_)
        models = tuple(str(m) for m in models)
        if len(models) != len(self.blocks_) or not set(models) <= set(BLOCK_MODELS) or "linear" not in models:
            raise ValueError(
                f"block_models {list(models)} must name 'linear' or 'mlp' for each of the {len(self.blocks_)} "
                "blocks, at least one 'linear'"
            )
        return models

    def _block_columns(self, i: int) -> slice:
        """The columns (within `columns_`) of block `i`."""
        blocks = self.blocks_ or ()
        start = int(sum(blocks[:i]))
        return slice(start, start + int(blocks[i]))

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

        sets = {"all": list(range(X.shape[1]))} if self.column_sets is None else dict(self.column_sets)
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
        splits = self._inner_splits(X, y, seed) if len(candidates) > 1 else []
        if splits:
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
        models = getattr(self, "block_models_", None) if blocks else None
        self.block_models_ = models
        linear = [i for i, m in enumerate(models) if m == "linear"] if models else None
        net = _BlockHeads(blocks, linear) if blocks else _mlp(self.selected_.size, self.hidden_sizes, n_out)
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
        self.block_mlps_ = [
            self._block_mlp(seed).fit(Xf[:, self._block_columns(i)], yf)
            for i, m in enumerate(models or ())
            if m == "mlp"
        ]

    def _block_mlp(self, seed: int) -> "PerformancePredictor":
        """The seed's MLP for an `"mlp"` block, with this predictor's training settings."""
        keep = ("epochs", "batch_size", "optimizer", "learning_rate", "device")
        return PerformancePredictor.spec(random_state=seed, **{k: getattr(self, k) for k in keep})

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
            if len(self.classes_) == 2:
                heads = self._block_probabilities(X[finite])
                w = getattr(self, "block_weights_", None)
                p = heads.mean(1) if w is None else heads @ w  # head_weights: equal, or stacked
                proba[finite] = np.stack([1 - p, p], 1)
            else:
                xt = torch.as_tensor(self._scale(X[finite]), dtype=torch.float32)
                with torch.no_grad():
                    proba[finite] = torch.softmax(self.network_(xt), 1).double().numpy()
        return proba

    def _block_probabilities(self, X: np.ndarray) -> np.ndarray:
        """Each head's probability of the second class, `[rows, heads]` in block order (one
        column without blocks), for finite rows `X` of the `columns_` (binary labels)."""
        xt = torch.as_tensor(self._scale(X), dtype=torch.float32)
        with torch.no_grad():
            linear = torch.sigmoid(self.network_(xt)).double().numpy()  # one head, or one per linear block
        models = getattr(self, "block_models_", None)
        if not models:
            return linear
        out = np.empty((X.shape[0], len(models)))
        out[:, [i for i, m in enumerate(models) if m == "linear"]] = linear
        mlps = iter(getattr(self, "block_mlps_", None) or ())
        for i, m in enumerate(models):
            if m == "mlp":
                out[:, i] = next(mlps).predict_proba(X[:, self._block_columns(i)])[:, 1]
        return out

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
        save_predictor(self, path)

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
        return load_predictor(cls, path)
