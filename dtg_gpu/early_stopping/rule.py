r"""Early stopping from a run's checkpoints so far: the rule shared by the Optuna pruner
(`dtg_gpu.integrations.optuna`), the Ray Tune scheduler and stopper
(`dtg_gpu.integrations.ray_tune`) and `dtg watch`.

A checkpoint is summarised once, when it is written, by [`checkpoint_record`][dtg_gpu.early_stopping.rule.checkpoint_record]: the five
centrality statistics of its graph (method step 4.1), $\log\lambda_1$, the five statistics
of each layer's nodes and the weight statistics of each layer: a few dozen numbers, JSON-able,
stored beside the checkpoint. Decisions read only these records (and the values a run
reported), so they are the same in any process and after a restart.

At checkpoint `k` of a running trial, [`StoppingRule`][dtg_gpu.early_stopping.rule.StoppingRule] turns the first `k` records
into the method's temporal feature ([`temporal_features`][dtg_gpu.temporal_features]) and asks
for $P(\text{sufficient})$:

* from a given [`PerformancePredictor`][dtg_gpu.PerformancePredictor] (trained on an earlier sweep,
  at its own `k`), or
* learned online from the finished runs of the same study: their first `k` records,
  labelled by their final value against `threshold` (default: the median of the finished
  runs' final values, in the study's direction); a standardised, L2-regularised logistic
  regression, refitted only when a run finishes.

A run is stopped when $P <$ `min_probability` at `patience` consecutive checks. A
run whose weights are no longer finite is stopped at once: SGD does not come back from NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dtg_gpu.core.validation import is_int
from dtg_gpu.features.layout import StatisticsLayout
from dtg_gpu.features.temporal import check_alpha, temporal_features

__all__ = [
    "FEATURE_SETS",
    "checkpoint_record",
    "run_records",
    "feature_vector",
    "peer_score",
    "is_diverged",
    "StoppingRule",
]

FEATURE_SETS = (
    "dtg",
    "dtg+eigenvalue",
    "dtg_per_layer",
    "dtg_per_layer+eigenvalue",
    "dtg+weight_stats",
    "dtg_per_layer+eigenvalue+weight_stats",
)


def _floats(x) -> list:
    return [float(v) if math.isfinite(v) else None for v in (float(u) for u in x)]


def _as_array(x) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in x], dtype=float)


def _statistics_blocks(stats: torch.Tensor, layout: StatisticsLayout) -> list[dict]:
    """Per timestep of `stats [T, F]` (per-layer and eigenvalue layout): the record's
    graph statistics, JSON-able."""
    spec, layers, lam = layout.split(stats.double())
    assert layers is not None and lam is not None  # run_records asks for both
    return [
        {"dtg": _floats(spec[t]), "per_layer": _floats(layers[t]), "log_eigenvalue": _floats(lam[t : t + 1])[0]}
        for t in range(spec.shape[0])
    ]


def _records_from_stats(
    blocks: list[dict], weight_stats: Sequence[Sequence[float] | None], folded: list[dict] | None = None
) -> list[dict]:
    return [
        {
            **b,
            "weight_stats": None if weight_stats[t] is None else _floats(weight_stats[t]),
            **({"folded": folded[t]} if folded is not None else {}),
        }
        for t, b in enumerate(blocks)
    ]


def run_records(run, device=None, start: int = 0) -> list[dict]:
    """The [`checkpoint_record`][dtg_gpu.early_stopping.rule.checkpoint_record] of each checkpoint of `run` from `start` on, solved as
    one batch.

    Raises
    ------
    CheckpointError, TopologyError
        A checkpoint cannot be read or the model cannot be traced (names it).
    """
    from dtg_gpu.analysis import extract_features
    from dtg_gpu.features.baselines import tensor_statistics
    from dtg_gpu.features.temporal import FeatureRecipe
    from dtg_gpu.io.run import Run
    from dtg_gpu.predictor.estimator import architecture_signature

    part = Run(
        model=run.model,
        checkpoints=list(run.checkpoints)[start:],
        name=run.name,
        meta=run.meta,
        prefix=run.prefix,
        fallback=getattr(run, "fallback", False),
    )
    if len(part) == 0:
        return []

    layout = StatisticsLayout.of(part.topology, per_layer=True, eigenvalue=True)

    def solve(fold: bool) -> list[dict]:
        recipe = FeatureRecipe(per_layer=True, eigenvalue=True, fold_batchnorm=fold, weight_stats=False)
        stats = extract_features([part], len(part), features=recipe, device=device, strict=True).statistics
        return _statistics_blocks(stats[0], layout)

    folds = any(layer.batchnorm for layer in part.topology.layers)
    params = part.topology.params
    ws = []
    for t in range(len(part)):
        w = part.weights(t)
        ws.append([v for p in params for v in tensor_statistics(w[p])])
    arch = architecture_key(architecture_signature(part.topology))
    return [{**r, "architecture": arch} for r in _records_from_stats(solve(False), ws, solve(True) if folds else None)]


def many_run_records(
    runs: Sequence, starts: Sequence[int], device=None, weight_stats: bool = True
) -> list[list[dict] | str]:
    """[`run_records`][dtg_gpu.early_stopping.rule.run_records] of many runs at once: runs of one architecture with the same
    number of new checkpoints are solved as one batch (as [`featurize`][dtg_gpu.featurize]
    batches a sweep), instead of one solve per run. Each entry is the run's records, or the
    reason (a string) why they could not be made. `weight_stats=False`: the records' weight
    statistics are `None` (half the time of a pass goes to their quantiles; a rule that
    does not read them, [`StoppingRule.needs_weight_stats`][dtg_gpu.early_stopping.rule.StoppingRule.needs_weight_stats], skips them).
    """
    from dtg_gpu.analysis import extract_features
    from dtg_gpu.core.failures import READ_ERRORS
    from dtg_gpu.features.baselines import tensor_statistics
    from dtg_gpu.features.temporal import FeatureRecipe
    from dtg_gpu.io.run import Run
    from dtg_gpu.predictor.estimator import architecture_signature

    out: list[list[dict] | str] = [[] for _ in runs]
    groups: dict[tuple, list[int]] = {}
    parts = []
    for i, (run, start) in enumerate(zip(runs, starts)):
        part = Run(
            model=run.model,
            checkpoints=list(run.checkpoints)[start:],
            name=run.name,
            meta=run.meta,
            prefix=run.prefix,
            fallback=getattr(run, "fallback", False),
        )
        parts.append(part)
        if len(part) == 0:
            continue
        try:
            groups.setdefault((id(part.topology), len(part)), []).append(i)
        except READ_ERRORS as exc:
            out[i] = f"{type(exc).__name__}: {exc}"
    for (_, k), idx in groups.items():
        batch = [parts[i] for i in idx]
        topo = batch[0].topology
        layout = StatisticsLayout.of(topo, per_layer=True, eigenvalue=True)
        folds = any(layer.batchnorm for layer in topo.layers)
        solved = {}
        failures: dict[str, str] = {}
        for fold in (False, True) if folds else (False,):
            recipe = FeatureRecipe(per_layer=True, eigenvalue=True, fold_batchnorm=fold, weight_stats=False)
            res = extract_features(batch, k, features=recipe, device=device)
            solved[fold] = res.statistics
            failures.update(res.failures)
        arch = architecture_key(architecture_signature(topo))
        for j, i in enumerate(idx):
            part = parts[i]
            if str(part.name) in failures:
                out[i] = failures[str(part.name)]
                continue
            ws: list = []
            try:
                for t in range(k if weight_stats else 0):
                    w = part.weights(t)
                    ws.append([v for p in topo.params for v in tensor_statistics(w[p])])
            except READ_ERRORS as exc:
                out[i] = f"{type(exc).__name__}: {exc}"
                continue
            folded = _statistics_blocks(solved[True][j], layout) if folds else None
            recs = _records_from_stats(_statistics_blocks(solved[False][j], layout), ws or [None] * k, folded)
            out[i] = [{**r, "architecture": arch} for r in recs]
    return out


def architecture_key(signature: Sequence) -> str:
    """A short hash of [`architecture_signature`][dtg_gpu.engine.cache.architecture_signature] (what each checkpoint
    record carries, so a predictor of another architecture is refused)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_record(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None, device=None) -> dict:
    r"""Summarise one checkpoint for early stopping.

    Parameters
    ----------
    model : torch.nn.Module
        The architecture (traced once per architecture).
    state : mapping, optional
        The checkpoint's state dict (default: the model's current weights).
    device : optional
        Where the centrality is solved (default: CUDA when available).

    Returns
    -------
    dict
        `dtg` (the five statistics of the centrality vector), `log_eigenvalue`
        ($\log\lambda_1$), `per_layer` (the five statistics of each layer's nodes, see
        `layer_node_groups`), `weight_stats` (mean, std and five
        quantiles of each weight layer). Non-finite numbers are `None` (JSON-able). When the
        network has batch norm to fold (see `featurize(fold_batchnorm=True)`), `folded`
        holds `dtg`, `per_layer` and `log_eigenvalue` of the graph of its
        inference-time effective weights too (a second solve).

    Examples
    --------
    >>> from torch import nn
    >>> rec = checkpoint_record(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    >>> len(rec["dtg"]), len(rec["weight_stats"])
    (5, 14)
    """
    from dtg_gpu.io.run import Run

    if state is None:
        state = {k: v.detach() for k, v in model.state_dict().items()}
    return run_records(Run(model=model, checkpoints=[dict(state)]), device=device)[0]


