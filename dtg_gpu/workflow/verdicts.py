r"""Sweep-level workflow shared by the CLI, the demo and the benchmarks: featurise a
sweep once, then evaluate feature sets (DTG, baselines) for several early-prediction `k`.

Temporal reinforcement is causal (`s̃_t` depends on `s_1..s_t` only), so the features
of the first `k` checkpoints are the first `5·k` columns of the full feature matrix:
one centrality solve serves every `k`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from dtg_gpu.analysis import extract_features
from dtg_gpu.core.failures import READ_ERRORS, warn_failures
from dtg_gpu.engine.executors import default_cache
from dtg_gpu.engine.options import SolverOptions
from dtg_gpu.features.baselines import learning_curve, spectral_alpha, weight_statistics
from dtg_gpu.features.layout import StatisticsLayout
from dtg_gpu.features.statistics import STATISTICS, layer_node_groups
from dtg_gpu.features.temporal import FEATURE_RECIPES, FeatureRecipe, temporal_features
from dtg_gpu.io.run import Run
from dtg_gpu.predictor.estimator import PerformancePredictor
from dtg_gpu.predictor.evaluation import evaluate
from dtg_gpu.predictor.labels import label_runs
from dtg_gpu.sweeps.loading import SweepRuns

__all__ = ["SweepFeatures", "featurize_sweep", "feature_sets", "compare", "run_verdicts", "FEATURE_SETS"]

FEATURE_SETS = (
    "default",
    "dtg",
    "weight_stats",
    "spectral",
    "dtg+weight_stats",
    "dtg+eigenvalue",
    "dtg_per_layer",
    "dtg_per_layer+eigenvalue",
    "learning_curve",
    "covariates",
)


@dataclass
class SweepFeatures:
    runs: list[Run]
    stats: torch.Tensor  # [runs, T, 5] raw statistics
    alpha: float
    accuracies: np.ndarray  # [runs]
    log_eigenvalue: torch.Tensor | None = None  # [runs, T] log lambda_1 (option beyond the method)
    layer_stats: torch.Tensor | None = None  # [runs, T, 5·L] per-layer statistics (option)
    failed: dict = field(default_factory=dict)  # run name -> why it could not be read or solved
    usable: np.ndarray = None  # type: ignore[assignment]  # [runs] bool, False for runs in `failed` (all True if not given)
    layout: StatisticsLayout | None = None  # the columns of stats ⊕ layer_stats ⊕ log_eigenvalue
    folded: "SweepFeatures | None" = None  # the same with batch norm folded (None: nothing to fold)

    def __post_init__(self) -> None:
        if self.usable is None:
            self.usable = np.ones(len(self.runs), dtype=bool)

    def dtg(self, k: int, eigenvalue: bool = False, per_layer: bool = False) -> np.ndarray:
        """DTG features of the first `k` checkpoints; the options as in [`featurize`][dtg_gpu.featurize]
        (columns: [`StatisticsLayout.columns`][dtg_gpu.features.layout.StatisticsLayout.columns]
        of `layout_for`)."""
        for on, extra, what in (
            (per_layer, self.layer_stats, "per-layer statistics"),
            (eigenvalue, self.log_eigenvalue, "eigenvalues"),
        ):
            if on and extra is None:
                raise ValueError(f"these features were made without {what}")
        lay = self.layout_for(per_layer=per_layer, eigenvalue=eigenvalue)
        stats = lay.join(
            self.stats[:, :k],
            self.layer_stats[:, :k] if per_layer and self.layer_stats is not None else None,
            self.log_eigenvalue[:, :k] if eigenvalue and self.log_eigenvalue is not None else None,
        )
        return temporal_features(stats, self.alpha).double().numpy()

    def layout_for(self, per_layer: bool = False, eigenvalue: bool = False) -> StatisticsLayout:
        """The column layout of `dtg` with these options."""
        layers = self.layout.layers if (per_layer and self.layout is not None) else ()
        if per_layer and not layers and self.layer_stats is not None:  # made without names
            layers = tuple(f"layer{i}" for i in range(self.layer_stats.shape[-1] // 5))
        return StatisticsLayout(layers=layers, eigenvalue=eigenvalue)

    @property
    def timesteps(self) -> int:
        return int(self.stats.shape[1])

    def table(self):
        """Tidy per-timestep table of the whole sweep (pandas): one row per (run, t) with the
        raw and smoothed statistics and the run's lr, dropout, seed, status, final accuracy."""
        from dtg_gpu.analysis import statistics_frame

        r, t, _ = self.stats.shape
        smooth = temporal_features(self.stats, self.alpha).reshape(r, t, 5)
        per_run: dict[str, list] = {"run": [run.name for run in self.runs]}
        per_run.update({key: [run.meta.get(key) for run in self.runs] for key in ("lr", "dropout", "seed", "status")})
        per_run["final_accuracy"] = [float(a) for a in self.accuracies]
        return statistics_frame(self.stats, smooth, per_run)


