r"""Early stopping from a run's checkpoints so far: the rule shared by the Optuna pruner
(`dtg_gpu.integrations.optuna`), the Ray Tune scheduler and stopper
(`dtg_gpu.integrations.ray_tune`) and `dtg watch`.

A checkpoint is summarised once, when it is written, by [`checkpoint_record`][dtg_gpu.early_stopping.records.checkpoint_record]: the five
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
  regression, refitted only when a run finishes, on one BLAS thread (the fit is tiny, and a
  multi-threaded BLAS waits for the cores the training holds: a replayed 96-trial study ran
  2x faster beside two training processes on 2 cores, `benchmarks/results/rule_threads.md`).

A run is stopped when $P <$ `min_probability` at `patience` consecutive checks. A
run whose weights are no longer finite is stopped at once: SGD does not come back from NaN.

With the value the run reports (validation accuracy or loss, `use_values`), the rule also
runs the value's own test, as Optuna's `MedianPruner` does: a run whose best value so far
is behind the median of the finished runs' values at the same checkpoint gets $P = 0$, and
the checkpoints then stop a run only when they are surer ($P <$ `value_median`, default 0.1)
and only one behind the median too (`value_leader`, default 0.5): once 5 runs have finished
the value decides, as in `MedianPruner`, and the checkpoints decide before that, where the
value is missing and where the weights stop being finite. Replayed on the suite's ten sweeps
and five check sweeps this saves exactly `MedianPruner`'s share at its regret
(`benchmarks/results/early_stopping_suite_ten.md`); letting the checkpoints stop runs ahead
of the median saved up to 0.014 more and lost up to 0.0002 of mean regret on 3 of the 15.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dtg_gpu.core.validation import check_bool, is_finite_number, is_int
from dtg_gpu.early_stopping.records import (
    RECORD_FEATURE_SETS,
    _finite_record,
    _share_below,
    architecture_key,
    feature_vector,
    peer_score,
)
from dtg_gpu.features.covariates import LOG_COVARIATES, covariate_value
from dtg_gpu.features.temporal import check_alpha

__all__ = ["StoppingRule", "rule_options", "RULE_PARAMS", "auto_covariates", "is_seed_name"]


def is_seed_name(name: str) -> bool:
    """A name that holds a random seed (`seed`, `data_seed`, `seed_model`, `random_state`):
    `covariates="auto"` does not read it (a seed is not a setting a run can be better for)."""
    n = name.lower()
    return n in ("seed", "random_state", "rng") or n.endswith("seed") or n.startswith("seed_")


def auto_covariates(params: Sequence[Mapping | None]) -> tuple[str, ...]:
    """The names `covariates="auto"` reads: every key, in order of first appearance, that holds
    a finite number (not a bool) in at least one of `params`, but seed names
    ([`is_seed_name`][dtg_gpu.early_stopping.rule.is_seed_name])."""
    names: dict[str, None] = {}
    for p in params:
        if isinstance(p, Mapping):
            for k, v in p.items():
                if isinstance(k, str) and k and k not in names and not is_seed_name(k) and is_finite_number(v):
                    names[k] = None
    return tuple(names)


def _log10_columns(H: np.ndarray, logs: np.ndarray) -> np.ndarray:
    r"""`H` with the columns `logs` marks as $\log_{10}$ (NaN where not positive)."""
    if not logs.any():
        return H
    H = H.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        H[:, logs] = np.where(H[:, logs] > 0, np.log10(H[:, logs]), np.nan)
    return H


def _covariate_columns(H: np.ndarray, centre: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """`[z, z**2]` per covariate, z standardised by the finished runs' mean and spread and
    clipped to [-10, 10] (a value far outside the finished runs' range, or one so large its
    spread overflows, reads as the range's edge); a missing value (NaN) is the mean (z = 0)."""
    with np.errstate(all="ignore"):
        z = np.clip(np.nan_to_num((H - centre[0]) / centre[1], nan=0.0, posinf=10.0, neginf=-10.0), -10.0, 10.0)
    return np.hstack([z, z**2])


def _novelty_reference(Z: np.ndarray) -> tuple[np.ndarray, float]:
    """The finished runs' standardised rows and the largest distance from one of them to its
    nearest other (the novelty guard's bar; `inf` for a single run)."""
    Z = np.asarray(Z, dtype=float)
    sq = (Z**2).sum(axis=1)
    D = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * Z @ Z.T, 0.0))
    np.fill_diagonal(D, np.inf)
    return Z, float(D.min(axis=1).max()) if len(Z) > 1 else math.inf