def _columns(rec: Mapping[str, Any], features: str, fold_batchnorm: bool = False) -> list:
    if fold_batchnorm and rec.get("folded"):  # a net without batch norm to fold has no block
        rec = rec["folded"]
    cols = list(rec.get("dtg") or [None] * 5)
    if features.startswith("dtg_per_layer"):
        cols += list(rec.get("per_layer") or [])
    if "+eigenvalue" in features:
        cols.append(rec.get("log_eigenvalue"))
    return cols


def feature_vector(
    records: Sequence[Mapping[str, Any]],
    k: int,
    features: str = "dtg",
    alpha: float = 0.5,
    values: Sequence[float | None] | None = None,
    fold_batchnorm: bool = False,
) -> np.ndarray:
    """The feature of a run's first `k` checkpoint records: the method's temporal feature
    (`5·k` numbers for `"dtg"`), then the weight statistics of checkpoint `k`
    (`"dtg+weight_stats"`), then the first `k` reported values when `values` is given.
    `fold_batchnorm`: the graph statistics of the records' `folded` block where they
    have one (a network with batch norm to fold), as `featurize(fold_batchnorm=True)`.

    Examples
    --------
    >>> recs = [{"dtg": [1.0, 2, 3, 4, 5]}, {"dtg": [3.0, 2, 1, 0, 5]}]
    >>> feature_vector(recs, 2).tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0, 2.0, 2.0, 2.0, 2.0, 5.0]
    """
    if features not in FEATURE_SETS:
        raise ValueError(f"features must be one of {', '.join(FEATURE_SETS)}; got {features!r}")
    if not 1 <= k <= len(records):
        raise ValueError(f"k must be in [1, {len(records)}], got {k!r}")
    rows = [_as_array(_columns(r, features, fold_batchnorm)) for r in records[:k]]
    width = {len(r) for r in rows}
    if len(width) != 1:
        raise ValueError(
            "checkpoint records of one run have different widths (per-layer statistics of different architectures?)"
        )
    stats = torch.from_numpy(np.stack(rows))
    out = [temporal_features(stats, check_alpha(alpha)).numpy()]
    if features.endswith("+weight_stats"):
        ws = records[k - 1].get("weight_stats")
        if ws is None:
            raise ValueError("these checkpoint records were made without weight statistics (weight_stats=False)")
        out.append(_as_array(ws))
    if values is not None:
        out.append(_as_array(list(values)[:k]))
    return np.concatenate(out)