def featurize_sweep(
    runs: Sequence[Run],
    *,
    alpha: float = 0.5,
    device=None,
    solver: SolverOptions | None = None,
    progress: bool = False,
    strict: bool = False,
    executor: Literal["local", "ray"] = "local",
    address: str | None = None,
    cache: Any = None,
    fold_batchnorm: bool = False,
    with_folded: bool = True,
) -> SweepFeatures:
    """Solve every checkpoint of every run once; keep the raw statistics.

    Runs that cannot be read (those [`load_sweep`][dtg_gpu.sweeps.runner.load_sweep] already left out, in
    `runs.failed`, and those whose checkpoints fail here) are listed in `failed` and
    marked in `usable`; [`compare`][dtg_gpu.workflow.verdicts.compare] leaves them out with a warning. `strict=True`
    raises instead.

    Parameters
    ----------
    runs : sequence of Run
        Typically [`load_sweep`][dtg_gpu.sweeps.runner.load_sweep]'s list.
    alpha, device, solver, progress, strict
        As in [`featurize`][dtg_gpu.featurize]. With `executor="ray"`, `device=None` lets each
        task take its node's GPU when it has one. `solver.chunk_size`: graphs per batch
        (rounded to whole runs); default: sized to a 1 GiB budget.
    executor : {"local", "ray"}, default "local"
        `"ray"`: each unit (whole runs of one architecture, one batch) is a Ray task that
        gets the runs' checkpoint *paths* (on storage every node sees), solves them on its
        node and returns the statistics, bit-identical to the local path's for the same
        dtype and device type. Needs `pip install 'dtg_gpu[ray]'`.
    address : str, optional
        The Ray cluster (`"auto"`, `"ray://head:10001"`); default: the Ray instance this
        process is connected to, else a local one for this call.
    cache : None, False, path or FeatureCache
        The per-run feature cache ([`feature_cache`][dtg_gpu.engine.cache]): `None` (default) keeps
        it in `SWEEP/.dtg-cache` when `runs` came from [`load_sweep`][dtg_gpu.sweeps.runner.load_sweep];
        `False` turns it off. A killed featurisation resumes from it; a cached run is
        bit-identical to solving it again.
    fold_batchnorm : bool, default False
        As in [`featurize`][dtg_gpu.featurize] (option beyond the method).
    with_folded : bool, default True
        When a network has batch norm to fold and `fold_batchnorm` is False, also solve the
        folded graphs (kept in `folded`): what the `"default"` feature set reads. A
        second solve of those runs (cached like the first).

    Raises
    ------
    ValueError
        A bad `executor`; the errors of [`featurize`][dtg_gpu.featurize].
    ImportError
        `executor="ray"` without Ray installed (the message says how to install it).
    """
    failed = dict(getattr(runs, "failed", {}))
    runs_in = runs
    cache = default_cache(runs, cache)
    runs = list(runs)
    topos = _architectures(runs)
    per_layer = len({len(layer_node_groups(t)) for t in topos}) == 1
    layout = (
        StatisticsLayout.of(topos[0], per_layer=per_layer, eigenvalue=True)
        if topos
        else StatisticsLayout(eigenvalue=True)
    )
    recipe = FeatureRecipe(per_layer=per_layer, eigenvalue=True, fold_batchnorm=fold_batchnorm, weight_stats=False)
    options = dict(
        alpha=alpha, device=device, solver=solver, progress=progress, strict=strict, executor=executor, address=address
    )
    res = extract_features(runs, features=recipe, cache=cache, **options)
    warn_failures(res.failures, stacklevel=2)
    failed.update(res.failures)
    usable = np.array([r.name not in res.failures for r in runs], dtype=bool)
    acc = np.array([r.final_accuracy if r.final_accuracy is not None else np.nan for r in runs])
    spec, layers, lam = layout.split(res.statistics)
    folded = None
    if with_folded and not fold_batchnorm and any(l.batchnorm is not None for t in topos for l in t.layers):
        folded = featurize_sweep(
            SweepRuns(runs, failed=failed, path=getattr(runs_in, "path", None)),
            cache=cache if cache is not None else False,
            fold_batchnorm=True,
            with_folded=False,
            **options,
        )
        usable &= folded.usable
        failed.update(folded.failed)
    return SweepFeatures(
        runs=runs,
        stats=spec,
        alpha=alpha,
        accuracies=acc,
        log_eigenvalue=lam,
        layer_stats=layers,
        failed=failed,
        usable=usable,
        layout=layout,
        folded=folded,
    )