def _quantile_label(x: Any) -> bool:
    """`"q0.75"`: sufficient = in the best 25 % of the finished runs (as `label_runs`)."""
    if not isinstance(x, str) or not x.startswith("q"):
        return False
    try:
        return 0 < float(x[1:]) < 1
    except ValueError:
        return False


#: the parameters of StoppingRule that every front end (Optuna, Ray Tune, dtg watch) takes by keyword
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
    "value_median",
    "value_leader",
    "covariates",
    "novelty_guard",
)


def rule_options(predictor: Any = None, **options: Any) -> dict[str, Any]:
    """The stopping rule's options as every front end takes them ([`DTGPruner`][dtg_gpu.integrations.optuna.DTGPruner],
    [`DTGScheduler`][dtg_gpu.integrations.ray_tune.DTGScheduler], [`DTGStopper`][dtg_gpu.integrations.ray_tune.DTGStopper]):
    the parameters of [`StoppingRule`][dtg_gpu.early_stopping.rule.StoppingRule] but `direction` (the study's
    or the trial's mode sets it), with the defaults filled in and checked now.

    Raises
    ------
    TypeError
        A name that is not an option of the rule (the message lists them).
    ValueError
        A bad value (named).
    """
    unknown = sorted(set(options) - set(RULE_PARAMS))
    if unknown:
        raise TypeError(f"unknown stopping-rule option(s) {unknown}; the options are {', '.join(RULE_PARAMS)}")
    rule = StoppingRule(predictor=predictor, **options)  # checks every value
    return {k: getattr(rule, k) for k in RULE_PARAMS}


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
        One of `RECORD_FEATURE_SETS` (online learning only). The default adds the five
        statistics of each layer's nodes to the method's five of the whole graph (an option
        beyond the method, as in the per-layer statistics of `featurize`): on the replayed digits LeNet-5 sweep
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
        into the layer before it, as `featurize` with batch norm folded) where the records
        hold one ([`checkpoint_record`][dtg_gpu.early_stopping.records.checkpoint_record]); a network without batch norm to fold is
        unaffected. A given `predictor` uses its own `feature_settings` instead.
    warm_start : bool, default True
        Before the finished runs can teach anything (fewer than `n_startup_trials`, or one
        label only), compare the run with its peers at the same checkpoint, as Optuna's
        `MedianPruner` compares values: its probability is the share of the other runs
        that have reached checkpoint `k` whose [`peer_score`][dtg_gpu.early_stopping.records.peer_score] is below its own (with
        the reported value too when `use_values` holds: the mean of the two shares).
        `False`: nothing is stopped before the online model exists (the rule of
        dtg_gpu 0.x).
    n_peers : int, default 5
        Runs at checkpoint `k` needed for a peer comparison.
    value_median : float in (0, 1] or None, default 0.1
        When the run reports its value at every checkpoint so far (and `use_values` is not
        `False`): $P = 0$ for a run whose best value so far is behind the median of the
        finished runs' values at checkpoint `k` (Optuna's `MedianPruner` test, from 5
        finished runs on), and otherwise the run is stopped when $P <$ `value_median`
        instead of `min_probability`: the value has already taken the runs that are
        behind, the checkpoints add only the ones they are sure of. `None`: the value is
        one more input to $P$ and nothing else (dtg_gpu 0.x).
    value_leader : float in (0, 1) or None, default 0.5
        With the value's median test on (`value_median`): the checkpoints do not stop a run
        whose best value so far is at or above this quantile of the finished runs' values at
        checkpoint `k` (in the study's direction; from 5 finished runs on): its $P$ is raised
        to `value_median`. At 0.5 (the median test's own cut) the value decides once 5 runs
        have finished, as `MedianPruner` does; the checkpoints decide before that (the warm
        start), where a run's value is missing or not finite, and when its weights stop being
        finite. Replayed on the suite's ten sweeps and five check sweeps this saves exactly
        `MedianPruner`'s share at its regret; 0.75 (the default of 2026-12-08, the checkpoints may stop a run
        between the median and the top quarter) saves up to 0.014 more but lost up to 0.0002
        of mean regret on 3 of the 15 (`benchmarks/results/early_stopping_suite_ten.md`).
        `None`: off (the rule until 2026-12-08).
    covariates : "auto", sequence of str or None, default "auto"
        Hyper-parameters of each run that the online model reads beside the checkpoints:
        each name gives two columns, $z$ and $z^2$ with $z$ the value standardised over the
        finished runs, so that an optimum inside the range (a learning rate neither too
        small nor too large) can be learned. Names in
        [`LOG_COVARIATES`][dtg_gpu.features.covariates.LOG_COVARIATES] are taken as
        $\log_{10}$, as [`featurize`][dtg_gpu.featurize]`(covariates=...)` takes them, and so
        is any other whose finished values are all positive and span 100x or more (a rate
        searched on a log scale). A missing or non-numeric value counts as the finished runs'
        mean. `"auto"`: every numeric hyper-parameter the front end passes
        ([`auto_covariates`][dtg_gpu.early_stopping.rule.auto_covariates]; seeds are not
        read): Optuna's `trial.params`, a Ray Tune trial's config (its top-level numbers),
        `dtg watch`: the run's grid point in `sweep.json` (never `run.json`, which holds the
        run's results); nothing when no hyper-parameters are passed. Explicit names: those
        (`dtg watch` reads them from `run.json` over the grid point). `None`: the
        checkpoints alone (the default until 2026-12-07). Hyper-parameters are known before a run
        starts and are not data: with `use_values=False` the rule stays data-free. Online
        learning only: with a given `predictor`, `"auto"` reads nothing and names are
        refused. Replayed on the suite (`benchmarks/results/early_stopping_suite_ten.md`),
        lr and dropout kept the best run at least as often as the checkpoints alone on 9 of
        10 sweeps, more often on 5, at the same compute saved.
    novelty_guard : bool, default True
        The online model does not stop a run unlike every finished run it was fitted on: when
        the run's row (the columns the model reads, standardised by the model's own scaler)
        is farther from its nearest finished run than any finished run is from its own
        nearest other one, its $P$ is raised to `min_probability` at that check. A run
        exchangeable with the finished ones is that far with chance about $1/(n+1)$; a sweep's
        best run is often unlike the few runs finished so far, and a logistic regression
        fitted on a few dozen of them extrapolates with confidence. Replayed on the suite's ten
        sweeps (data-free), it met the pruner goal (best run kept in 95 % of orders, half the
        compute saved) on 4 of 10 against 3 and on 3 of 5 check sweeps against 1, at
        0.006-0.054 less compute saved (`benchmarks/results/early_stopping_suite_ten.md`).
        `False`: off (the rule until 2026-12-08).
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
    value_median: float | None = 0.1
    value_leader: float | None = 0.5
    covariates: Any = "auto"
    novelty_guard: bool = True
    C: float = 1.0
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.features not in RECORD_FEATURE_SETS:
            raise ValueError(f"features must be one of {', '.join(RECORD_FEATURE_SETS)}; got {self.features!r}")
        if self.direction not in ("maximize", "minimize"):
            raise ValueError(f"direction must be 'maximize' or 'minimize', got {self.direction!r}")
        if not (
            isinstance(self.min_probability, (int, float))
            and not isinstance(self.min_probability, bool)
            and 0 <= self.min_probability <= 1
        ):
            raise ValueError(f"min_probability must be in [0, 1], got {self.min_probability!r}")
        v = self.value_median  # P = 0 must stop a run behind the median: a positive cut
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise ValueError(f"value_median must be in (0, 1] or None, got {v!r}")
        q = self.value_leader
        if q is not None and not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0 < q < 1):
            raise ValueError(f"value_leader must be in (0, 1) or None, got {q!r}")
        check_bool("warm_start", self.warm_start)
        check_bool("novelty_guard", self.novelty_guard)
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
        check_bool("fold_batchnorm", self.fold_batchnorm)
        if not (isinstance(self.C, (int, float)) and self.C > 0):
            raise ValueError(f"C must be positive, got {self.C!r}")
        check_alpha(self.alpha)
        cov = self.covariates
        if isinstance(cov, str) and cov == "auto":
            if self.predictor is not None:
                self.covariates = None  # a given predictor reads its own features
        elif cov is not None:
            if (
                isinstance(cov, str)
                or not isinstance(cov, (list, tuple))
                or not all(isinstance(c, str) and c for c in cov)
            ):
                raise ValueError(f"covariates must be 'auto', None or a list of hyper-parameter names, got {cov!r}")
            self.covariates = tuple(dict.fromkeys(cov)) or None
        if self.predictor is not None and self.covariates:  # "auto" became None above
            raise ValueError(
                "covariates are read by the online model only; a given predictor reads its own features: "
                "drop covariates, or predictor"
            )
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
        if fs.get("spec_block"):
            feats += "+spec_block"
        if feats not in RECORD_FEATURE_SETS:
            raise ValueError(
                f"a stopping rule cannot rebuild this predictor's features ({feats}); train it on {RECORD_FEATURE_SETS}"
            )
        x = feature_vector(records, k, feats, float(fs.get("alpha", self.alpha)), None, bool(fs.get("fold_batchnorm")))
        return float(self.predictor.predict_proba(x[None, :])[0, list(self.predictor.classes_).index(1)])

    def probability(
        self,
        records: Sequence[Mapping],
        values: Sequence[float | None] | None,
        finished: Sequence[tuple],
        peers: Sequence[tuple[Any, Sequence[Mapping], Sequence[float | None] | None]] = (),
        params: Mapping[str, Any] | None = None,
    ) -> float | None:
        r"""$P(\text{sufficient})$ of a running run after its `len(records)` checkpoints.

        Parameters
        ----------
        records : sequence of dict
            The run's [`checkpoint_record`][dtg_gpu.early_stopping.records.checkpoint_record] s, in time order.
        values : sequence of float or None, optional
            The value it reported at each of those checkpoints (None where it did not).
        finished : sequence of `(key, records, values, final_value[, params])`
            The finished runs to learn from (online mode); `key` identifies a run (its fit
            is cached while the set of finished runs does not change); `params`: its
            hyper-parameters (a mapping), read when `covariates` are set.
        peers : sequence of `(key, records, values)`, optional
            The other runs of the study in any state (running, stopped, finished), for the
            warm start (`warm_start`); the finished ones count as peers too.
        params : mapping, optional
            The run's hyper-parameters, read when `covariates` are set.

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
            p = self._given(records, values)
        else:
            p = self._learned(records, values, finished, params)
            if p is None and self.warm_start:
                p = self._peer_probability(records, values, [*((f[0], f[1], f[2]) for f in finished), *peers])
        k = len(records)
        if values is not None and self.value_test(values, k) and len(finished) >= 5:
            at_k = self._values_at(k, finished)
            if at_k.size:
                sign = 1.0 if self.direction == "maximize" else -1.0
                own = np.array([float(v) for v in list(values)[:k] if v is not None], dtype=float)
                best = float(np.max(sign * own))
                if best < float(np.median(sign * at_k)):
                    return 0.0  # behind the finished runs' median: MedianPruner's test
                leader, cut = self.value_leader, self.value_median
                if leader is not None and cut is not None and p is not None and at_k.size >= 5:
                    if best >= float(np.quantile(sign * at_k, leader)):
                        p = max(p, float(cut))  # leading by value: not the checkpoints' to stop
        return p

    def value_test(self, values: Sequence[float | None] | None, k: int) -> bool:
        """Whether the value's median test runs for a run that reported `values` at its
        first `k` checkpoints (`value_median` set, `use_values` not `False`, a finite value
        at each of them); then [`should_stop`][dtg_gpu.early_stopping.rule.StoppingRule.should_stop] compares $P$ with `value_median`."""
        if self.value_median is None or self.use_values is False or values is None or len(values) < k or k < 1:
            return False
        return all(v is not None and math.isfinite(v) for v in list(values)[:k])

    @staticmethod
    def _values_at(k: int, finished) -> np.ndarray:
        """The finished runs' finite values at checkpoint `k`."""
        return np.array(
            [
                float(f[2][k - 1])
                for f in finished
                if f[2] is not None and len(f[2]) >= k and f[2][k - 1] is not None and math.isfinite(f[2][k - 1])
            ],
            dtype=float,
        )

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

    def _learned(self, records, values, finished, params=None) -> float | None:
        k = len(records)
        rows = [row for row in finished if len(row[1]) >= k and row[3] is not None and math.isfinite(row[3])]
        if len(rows) < max(self.n_startup_trials, 2):
            return None
        use = self._uses_values(k, values, rows)
        key = (k, use, tuple(sorted(str(r[0]) for r in rows)))
        model = self._cache.get(key)
        if model is None:
            from threadpoolctl import threadpool_limits

            # a few dozen rows: one BLAS thread is fastest, and leaves the cores to the training
            with threadpool_limits(limits=1, user_api="blas"):
                model = self._fit(rows, k, use)
            if len(self._cache) > 256:
                self._cache = {"features": self._cache.get("features", {})}
            self._cache[key] = model
        if model == "one-class":
            return None
        x = feature_vector(records, k, self.features, self.alpha, values if use else None, self.fold_batchnorm)
        clf, fill, centre, novel = model
        if centre is not None:
            x = np.r_[x, _covariate_columns(self._covariate_values([params], centre[2], centre[3]), centre[:2])[0]]
        x = np.where(np.isfinite(x), x, fill)
        p = float(clf.predict_proba(x[None, :])[0, 1])
        if novel is not None and p < self.min_probability:
            Z, far = novel
            z = clf[0].transform(x[None, :])[0]
            if float(np.sqrt(((Z - z) ** 2).sum(axis=1)).min()) > far:
                return float(self.min_probability)  # unlike every finished run: not the model's to stop
        return p

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
        centre = None
        params = [r[4] if len(r) > 4 else None for r in rows]
        names = self.covariate_names(params)
        if names:
            H = self._covariate_values(params, names)[good]
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)
                # a rate searched on a log scale: positive, spanning 100x or more
                logs = (np.nanmin(H, axis=0) > 0) & (np.nanmax(H, axis=0) >= 100 * np.nanmin(H, axis=0))
            logs &= np.array([n not in LOG_COVARIATES for n in names])
            H = _log10_columns(H, logs)
            with warnings.catch_warnings(), np.errstate(all="ignore"):  # an all-NaN column; 1e300s
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, std = np.nanmean(H, axis=0), np.nanstd(H, axis=0)
            centre = (np.nan_to_num(mean), np.where(np.isfinite(std) & (std > 0), std, 1.0), names, logs)
            X = np.hstack([X, _covariate_columns(H, centre[:2])])
        fill = X.mean(axis=0)
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=self.C, max_iter=2000))
        clf.fit(X, y)
        return clf, fill, centre, (_novelty_reference(clf[0].transform(X)) if self.novelty_guard else None)

    def covariate_names(self, params: Sequence[Mapping | None]) -> tuple[str, ...]:
        """The hyper-parameter names the online model reads, given the finished runs' `params`:
        the explicit `covariates`, or for `"auto"` [`auto_covariates`][dtg_gpu.early_stopping.rule.auto_covariates]`(params)`."""
        if self.covariates == "auto":
            return auto_covariates(params)
        return tuple(self.covariates or ())

    def _covariate_values(
        self, params: Sequence[Mapping | None], names: Sequence[str], logs: np.ndarray | None = None
    ) -> np.ndarray:
        """`[len(params), len(names)]`: each run's hyper-parameters (log10 for
        `LOG_COVARIATES`, as `featurize(covariates=...)`, and where `logs` says so), NaN where
        missing or not a number."""
        H = np.array(
            [[covariate_value(n, p.get(n) if isinstance(p, Mapping) else None) for n in names] for p in params],
            dtype=float,
        ).reshape(len(params), len(names))
        return H if logs is None else _log10_columns(H, logs)

    # ----------------------------------------------------------------- decision
    def should_stop(
        self, history: Sequence[float | None], diverged: bool = False, values: Sequence[float | None] | None = None
    ) -> bool:
        """Stop after `patience` consecutive probabilities below `min_probability` (below
        `value_median` when the run's `values` take the value's median test, see
        [`value_test`][dtg_gpu.early_stopping.rule.StoppingRule.value_test]), or at once
        when the run's latest weights are not finite (`diverged`, see `is_diverged`)."""
        if diverged:
            return True
        cut = float(self.min_probability)
        if self.value_median is not None and self.value_test(values, len(history)):
            cut = float(self.value_median)
        tail = list(history)[-self.patience :]
        return len(tail) == self.patience and all(p is not None and p < cut for p in tail)