def _quantile_label(x: Any) -> bool:
    """`"q0.75"`: sufficient = in the best 25 % of the finished runs (as `label_runs`)."""
    if not isinstance(x, str) or not x.startswith("q"):
        return False
    try:
        return 0 < float(x[1:]) < 1
    except ValueError:
        return False


def _finite_record(rec: Mapping[str, Any]) -> bool:
    d = rec.get("dtg")
    return d is not None and len(d) > 0 and all(v is not None for v in d)


def is_diverged(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the latest checkpoint's centrality statistics are not finite (its weights
    hold a NaN or an infinity, or its graph could not be solved)."""
    return bool(records) and not _finite_record(records[-1])


def peer_score(records: Sequence[Mapping[str, Any]], k: int) -> float | None:
    r"""What a run's first `k` checkpoint records say before any run has finished: the growth
    of its graph's leading eigenvalue since the first checkpoint,
    $\log\lambda_1(k) - \log\lambda_1(1)$.

    A run that learns makes the weights that carry its signal larger, and the spectral radius
    of the channel graph with them; a run whose learning rate is too small for it to learn
    barely moves it. On the eight sweeps of the benchmark suite the best run's score stayed
    in the upper 57 % of all runs' at every checkpoint from the second on
    (`benchmarks/results/early_stopping_suite.md`). `None` before the second checkpoint
    (nothing has grown yet); `-inf` when the eigenvalue is not finite (a diverged run).

    Examples
    --------
    >>> peer_score([{"log_eigenvalue": 1.0}, {"log_eigenvalue": 1.5}], 2)
    0.5
    """
    if k < 2 or len(records) < k:
        return None
    first, last = records[0].get("log_eigenvalue"), records[k - 1].get("log_eigenvalue")
    if first is None or last is None or not (math.isfinite(first) and math.isfinite(last)):
        return -math.inf
    return float(last) - float(first)


def _share_below(x: float, others: np.ndarray) -> float:
    """The share of `others` below `x`, ties counted half (a percentile rank in [0, 1])."""
    return float(((others < x).sum() + 0.5 * (others == x).sum()) / len(others))


# the parameters of StoppingRule that every front end (Optuna, Ray Tune) exposes by keyword
RULE_PARAMS = (
    "predictor",
    "min_probability",
    "patience",
    "n_startup_trials",
    "n_warmup_steps",
    "threshold",
    "features",
    "use_values",
    "alpha",
    "fold_batchnorm",
    "warm_start",
    "n_peers",
)


def rule_params(scope: Mapping[str, Any]) -> dict[str, Any]:
    """The `RULE_PARAMS` of a front end's `__init__` (its `locals()`)."""
    return {k: scope[k] for k in RULE_PARAMS}


