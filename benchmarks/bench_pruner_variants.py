"""Can the data-free pruner keep the best run (>= 95 % of orders) and still save >= 50 %?
Variants of the online model replayed on the suite's recorded sweeps (issue #33).

Every variant is the shipped ``DTGPruner(use_values=False)`` with one change, replayed with
``bench_early_stopping.replay`` on the same orders as ``bench_early_stopping.py --suite``
(the first ``--orderings`` of them), from the checkpoint records that script caches:

* ``shipped``: the rule as it ships (C = 1, 10 finished runs before the model decides);
* ``n_startup_trials=20``, ``n_warmup_steps=2``, ``patience=2``: options of the rule;
* ``C=0.1``: ten times the L2 penalty of the online logistic regression (a rule field);
* ``LOO AUC gate 0.7``: the model decides at checkpoint k only when its approximate
  leave-one-out AUC on the finished runs at k is at least 0.7 (otherwise the peer comparison
  decides, as before the model exists);
* ``top-decile guard``: a run is stopped only when its P is below the approximate
  leave-one-out P of every finished run in the best 10 % of final values;
* ``LOO Platt``: P recalibrated by a one-feature logistic regression of the finished runs'
  labels on the logit of their approximate leave-one-out P;
* ``novelty_guard=False``: the rule without its novelty guard (the default since 2026-12-08:
  a run unlike every finished run is not the online model's to stop), as it shipped before;
* ``two witnesses``: the rule without the novelty guard, whose online model stops a run only
  where the warm start's peer comparison (log-lambda growth against the study's runs at the
  same checkpoint) would stop it too.

``--covariates none`` (default) replays the rule from the checkpoints alone, as it shipped when
the first page was measured; ``--covariates auto --root SWEEPS`` as it ships since 2026-12-07,
the trials suggesting each run's learning rate and dropout (from its ``run.json``).

The leave-one-out probabilities are the closed-form approximation for an L2-regularised
logistic regression (Rad & Maleki 2018): one Newton step from the full fit,
$\\eta_{-i} = \\eta_i + \\frac{h_{ii}}{1 - h_{ii} w_i}(p_i - y_i)$ with $w_i = p_i(1-p_i)$
and $H = X(X^\\top W X + \\Lambda)^{-1}X^\\top$; on 30 runs of resnet20-digits they match
refitting without each run to within 0.035 (correlation 0.9996). The three LOO variants are
prototypes, as is ``two witnesses``: subclasses of the rule, set on the pruner here, not options
of the library.

    python benchmarks/bench_pruner_variants.py --work /root/es-work [--orderings 10] [--jobs 2]
        [--variants NAME ...] [--merge] [--covariates auto --root SWEEPS] [--stem NAME]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.early_stopping.rule import StoppingRule, _covariate_columns  # noqa: E402
from dtg_gpu.sweeps.config import SUITE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def loo_probabilities(clf, X: np.ndarray, y: np.ndarray, C: float) -> np.ndarray:
    """Approximate leave-one-out P(y = 1) of a fitted StandardScaler + LogisticRegression."""
    sc, lr = clf[0], clf[-1]
    Z = np.hstack([sc.transform(X), np.ones((len(X), 1))])
    eta = Z @ np.r_[lr.coef_[0], lr.intercept_[0]]
    p = 1 / (1 + np.exp(-eta))
    w = p * (1 - p)
    lam = np.r_[np.full(Z.shape[1] - 1, 1.0 / C), 1e-8]  # the intercept is not penalised
    K = (Z / lam) @ Z.T  # Woodbury: H = K - K W^1/2 (I + W^1/2 K W^1/2)^-1 W^1/2 K
    s = np.sqrt(w)
    H = K - (K * s) @ np.linalg.solve(np.eye(len(X)) + s[:, None] * K * s, s[:, None] * K)
    h = np.diag(H)
    return 1 / (1 + np.exp(-(eta + h / (1 - h * w) * (p - y))))


class _Checked:
    """The online model with its check; tells the rule which model gave the last P and for
    which row."""

    def __init__(self, clf, check, rule: _LooRule):
        self.clf, self.check, self.rule = clf, check, rule

    def predict_proba(self, X):
        self.rule._used, self.rule._row = self, X[0]
        return self.clf.predict_proba(X)

    def __getitem__(self, i):  # the pipeline's steps (the novelty guard reads its scaler)
        return self.clf[i]


class _LooRule(StoppingRule):
    """The shipped rule, with a check of the online model on its finished runs at each fit:
    `_check(clf, X, y, finals)` returns what becomes of the model's P for a run's row x,
    `f(p, x)` (None: the model does not decide, and the rule falls back to the peer
    comparison, as before the model exists). X holds the columns the model reads (the
    covariates' too)."""

    def _check(self, clf, X, y, finals):
        raise NotImplementedError

    def _fit(self, rows, k, use_values):
        model = super()._fit(rows, k, use_values)
        if model == "one-class":
            return model
        clf, fill, centre, novel = model
        y, _ = self.labels(np.array([r[3] for r in rows], dtype=float))
        X = np.stack([self._cache["features"][(r[0], k, use_values)] for r in rows])
        ok = np.isfinite(X).all(axis=1)
        X, y = X[ok], y[ok]
        if centre is not None:  # the covariate columns, as the model was fitted on them
            params = [r[4] if len(r) > 4 else None for r in rows]
            H = self._covariate_values(params, centre[2], centre[3])[ok]
            X = np.hstack([X, _covariate_columns(H, centre[:2])])
        finals = np.array([r[3] for r in rows], dtype=float)[ok]
        return _Checked(clf, self._check(clf, X, y, finals), self), fill, centre, novel

    def _learned(self, records, values, finished, params=None):
        self._used = None
        p = super()._learned(records, values, finished, params)
        return p if p is None or self._used is None else self._used.check(p, self._row)


class AucGate(_LooRule):
    bar = 0.7

    def _check(self, clf, X, y, finals):
        from sklearn.metrics import roc_auc_score

        trusted = roc_auc_score(y, loo_probabilities(clf, X, y, self.C)) >= self.bar
        return (lambda p, x: p) if trusted else (lambda p, x: None)


class TopGuard(_LooRule):
    quantile = 0.9

    def _check(self, clf, X, y, finals):
        floor = float(loo_probabilities(clf, X, y, self.C)[finals >= np.quantile(finals, self.quantile)].min())
        return lambda p, x: max(p, self.min_probability) if p >= floor else p  # not stopped above the floor


class LooPlatt(_LooRule):
    def _check(self, clf, X, y, finals):
        from sklearn.linear_model import LogisticRegression

        if np.bincount(y, minlength=2).min() < 2:
            return lambda p, x: p
        z = np.log(np.clip(q := loo_probabilities(clf, X, y, self.C), 1e-6, 1 - 1e-6) / np.clip(1 - q, 1e-6, 1))
        cal = LogisticRegression(C=1.0).fit(z[:, None], y)
        a, b = float(cal.coef_[0, 0]), float(cal.intercept_[0])

        def recalibrated(p: float, x) -> float:
            p = min(max(p, 1e-6), 1 - 1e-6)
            return 1 / (1 + math.exp(-(a * math.log(p / (1 - p)) + b)))

        return recalibrated


class TwoWitnesses(StoppingRule):
    """The online model stops a run only where the warm start's peer comparison (the growth of
    log lambda against the study's runs at the same checkpoint) would stop it too."""

    def probability(self, records, values, finished, peers=(), params=None):
        p = super().probability(records, values, finished, peers, params)
        if p is None or p == 0.0 or p >= self.min_probability:
            return p
        q = self._peer_probability(records, values, [*((f[0], f[1], f[2]) for f in finished), *peers])
        return float(self.min_probability) if q is not None and q >= self.min_probability else p


VARIANTS = {
    "shipped": (StoppingRule, {}),
    "n_startup_trials=20": (StoppingRule, {"n_startup_trials": 20}),
    "n_warmup_steps=2": (StoppingRule, {"n_warmup_steps": 2}),
    "patience=2": (StoppingRule, {"patience": 2}),
    "C=0.1": (StoppingRule, {"C": 0.1}),
    "LOO AUC gate 0.7": (AucGate, {}),
    "top-decile guard": (TopGuard, {}),
    "LOO Platt": (LooPlatt, {}),
    # the shipped rule of 2026-12-07/08, before the novelty guard (an option since)
    "novelty_guard=False": (StoppingRule, {"novelty_guard": False}),
    "two witnesses": (TwoWitnesses, {"novelty_guard": False}),
}


def pooled(fn, jobs: list, n_jobs: int, line) -> list[dict]:
    """`fn` over `jobs` on `n_jobs` processes (one OpenMP thread each), printing `line(result)`
    as each result comes in; the results in the order of `jobs`."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = []
    with ProcessPoolExecutor(n_jobs) as pool:
        for r in pool.map(fn, jobs):
            out.append(r)
            print(line(r), flush=True)
    return out


def run_one(job: tuple[str, str, str, int]) -> dict:
    """Replay one variant on one sweep over the first n orders of bench_early_stopping."""
    import bench_early_stopping as B

    from dtg_gpu.integrations.optuna import DTGPruner

    work, name, variant, n, root, covariates = job
    warnings.simplefilter("ignore")
    sweep = json.loads((Path(work) / f"records-v2-{name}.json").read_text())
    if covariates == "auto":  # the trials suggest each run's lr and dropout, read as the default reads them
        sweep = B.with_params(sweep, Path(root) / name)
    rng = np.random.default_rng(0)  # bench_early_stopping's orders
    orders = [rng.permutation(len(sweep["runs"])) for _ in range(n)]
    cls, extra = VARIANTS[variant]
    t0 = time.perf_counter()
    rows = []
    for order in orders:
        # covariates "none": the rule as it shipped when the first page was measured (the checkpoints
        # alone); "auto": as it ships since 2026-12-07
        cov = "auto" if covariates == "auto" else None
        pruner = DTGPruner(use_values=False, covariates=cov, **{k: v for k, v in extra.items() if k != "C"})
        rule = cls(direction="maximize", **pruner._params)
        rule.C = float(extra.get("C", rule.C))
        pruner._rules["maximize"] = rule  # the variant decides in place of the shipped rule
        rows.append(B.metrics(sweep, B.replay(sweep, order, pruner, uses_values=False)))
    s = B.summarise(rows)
    return {"sweep": name, "variant": variant, "seconds": time.perf_counter() - t0} | s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True, help="bench_early_stopping's records cache (records-v2-NAME.json)")
    ap.add_argument("--orderings", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--stem", default="pruner_variants")
    ap.add_argument("--merge", action="store_true", help="keep the saved rows of the variants not run now")
    cov = "none: the checkpoints alone (the first page); auto: the trials' lr and dropout too (the default since 2026-12-07; needs --root)"
    ap.add_argument("--covariates", choices=("none", "auto"), default="none", help=cov)
    ap.add_argument("--root", help="the folder of the suite's sweeps (each run.json gives a trial's lr and dropout)")
    a = ap.parse_args()
    if a.covariates == "auto" and not a.root:
        ap.error("--covariates auto needs --root (the sweeps' folder)")
    names = [n for n in SUITE if (Path(a.work) / f"records-v2-{n}.json").exists()]
    if not names:
        ap.error(f"no records-v2-NAME.json in {a.work}: run bench_early_stopping.py --suite first")
    jobs = [(a.work, n, v, a.orderings, a.root, a.covariates) for v in a.variants for n in names]
    date = time.strftime("%Y-%m-%d %H:%M")
    out = pooled(
        run_one,
        jobs,
        a.jobs,
        lambda r: (
            f"{r['sweep']:>24} {r['variant']:<20} S {r['saved_mean']:.3f}  R = 0 {r['regret_zero_share']:.0%}  "
            f"({r['seconds']:.0f} s)"
        ),
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    store = RESULTS / f"{a.stem}.json"
    if a.merge and store.exists():
        old = json.loads(store.read_text())
        now = {(r["sweep"], r["variant"]) for r in out}
        out = [r for r in old["rows"] if (r["sweep"], r["variant"]) not in now] + out
        out.sort(key=lambda r: list(VARIANTS).index(r["variant"]) if r["variant"] in VARIANTS else len(VARIANTS))
        date = f"{old['date']}; {', '.join(a.variants)} added {date}"
    atomic_write(
        RESULTS / f"{a.stem}.json", json.dumps({"date": date, "orderings": a.orderings, "rows": out}, indent=1)
    )
    how = None
    if a.covariates == "auto":
        how = (
            f"`python benchmarks/bench_pruner_variants.py --work WORK --root SWEEPS --covariates auto "
            f"--orderings {a.orderings} --stem {a.stem}` on the records that `bench_early_stopping.py --suite` cached "
            f"for the suite's {len(names)} sweeps (`early_stopping_suite_ten.md`), as the rule ships: the trials' "
            'lr and dropout read beside the checkpoints (`covariates="auto"`).'
        )
    atomic_write(RESULTS / f"{a.stem}.md", table(out, a.orderings, date, how))


def table(rows: list[dict], n: int, date: str, how: str | None = None) -> str:
    names = list(dict.fromkeys(r["sweep"] for r in rows))
    cell = {(r["variant"], r["sweep"]): r for r in rows}
    lines = [
        f"# The data-free pruner: variants of its online model ({date}, {n} orders per cell)",
        "",
        (
            how
            or f"`python benchmarks/bench_pruner_variants.py --work /root/es-work --orderings {n}` on the records that "
            "`bench_early_stopping.py --suite` cached for the suite's retrained sweeps, from the checkpoints alone"
        )
        + f" (the first {n} of its 20 orders; `--variants NAME --merge` adds a variant). Each cell: compute saved S / share of orders that keep the best final "
        "accuracy (R = 0); **bold**: both goals of issue #33 (S >= 0.50, R = 0 in >= 95 %). What each "
        "variant changes is in the script's docstring.",
        "",
        "| variant | " + " | ".join(names) + " | goal met |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for v in dict.fromkeys(r["variant"] for r in rows):
        cells, met = [], 0
        for s in names:
            r = cell.get((v, s))
            if r is None:
                cells.append("–")
                continue
            ok = _met(r)
            met += ok
            txt = f"{r['saved_mean']:.3f} / {r['regret_zero_share']:.0%}"
            cells.append(f"**{txt}**" if ok else txt)
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {met} of {len(names)} |")
    picks = leave_one_sweep_out(rows)
    held = sum(_met(cell[(v, s)]) for s, v in picks.items())
    lines += [
        "",
        "Leave one sweep out: for each sweep, the variant that meets the goal on the most of the other "
        "sweeps (ties to the earlier row: the shipped rule first), scored on the held-out sweep: "
        + "; ".join(f"{s}: {v} ({'met' if _met(cell[(v, s)]) else 'missed'})" for s, v in picks.items())
        + f". Met on {held} of {len(picks)} held-out sweeps.",
    ]
    return "\n".join(lines) + "\n"


def _met(r: dict) -> bool:
    return r["saved_mean"] >= 0.5 and r["regret_zero_share"] >= 0.95


def leave_one_sweep_out(rows: list[dict]) -> dict[str, str]:
    """sweep -> the variant chosen on the other sweeps (most goals met; ties to the earlier row).
    Only variants measured on every sweep compete."""
    names = list(dict.fromkeys(r["sweep"] for r in rows))
    cell = {(r["variant"], r["sweep"]): r for r in rows}
    full = [v for v in dict.fromkeys(r["variant"] for r in rows) if all((v, s) in cell for s in names)]
    return {
        s: max(full, key=lambda v: (sum(_met(cell[(v, o)]) for o in names if o != s), -full.index(v))) for s in names
    }


if __name__ == "__main__":
    main()