def _architectures(runs: Sequence[Run]) -> list:
    """The runs' distinct topologies (a run that cannot be traced is named later, by featurize)."""
    topos = {}
    for r in runs:
        try:
            topos[id(r.topology)] = r.topology
        except READ_ERRORS:
            pass
    return list(topos.values())


def feature_sets(
    sf: SweepFeatures, k: int, names: Sequence[str], *, covariates: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """Feature matrices for `k` checkpoints: `default` ([`featurize`][dtg_gpu.featurize]'s
    default recipe), `dtg` (the seed's method), `weight_stats`, `spectral`,
    `dtg+weight_stats`, `dtg+eigenvalue`, `dtg_per_layer` and
    `dtg_per_layer+eigenvalue` (options beyond the method), `learning_curve`, and
    `covariates` (the known hyper-parameters alone: the hyper-parameter oracle).

    `covariates`: run.json fields ([`covariate_matrix`][dtg_gpu.features.covariates.covariate_matrix]) appended to
    every set but `covariates` itself, which they make up (default: `lr`, `dropout`)."""
    from dtg_gpu.features.covariates import covariate_matrix

    out: dict[str, np.ndarray] = {}
    cov = (
        covariate_matrix(sf.runs, covariates or ("lr", "dropout"))[0].numpy()
        if (covariates or "covariates" in names)
        else None
    )
    ws = None
    ok_runs = [r for r, u in zip(sf.runs, sf.usable) if u]

    def per_run(fn) -> np.ndarray:  # a baseline of the usable runs; NaN rows for failed ones
        part = fn(ok_runs, k)
        full = np.full((len(sf.runs), part.shape[1] if part.ndim == 2 else 0), np.nan)
        full[sf.usable] = part
        return full

    for name in names:
        if name == "default":  # featurize's default recipe: folded per-layer + λ, weight statistics
            src = sf.folded if sf.folded is not None else sf
            ws = per_run(weight_statistics) if ws is None else ws
            out[name] = np.hstack([src.dtg(k, per_layer=src.layer_stats is not None, eigenvalue=True), ws])
            if FEATURE_RECIPES["default"].spec_block:  # the seed's columns of the folded graph
                out[name] = np.hstack([out[name], src.dtg(k)])
        elif name == "dtg":
            out[name] = sf.dtg(k)
        elif name in ("weight_stats", "dtg+weight_stats"):
            ws = per_run(weight_statistics) if ws is None else ws
            out[name] = ws if name == "weight_stats" else np.hstack([sf.dtg(k), ws])
        elif name == "dtg+eigenvalue":
            out[name] = sf.dtg(k, eigenvalue=True)
        elif name == "dtg_per_layer":
            out[name] = sf.dtg(k, per_layer=True)
        elif name == "dtg_per_layer+eigenvalue":
            out[name] = sf.dtg(k, per_layer=True, eigenvalue=True)
        elif name == "spectral":
            out[name] = per_run(spectral_alpha)
        elif name == "learning_curve":
            out[name] = per_run(learning_curve)
        elif name == "covariates":
            assert cov is not None
            out[name] = cov
            continue
        else:
            raise ValueError(f"unknown feature set {name!r}")
        if covariates and cov is not None:
            out[name] = np.hstack([out[name], cov])
    return out


def default_blocks(sf: SweepFeatures, width: int, covariates: Sequence[str] = ()) -> tuple[int, ...]:
    """The feature sets of the `default` matrix of `width` columns: DTG, the weight
    statistics (7 per weight layer), the seed's block when the default recipe has one, the
    covariates (what `featurize` marks as `column_blocks`)."""
    first = next(r for r, ok in zip(sf.runs, sf.usable) if ok)
    ws, cov = 7 * len(first.topology.params), len(covariates)
    spec = 0
    if FEATURE_RECIPES["default"].spec_block:  # width = (F + 5)·k + ws + cov
        src = sf.folded if sf.folded is not None else sf
        per_step = src.layout_for(per_layer=src.layer_stats is not None, eigenvalue=True).width
        spec = len(STATISTICS) * ((width - ws - cov) // (per_step + len(STATISTICS)))
    return tuple(w for w in (width - ws - cov - spec, ws, spec, cov) if w)


def default_predictor(sf: SweepFeatures, width: int, covariates: Sequence[str] = (), **params: Any):
    """The default [`PerformancePredictor`][dtg_gpu.PerformancePredictor] for the `default`
    matrix of `width` columns: one model per feature set (`default_blocks`), the seed's MLP
    on the seed's block; `params` as the predictor's (`random_state`, ...)."""
    blocks = default_blocks(sf, width, covariates)
    spec = FEATURE_RECIPES["default"].spec_block  # DTG, weight statistics, the seed's block, covariates
    models = tuple("mlp" if spec and i == 2 else "linear" for i in range(len(blocks)))
    return PerformancePredictor(**{"blocks": blocks, "block_models": models, **params})


def compare(
    sf: SweepFeatures,
    ks: Sequence[int],
    names: Sequence[str],
    *,
    threshold: Any = "median",
    repeats: int = 20,
    seed: int = 0,
    clf: PerformancePredictor | None = None,
    covariates: Sequence[str] = (),
    progress: bool = False,
    predictor_params: dict | None = None,
) -> list[dict]:
    """Evaluate every feature set at every `k`; one row per (feature set, k).

    `clf`: the classifier of every row; default: the seed's MLP
    ([`PerformancePredictor.spec`][dtg_gpu.PerformancePredictor.spec]) for `dtg` (the seed's method), the default
    [`PerformancePredictor`][dtg_gpu.PerformancePredictor] for every other set; `predictor_params`
    (e.g. `head_weights`) are given to those default predictors, not to the seed's MLP.

    `covariates`: known hyper-parameters appended to every feature set (see
    `feature_sets`). Runs that failed to be read or solved (`sf.usable` False) are left out of labels,
    training and testing; featurising named them in a warning already. `progress`: a tqdm
    bar over the (feature set, k) evaluations."""
    from tqdm.auto import tqdm

    keep = sf.usable
    y = label_runs(sf.accuracies[keep], threshold)
    rows = []
    bar = tqdm(total=len(ks) * len(names), desc="evaluating", unit="set", disable=not progress)
    for k in ks:
        for name, X in feature_sets(sf, k, names, covariates=covariates).items():
            row_clf = clf or (
                PerformancePredictor.spec()
                if name == "dtg"
                else default_predictor(sf, X.shape[1], covariates, **(predictor_params or {}))
                if name == "default"
                else PerformancePredictor(blocks=None, **(predictor_params or {}))
            )
            s = evaluate(row_clf, X[keep], y, repeats=repeats, seed=seed)
            rows.append({"features": name, "k": int(k), "scores": s})
            bar.update()
    bar.close()
    return rows


def run_verdicts(
    sf: SweepFeatures,
    ks: Sequence[int],
    *,
    features: str = "default",
    threshold: Any = "median",
    folds: int = 5,
    seed: int = 0,
    clf: PerformancePredictor | None = None,
) -> dict:
    """Out-of-fold P(sufficient) of every run at each `k`: what a user acts on.

    Each usable run's probability comes from a predictor that did not see it (stratified
    `folds`-fold cross-validation, seeded), so the table is honest about every run, not
    only about a test split. Runs that could not be read get NaN.

    Returns
    -------
    dict
        `ks`; `proba` `[runs, len(ks)]`; `label` `[runs]` (1 sufficient, 0
        insufficient, -1 left out); `threshold` (the accuracy cut used).
    """
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    keep = sf.usable
    y = label_runs(sf.accuracies[keep], threshold)
    finite = sf.accuracies[keep][np.isfinite(sf.accuracies[keep])]
    cut = (
        float(np.median(finite)) if isinstance(threshold, str) and threshold == "median" and finite.size else threshold
    )
    n_splits = int(min(folds, np.bincount(y).min())) if np.unique(y).size == 2 else 0
    proba = np.full((len(sf.runs), len(ks)), np.nan)
    base = clf or (PerformancePredictor.spec if features == "dtg" else PerformancePredictor)(random_state=seed)
    for j, k in enumerate(ks):
        X = feature_sets(sf, int(k), [features])[features][keep]
        if n_splits >= 2:
            cv = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=seed)
            model = base
            if clf is None and features == "default":
                model = default_predictor(sf, X.shape[1], random_state=seed)
            proba[keep, j] = cross_val_predict(model, X, y, cv=cv, method="predict_proba")[:, 1]
    label = np.full(len(sf.runs), -1)
    label[keep] = y
    return {"ks": [int(k) for k in ks], "proba": proba, "label": label, "threshold": cut}