@dataclass
class StoppingRule:
    r"""Stop a run when $P(\text{sufficient})$ stays below `min_probability`.

    Parameters
    ----------
    predictor : PerformancePredictor, optional
        Used as is, at its own `feature_settings` (`timesteps`, `alpha`, `eigenvalue`,
        `per_layer`); before a run has that many checkpoints it is not judged. `None`:
        learn online from the finished runs.
    features : str, default "dtg_per_layer"
        One of `FEATURE_SETS` (online learning only). The default adds the five
        statistics of each layer's nodes to the method's five of the whole graph (an option
        beyond the method, as in `featurize(per_layer=True)`): on the replayed digits LeNet-5 sweep
        the global statistics alone let the pruner save 12 % of the compute, per-layer ones
        55 % (`benchmarks/results/early_stopping.md`).
    threshold : "median", "qX" or float, default "median"
        What *sufficient* means for a finished run: its final value at least (`maximize`)
        or at most (`minimize`) this; `"median"`: the median of the finished runs;
        `"q0.75"`: their 75th percentile in the study's direction (the best quarter is
        sufficient), as in [`label_runs`][dtg_gpu.label_runs].
    direction : {"maximize", "minimize"}
    min_probability : float, default 0.3
    patience : int, default 1
        Consecutive checks below `min_probability` before stopping.
    n_startup_trials : int, default 10
        Finished runs needed (with both labels among them) before anything is stopped.
    n_warmup_steps : int, default 0
        Checkpoints at steps below this are never judged.
    use_values : bool or "auto", default "auto"
        Append the values the run reported at its first `k` checkpoints to the feature
        (validation accuracy or loss: data). `"auto"`: when the run and every finished run
        used for training reported one at each of those checkpoints; `False`: data-free.
    alpha : float, default 0.5
        Temporal reinforcement constant (the method).
    fold_batchnorm : bool, default False
        Learn from the graph of the inference-time effective weights (batch norm folded
        into the layer before it, as `featurize(fold_batchnorm=True)`) where the records
        hold one ([`checkpoint_record`][dtg_gpu.early_stopping.rule.checkpoint_record]); a network without batch norm to fold is
        unaffected. A given `predictor` uses its own `feature_settings` instead.
    warm_start : bool, default True
        Before the finished runs can teach anything (fewer than `n_startup_trials`, or one
        label only), compare the run with its peers at the same checkpoint, as Optuna's
        `MedianPruner` compares values: its probability is the share of the other runs
        that have reached checkpoint `k` whose [`peer_score`][dtg_gpu.early_stopping.rule.peer_score] is below its own (with
        the reported value too when `use_values` holds: the mean of the two shares).
        `False`: nothing is stopped before the online model exists (the rule of
        dtg_gpu 0.x).
    n_peers : int, default 5
        Runs at checkpoint `k` needed for a peer comparison.
    C : float, default 1.0
        Inverse L2 strength of the online logistic regression.
    """

    predictor: Any = None
    features: str = "dtg_per_layer"
    threshold: Any = "median"
    direction: str = "maximize"
    min_probability: float = 0.3
    patience: int = 1
    n_startup_trials: int = 10
    n_warmup_steps: int = 0
    use_values: Any = "auto"
    alpha: float = 0.5
    fold_batchnorm: bool = False
    warm_start: bool = True
    n_peers: int = 5
    C: float = 1.0
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.features not in FEATURE_SETS:
            raise ValueError(f"features must be one of {', '.join(FEATURE_SETS)}; got {self.features!r}")
        if self.direction not in ("maximize", "minimize"):
            raise ValueError(f"direction must be 'maximize' or 'minimize', got {self.direction!r}")
        if not (isinstance(self.min_probability, (int, float)) and 0 <= self.min_probability <= 1):
            raise ValueError(f"min_probability must be in [0, 1], got {self.min_probability!r}")
        if not isinstance(self.warm_start, bool):
            raise ValueError(f"warm_start must be True or False, got {self.warm_start!r}")
        for name in ("patience", "n_startup_trials", "n_warmup_steps", "n_peers"):
            v = getattr(self, name)
            positive = name in ("patience", "n_peers")
            if not is_int(v) or v < int(positive):
                raise ValueError(f"{name} must be a {'positive' if positive else 'non-negative'} integer, got {v!r}")
        if not (
            self.threshold == "median"
            or _quantile_label(self.threshold)
            or (
                isinstance(self.threshold, (int, float))
                and not isinstance(self.threshold, bool)
                and math.isfinite(self.threshold)
            )
        ):
            raise ValueError(f"threshold must be 'median' or a finite number, got {self.threshold!r}")
        if self.use_values not in (True, False, "auto"):
            raise ValueError(f"use_values must be True, False or 'auto', got {self.use_values!r}")
        if not isinstance(self.fold_batchnorm, bool):
            raise ValueError(f"fold_batchnorm must be True or False, got {self.fold_batchnorm!r}")
        if not (isinstance(self.C, (int, float)) and self.C > 0):
            raise ValueError(f"C must be positive, got {self.C!r}")
        check_alpha(self.alpha)
        if self.predictor is not None:
            fs = getattr(self.predictor, "feature_settings", None) or {}
            k = fs.get("timesteps")
            if not is_int(k) or k < 1 or not hasattr(self.predictor, "classes_"):
                raise ValueError(
                    "predictor must be a fitted PerformancePredictor with feature_settings "
                    "(timesteps, alpha), as `dtg train` saves it"
                )
            if fs.get("covariates"):
                raise ValueError(
                    f"predictor was trained with covariates {list(fs['covariates'])} from run.json; "
                    "a stopping rule judges a run from its checkpoints alone: train it without covariates"
                )

    @property
    def needs_weight_stats(self) -> bool:
        """Whether the rule reads the records' weight statistics (its features, or a given
        predictor's, include them)."""
        if self.predictor is not None:
            return bool((getattr(self.predictor, "feature_settings", None) or {}).get("weight_stats"))
        return self.features.endswith("+weight_stats")

    # ------------------------------------------------------------------ labels
    def labels(self, finals: np.ndarray) -> tuple[np.ndarray, float]:
        """`(y, cut)`: 1 for a sufficient final value. When ties at the cut would make every
        run sufficient (most runs stuck at chance accuracy, the median among them), the runs at
        the cut are insufficient."""
        finals = np.asarray(finals, dtype=float)
        ok = np.isfinite(finals)
        if isinstance(self.threshold, str):
            q = 0.5 if self.threshold == "median" else float(self.threshold[1:])
            if self.direction == "minimize":
                q = 1 - q
            cut = float(np.quantile(finals[ok], q)) if ok.any() else float("nan")
        else:
            cut = float(self.threshold)
        better = np.greater if self.direction == "maximize" else np.less
        y = (better(finals, cut) | (finals == cut)) & ok
        if y[ok].all():
            y = better(finals, cut) & ok
        return y.astype(int), cut

    # ------------------------------------------------------------- probability
    def _given(self, records: Sequence[Mapping], values) -> float | None:
        fs = self.predictor.feature_settings
        arch, seen = fs.get("architecture"), records[-1].get("architecture")
        if arch is not None and seen is not None and architecture_key(arch) != seen:
            raise ValueError(
                f"the predictor was trained on another architecture ({len(arch)} weight layers, first "
                f"{arch[0] if arch else None}) than this run's: its probabilities would mean nothing here; "
                "train one on runs of this architecture (dtg train), or learn online (no predictor)"
            )
        k = int(fs["timesteps"])
        if len(records) < k:
            return None
        feats = ("dtg_per_layer" if fs.get("per_layer") else "dtg") + ("+eigenvalue" if fs.get("eigenvalue") else "")
        if fs.get("weight_stats"):
            feats += "+weight_stats"
        if feats not in FEATURE_SETS:
            raise ValueError(
                f"a stopping rule cannot rebuild this predictor's features ({feats}); train it on {FEATURE_SETS}"
            )
        x = feature_vector(records, k, feats, float(fs.get("alpha", self.alpha)), None, bool(fs.get("fold_batchnorm")))
        return float(self.predictor.predict_proba(x[None, :])[0, list(self.predictor.classes_).index(1)])

    def probability(
        self,
        records: Sequence[Mapping],
        values: Sequence[float | None] | None,
        finished: Sequence[tuple[Any, Sequence[Mapping], Sequence[float | None] | None, float]],
        peers: Sequence[tuple[Any, Sequence[Mapping], Sequence[float | None] | None]] = (),
    ) -> float | None:
        r"""$P(\text{sufficient})$ of a running run after its `len(records)` checkpoints.

        Parameters
        ----------
        records : sequence of dict
            The run's [`checkpoint_record`][dtg_gpu.early_stopping.rule.checkpoint_record] s, in time order.
        values : sequence of float or None, optional
            The value it reported at each of those checkpoints (None where it did not).
        finished : sequence of `(key, records, values, final_value)`
            The finished runs to learn from (online mode); `key` identifies a run (its fit
            is cached while the set of finished runs does not change).
        peers : sequence of `(key, records, values)`, optional
            The other runs of the study in any state (running, stopped, finished), for the
            warm start (`warm_start`); the finished ones count as peers too.

        Returns
        -------
        float or None
            None when there is nothing to decide from yet (too few finished runs or one label
            only and too few peers, a warm-up step, fewer checkpoints than a given predictor
            needs). 0.0 when the run's latest weights are not finite.
        """
        if not records:
            return None
        if not _finite_record(records[-1]):
            return 0.0
        if self.predictor is not None:
            return self._given(records, values)
        learned = self._learned(records, values, finished)
        if learned is None and self.warm_start:
            return self._peer_probability(records, values, [*((f[0], f[1], f[2]) for f in finished), *peers])
        return learned

    def _peer_probability(self, records, values, peers) -> float | None:
        k = len(records)
        own = peer_score(records, k)
        if own is None:
            return None
        seen: dict = {}
        for key, r, v in peers:
            seen.setdefault(str(key), (r, v))
        rows = [(r, v) for r, v in seen.values() if len(r) >= k]
        if len(rows) < self.n_peers:
            return None
        scores = np.array([peer_score(r, k) for r, _ in rows], dtype=float)
        p = _share_below(own, scores)
        if self._uses_values(k, values, [(None, None, v) for _, v in rows]):
            sign = 1.0 if self.direction == "maximize" else -1.0
            vals = np.array([sign * float(v[k - 1]) for _, v in rows])
            p = 0.5 * (p + _share_below(sign * float(values[k - 1]), vals))
        return p

    def _learned(self, records, values, finished) -> float | None:
        k = len(records)
        rows = [(key, r, v, f) for key, r, v, f in finished if len(r) >= k and f is not None and math.isfinite(f)]
        if len(rows) < max(self.n_startup_trials, 2):
            return None
        use = self._uses_values(k, values, rows)
        key = (k, use, tuple(sorted(str(r[0]) for r in rows)))
        model = self._cache.get(key)
        if model is None:
            model = self._fit(rows, k, use)
            if len(self._cache) > 256:
                self._cache = {"features": self._cache.get("features", {})}
            self._cache[key] = model
        if model == "one-class":
            return None
        x = feature_vector(records, k, self.features, self.alpha, values if use else None, self.fold_batchnorm)
        clf, fill = model
        x = np.where(np.isfinite(x), x, fill)
        return float(clf.predict_proba(x[None, :])[0, 1])

    def _uses_values(self, k, values, rows) -> bool:
        if self.use_values is False:
            return False

        def full(v) -> bool:
            return v is not None and len(v) >= k and all(u is not None and math.isfinite(u) for u in list(v)[:k])

        have = full(values) and all(full(r[2]) for r in rows)
        if self.use_values is True and not have:
            return False  # the value is missing somewhere: decide from the weights alone
        return have

    def _fit(self, rows, k: int, use_values: bool):
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        y, _ = self.labels(np.array([r[3] for r in rows], dtype=float))
        feats = self._cache.setdefault("features", {})
        if len(feats) > 100_000:
            feats.clear()
        xs = []
        for r in rows:  # a finished run's feature at k never changes: computed once
            fk = (r[0], k, use_values)
            if fk not in feats:
                feats[fk] = feature_vector(
                    r[1], k, self.features, self.alpha, r[2] if use_values else None, self.fold_batchnorm
                )
            xs.append(feats[fk])
        X = np.stack(xs)
        good = np.isfinite(X).all(axis=1)
        X, y = X[good], y[good]  # diverged finished runs: nothing to learn from their NaNs
        if X.shape[0] < 2 or np.bincount(y, minlength=2).min() < 1:
            return "one-class"
        fill = X.mean(axis=0)
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=self.C, max_iter=2000))
        clf.fit(X, y)
        return clf, fill

    # ----------------------------------------------------------------- decision
    def should_stop(self, history: Sequence[float | None], diverged: bool = False) -> bool:
        """Stop after `patience` consecutive probabilities below `min_probability`, or at
        once when the run's latest weights are not finite (`diverged`, see
        `is_diverged`)."""
        if diverged:
            return True
        tail = list(history)[-self.patience :]
        return len(tail) == self.patience and all(p is not None and p < self.min_probability for p in tail)
