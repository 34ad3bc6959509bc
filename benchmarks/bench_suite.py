"""The suite (issue #33): every prediction claim measured on every sweep of ``SUITE``.

For each trained sweep (``dtg sweep --preset NAME --out ROOT/NAME``): featurise once (raw
statistics of every checkpoint, per layer, log lambda_1, with and without batch norm folded;
weight statistics and covariates at k), then score every candidate predictor at k = 25 % of
the checkpoints (``--fraction``; 1 for every checkpoint; label: the sweep median) over ``--repeats`` stratified 90/10 splits shared
by all rows. The default is chosen *leave one sweep out*: for each sweep, the candidate with
the best mean rank (precision and AUC) on the *other* sweeps, scored on the held-out one.

Usage: python benchmarks/bench_suite.py --root ROOT [--repeats 100] [--out benchmarks/results]
       python benchmarks/bench_suite.py --root ROOT --fraction 1 --stem prediction_suite_full
           (k = every checkpoint: where the seed's method wins on LeNet-5)
       python benchmarks/bench_prediction.py --suite --root ROOT   (the same)
       python benchmarks/bench_suite.py --root ROOT --transfer   (only the transfer table:
           leave one architecture family out, results/transfer_suite.md)
       python benchmarks/bench_suite.py --root CHECKS --sweeps NAME --stem prediction_check_NAME
           (a held-out check sweep trained with `dtg sweep` flags: no default was chosen on it)
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.predictor import label_runs  # noqa: E402
from dtg_gpu.predictor.evaluation import evaluate  # noqa: E402
from dtg_gpu.sweeps.config import PRESETS, SUITE  # noqa: E402


def sweep_features(folder: Path, cache: Path, fraction: float = 0.25) -> dict[str, np.ndarray]:
    """Every matrix the candidates need at k = `fraction` of T (cached as .npz)."""
    if cache.is_file():
        return with_spec_folded(dict(np.load(cache, allow_pickle=False)))
    from dtg_gpu.features.baselines import weight_statistics
    from dtg_gpu.features.covariates import covariate_matrix
    from dtg_gpu.sweeps import load_sweep
    from dtg_gpu.workflow import featurize_sweep

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_sweep(folder)
        listed = json.loads((folder / "sweep.json").read_text())["runs"]
        if len(runs) + len(runs.failed) < len(listed):
            raise RuntimeError(f"{len(listed) - len(runs) - len(runs.failed)} of {len(listed)} runs still unfinished")
        sf = featurize_sweep(runs)
        sff = featurize_sweep(runs, fold_batchnorm=True)
    T = min(len(r) for r in runs)
    k = max(1, round(T * fraction))
    ok = sf.usable & sff.usable
    out = {
        "k": np.array(k),
        "T": np.array(T),
        "acc": sf.accuracies,
        "usable": ok,
        "spec": sf.dtg(k),
        "layer_lam": sf.dtg(k, per_layer=True, eigenvalue=True),
        "layer_lam_folded": sff.dtg(k, per_layer=True, eigenvalue=True),
        "ws": weight_statistics(list(runs), k),
        "cov": covariate_matrix(list(runs), ("lr", "dropout"))[0].numpy(),
    }
    out["stats_raw"] = sf.stats.double().numpy()  # [runs, T, 5]: the transfer table's inputs
    out["lam_raw"] = sf.log_eigenvalue.double().numpy()  # featurize_sweep always solves for lambda_1
    val = [[c.get("val_accuracy") for c in r.meta["checkpoints"][:k]] for r in runs]
    out["curve"] = np.asarray(val, dtype=float)
    np.savez(cache, **out)
    return with_spec_folded(out)


def with_spec_folded(f: dict) -> dict:
    """`spec_folded`: the seed's five statistics of the folded graph (what `spec_block=True`
    appends), the first five columns of each timestep of `layer_lam_folded`."""
    n, k = len(f["acc"]), int(f["k"])
    f["spec_folded"] = f["layer_lam_folded"].reshape(n, k, -1)[:, :, :5].reshape(n, 5 * k)
    return f


def lr_q(C: float = 0.1):
    """The "LR(q)" rows' model: quantile-normalised columns, standardised, an L2 logistic regression."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import QuantileTransformer, StandardScaler

    return make_pipeline(
        QuantileTransformer(output_distribution="normal", n_quantiles=50),
        StandardScaler(),
        LogisticRegression(C=C, max_iter=5000),
    )


def candidates():
    """name -> (feature blocks, model factory). Models get a list of matrices (one per block)."""
    from dtg_gpu.predictor import PerformancePredictor

    def mlp(**kw):
        return PerformancePredictor(random_state=0, **kw)

    return {
        DEFAULT: (["layer_lam_folded", "ws", "spec_folded"], "library"),
        EQUAL: (["layer_lam_folded", "ws", "spec_folded"], "library-equal"),
        PREVIOUS: (["layer_lam_folded", "ws"], "library-equal"),
        "spec (seed: dtg, MLP)": (["spec"], lambda: PerformancePredictor.spec(random_state=0)),
        "dtg per layer+lam folded, quantile MLP (options)": (
            ["layer_lam_folded"],
            lambda: PerformancePredictor.spec(random_state=0, scaling="quantile"),
        ),
        "dtg per layer+lam folded, LR(q)": (["layer_lam_folded"], lambda: lr_q()),
        "weight stats, MLP": (["ws"], lambda: PerformancePredictor.spec(random_state=0)),
        "weight stats, LR(q)": (["ws"], lambda: lr_q()),
        "avg LR(q): folded | ws": (["layer_lam_folded", "ws"], "avg"),
        "avg LR(q): folded | ws | spec": (["layer_lam_folded", "ws", "spec"], "avg"),
        "avg LR(q): folded | unfolded | ws": (["layer_lam_folded", "layer_lam", "ws"], "avg"),
        "avg: folded LR(q) | ws LR(q) | spec MLP": (["layer_lam_folded", "ws", "spec"], "mixed"),
        "covariates (hyper-parameter oracle), MLP(q)": (
            ["cov"],
            lambda: PerformancePredictor.spec(random_state=0, scaling="quantile"),
        ),
        "learning curve, LR(q)": (["curve"], lambda: lr_q()),
    }


class Averaged:
    """One LR(q) per block of columns, probabilities averaged (sklearn-compatible)."""

    def __init__(self, widths=(), C=0.1):
        self.widths, self.C = tuple(widths), C

    def get_params(self, deep=True):
        return {"widths": self.widths, "C": self.C}

    def set_params(self, **p):
        for k, v in p.items():
            setattr(self, k, v)
        return self

    def _blocks(self, X):
        cuts = np.cumsum((0,) + self.widths)
        return [X[:, a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def fit(self, X, y):
        self.classes_ = np.unique(y)
        self.models_ = [lr_q(self.C).fit(B, y) for B in self._blocks(X)]
        return self

    def predict_proba(self, X):
        return np.mean([m.predict_proba(B) for m, B in zip(self.models_, self._blocks(X))], axis=0)

    def predict(self, X):
        return self.classes_[self.predict_proba(X).argmax(1)]


class Mixed(Averaged):
    """One model per block, probabilities averaged: `kinds[i]` is "lr" (LR(q)) or "mlp" (the
    seed's MLP, standard scaling), e.g. the default's two heads and the seed's model beside them."""

    def __init__(self, widths=(), kinds=(), C=0.1):
        self.widths, self.kinds, self.C = tuple(widths), tuple(kinds), C

    def get_params(self, deep=True):
        return {"widths": self.widths, "kinds": self.kinds, "C": self.C}

    def fit(self, X, y):
        from dtg_gpu.predictor import PerformancePredictor

        self.classes_ = np.unique(y)
        make = {"lr": lambda: lr_q(self.C), "mlp": lambda: PerformancePredictor.spec(random_state=0)}
        self.models_ = [make[k]().fit(B, y) for k, B in zip(self.kinds, self._blocks(X))]
        return self


def matrix(f: dict, blocks: list[str]) -> np.ndarray:
    parts = []
    for b in blocks:
        for name in b.split("+"):
            parts.append(f[name] if name != "ws" else f["ws"])
    return np.hstack(parts)


def score(f: dict, name: str, spec, repeats: int) -> dict:
    blocks, make = spec
    keep = f["usable"].astype(bool)
    y = label_runs(f["acc"][keep], "median")
    X = matrix(f, blocks)[keep]
    X = np.where(np.isfinite(X), X, np.nan)
    good = np.isfinite(X).all(1)  # diverged runs: insufficient by rule, as the predictor does
    if make in ("avg", "library", "library-equal", "mixed"):
        widths = tuple(matrix(f, [b]).shape[1] for b in blocks)
        if make == "avg":
            clf = Averaged(widths)
        elif make == "mixed":
            clf = Mixed(widths, ("lr",) * (len(blocks) - 1) + ("mlp",))
        else:  # what featurize's default and PerformancePredictor() do: one head per feature set
            from dtg_gpu.predictor import PerformancePredictor

            models = tuple("mlp" if b == "spec_folded" else "linear" for b in blocks)  # spec_block: the seed's MLP
            clf = PerformancePredictor(random_state=0, blocks=widths, block_models=models)
            if make == "library-equal":  # the defaults before stacked head weights
                clf.set_params(head_weights="equal")
    else:
        clf = make()
    X = np.where(good[:, None], X, 0.0) if not hasattr(clf, "scaling") else X
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = evaluate(clf, X, y, repeats=repeats, seed=0)
    return {m: {k: float(s[m][k]) for k in ("mean", "ci_low", "ci_high")} for m in ("precision", "roc_auc")}


#: featurize's default recipe (spec_block=True) + PerformancePredictor() (head_weights="stacked"
#: since 2026-12-07, evening: this row's cells before that are the EQUAL row's)
DEFAULT = "library default (featurize + PerformancePredictor)"
#: the default of 2026-12-07 (spec_block=True, three heads) with head_weights="equal": their mean
EQUAL = "library, head_weights='equal' (the default of 2026-12-07)"
#: the default until 2026-12-07: feature_recipe("default", spec_block=False), two linear heads, equal
PREVIOUS = "library, spec_block=False (the default until 2026-12-07)"
SINGLE_ROWS = (
    "spec (seed: dtg, MLP)",
    "dtg per layer+lam folded, quantile MLP (options)",
    "dtg per layer+lam folded, LR(q)",
    "weight stats, MLP",
    "weight stats, LR(q)",
)
ORACLE = "covariates (hyper-parameter oracle), MLP(q)"
SEED = "spec (seed: dtg, MLP)"


def goals(table: dict) -> list[str]:
    """Issue #33's first two goals, per sweep: the default at or above the lower 95 % bound of
    the best single data-free row (precision, AUC), and >= 0.90 / 0.90 where the
    hyper-parameter oracle reaches 0.90 / 0.90."""
    if any(c not in row for row in table.values() for c in (DEFAULT, ORACLE, *SINGLE_ROWS)):
        return []  # the goals compare against every single row and the oracle
    out = [
        "",
        "## Goals",
        "",
        "| sweep | precision: default vs best single row (its lower bound) | AUC: the same | >= 0.90 / 0.90 where the oracle reaches it |",
        "|---|---|---|---|",
    ]
    for s, row in table.items():
        cells = []
        for m in ("precision", "roc_auc"):
            best = max((c for c in SINGLE_ROWS if c in row), key=lambda c: row[c][m]["mean"])
            ok = row[DEFAULT][m]["mean"] >= row[best][m]["ci_low"]
            cells.append(
                f"{row[DEFAULT][m]['mean']:.3f} vs {best} {row[best][m]['mean']:.3f} ({row[best][m]['ci_low']:.3f}): {'met' if ok else '**missed**'}"
            )
        o = row[ORACLE]
        if o["precision"]["mean"] >= 0.9 and o["roc_auc"]["mean"] >= 0.9:
            ok = row[DEFAULT]["precision"]["mean"] >= 0.9 and row[DEFAULT]["roc_auc"]["mean"] >= 0.9
            cells.append("met" if ok else "**missed**")
        else:
            cells.append(f"n/a (oracle {o['precision']['mean']:.2f} / {o['roc_auc']['mean']:.2f})")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return out


def versus_seed(table: dict) -> list[str]:
    """The third goal, per sweep: nothing lost against the seed's method (the default's mean
    at or above the lower 95 % bound of the `spec` row, precision and AUC)."""
    if any(DEFAULT not in row or SEED not in row for row in table.values()):
        return []
    out = ["", "## The default against the seed's method", ""]
    out += ["| sweep | precision: default vs seed [its interval] | AUC: the same |", "|---|---|---|"]
    for s, row in table.items():
        cells = []
        for m in ("precision", "roc_auc"):
            d, r = row[DEFAULT][m], row[SEED][m]
            verdict = "lost" if d["mean"] < r["ci_low"] else ("won" if d["ci_low"] > r["mean"] else "held")
            cells.append(f"{d['mean']:.3f} vs {r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]: {verdict}")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    out += [
        "",
        "lost: the default's mean is below the seed's lower bound; won: the default's lower bound is above the seed's mean.",
    ]
    return out


def goal_cells(row: dict, cand: str) -> list[bool | None]:
    """The three goal cells of one sweep for `cand` as if it were the default: precision and AUC
    at or above the best single row's lower bound, and >= 0.90 / 0.90 where the oracle reaches
    it (`None`: the oracle does not)."""
    cells: list[bool | None] = []
    for m in ("precision", "roc_auc"):
        best = max((c for c in SINGLE_ROWS if c in row), key=lambda c: row[c][m]["mean"])
        cells.append(row[cand][m]["mean"] >= row[best][m]["ci_low"])
    o = row[ORACLE]
    if o["precision"]["mean"] >= 0.9 and o["roc_auc"]["mean"] >= 0.9:
        cells.append(row[cand]["precision"]["mean"] >= 0.9 and row[cand]["roc_auc"]["mean"] >= 0.9)
    else:
        cells.append(None)
    return cells


def goals_by_candidate(table: dict) -> list[str]:
    """How many goal cells each data-free candidate would meet as the default, sweep by sweep
    (the row under `## Goals` is the default's)."""
    if any(c not in row for row in table.values() for c in (DEFAULT, ORACLE, *SINGLE_ROWS)):
        return []
    cands = [c for c in next(iter(table.values())) if c != ORACLE and "learning curve" not in c]
    out = ["", "## The goals for each candidate as the default", ""]
    out += ["Goal cells met of those that apply (precision, AUC, the oracle's 0.90 / 0.90), per sweep and in all:", ""]
    out += ["| candidate | " + " | ".join(table) + " | in all |", "|---|" + "---|" * (len(table) + 1)]
    for c in cands:
        met = total = 0
        cells = []
        for row in table.values():
            g = [x for x in goal_cells(row, c) if x is not None]
            met, total = met + sum(g), total + len(g)
            cells.append(f"{sum(g)}/{len(g)}")
        out.append(f"| {c.replace('|', '/')} | " + " | ".join(cells) + f" | {met}/{total} |")
    return out


def markdown(doc: dict, feats: dict, command: str) -> str:
    """The results page: one table (candidates x sweeps), the leave-one-sweep-out choice, a
    link to the transfer table."""
    table = doc["table"]
    sweeps = list(table)
    cands = list(next(iter(table.values())))
    lines = [
        "# Prediction on the benchmark suite",
        "",
        *(
            [
                f"Only the rows whose name contains one of {', '.join(repr(o) for o in doc['only'])} (`--only`); the goals are shown only with the default, every single row and the oracle among them.",
                "",
            ]
            if doc.get("only")
            else []
        ),
        f"`{command}` ({doc['date']}, {doc['repeats']} stratified 90/10 splits per cell, shared by every row;"
        f" label: final accuracy >= the sweep median; k = {round(100 * doc.get('fraction', 0.25))} % of the checkpoints). Each cell: precision / ROC AUC"
        " of the sufficient class, mean over the splits, and the 95 % interval of each.",
        "",
        "| candidate | " + " | ".join(f"{s} (k={int(feats[s]['k'])}/{int(feats[s]['T'])})" for s in sweeps) + " |",
        "|---|" + "---|" * len(sweeps),
    ]
    for c in cands:
        cells = []
        for s in sweeps:
            p, a = table[s][c]["precision"], table[s][c]["roc_auc"]
            cells.append(
                f"{p['mean']:.2f} / {a['mean']:.2f} <small>[{p['ci_low']:.2f}, {p['ci_high']:.2f}] / [{a['ci_low']:.2f}, {a['ci_high']:.2f}]</small>"
            )
        lines.append(f"| {c.replace('|', '/')} | " + " | ".join(cells) + " |")
    lines += (goals(table) + goals_by_candidate(table)) if doc.get("fraction", 0.25) == 0.25 else []
    lines += versus_seed(table)
    if doc.get("leave_one_sweep_out"):
        lines += [
            "",
            "## Leave one sweep out",
            "",
            "For each sweep, the data-free candidate with the best mean rank on the other sweeps, scored here:",
            "",
        ]
        lines += ["| held-out sweep | chosen elsewhere | precision / AUC here |", "|---|---|---|"]
        for s, r in doc["leave_one_sweep_out"].items():
            lines.append(
                f"| {s} | {r['chosen'].replace('|', '/')} | {r['precision']['mean']:.2f} / {r['roc_auc']['mean']:.2f} |"
            )
    lines += ["", "The transfer table (no run of the held-out family seen) is [transfer_suite.md](transfer_suite.md)."]
    return "\n".join(lines) + "\n"


def transfer_markdown(t: dict, date: str, command: str) -> str:
    """The transfer results page (leave one architecture family out)."""
    labels = list(next(iter(t["rows"].values()))["auc"])
    families = sorted({r["family"] for r in t["rows"].values()})
    missing = [s for s in SUITE if s not in t["rows"]]
    lines = [
        "# Transfer: leave one architecture family out",
        "",
        f"`{command}` ({date}; {len(t['rows'])} sweeps of the suite, families {', '.join(families)}"
        + (f"; not trained for this run: {', '.join(missing)}" if missing else "")
        + "). A logistic regression fitted on the sweeps of the *other* families,"
        " scored on each sweep of the held-out family with no run of"
        " that family seen: ROC AUC against the sweep-median label (0.5 is chance) and its 95 % bootstrap"
        f" interval over the runs. Seed features: the first {t['k']} checkpoints; growth summary: smoothed"
        " statistics at k = 25 %, their change since the first checkpoint, log λ₁ and its growth; the peer"
        " score is the pruner's warm-start comparison (log λ₁ growth since the first checkpoint), no training"
        " at all.",
        "",
        "| held-out sweep (family) | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for s, r in t["rows"].items():
        cells = [f"{a:.2f} <small>[{lo:.2f}, {hi:.2f}]</small>" for a, lo, hi in (r["auc"][x] for x in labels)]
        lines.append(f"| {s} ({r['family']}) | " + " | ".join(cells) + " |")
    verdict = [x for x, ok in t["ship"].items() if ok]
    lines += [
        "",
        "Above chance on every held-out sweep (lower bound > 0.5): "
        + (", ".join(verdict) if verdict else "none, so no pretrained prior is shipped")
        + ".",
    ]
    return "\n".join(lines) + "\n"


def leave_one_sweep_out(table: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """For each sweep: the data-free candidate with the best mean rank (precision and AUC
    together) on the *other* sweeps, and its score on this one."""
    data_free = [c for c in next(iter(table.values())) if "oracle" not in c and "learning curve" not in c]
    out = {}
    for held in table:
        others = [s for s in table if s != held]
        if not others:
            break
        ranks = {c: 0.0 for c in data_free}
        for s in others:
            for m in ("precision", "roc_auc"):
                order = sorted(data_free, key=lambda c: -table[s][c][m]["mean"])
                for r, c in enumerate(order):
                    ranks[c] += r / (2 * len(others))
        best = min(data_free, key=lambda c: ranks[c])
        out[held] = {"chosen": best, "mean_rank_elsewhere": ranks[best], **table[held][best]}
        print(
            f"leave-one-sweep-out -> {held:26s} chose {best!r}: {table[held][best]['precision']['mean']:.3f} / {table[held][best]['roc_auc']['mean']:.3f}"
        )
    return out


def family(sweep: str) -> str:
    """A sweep's architecture family (the model of its preset): lenet5, vgg11, resnet20, ..."""
    return str(PRESETS[sweep].model)


def auc_interval(y: np.ndarray, p: np.ndarray, n: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """ROC AUC and its 95 % bootstrap interval over the runs (ranks, ties counted half)."""
    from scipy.stats import rankdata

    def auc(yy: np.ndarray, pp: np.ndarray) -> np.ndarray:  # one AUC per row
        pos = yy.sum(1)
        r = rankdata(pp, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return ((r * yy).sum(1) - pos * (pos + 1) / 2) / (pos * (yy.shape[1] - pos))

    y, p = np.asarray(y, dtype=float), np.asarray(p, dtype=float)
    i = np.random.default_rng(seed).integers(0, len(y), (n, len(y)))
    draws = auc(y[i], p[i])
    draws = draws[np.isfinite(draws)]  # a draw with one class has no AUC
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return float(auc(y[None], p[None])[0]), float(lo), float(hi)


def transfer_views(f: dict, kmin: int) -> dict[str, np.ndarray]:
    """Architecture-free views of one sweep (the same columns for every network): the seed's
    features at the first ``kmin`` checkpoints, and a growth summary at the sweep's own k
    (25 % of training): smoothed statistics at k, their change since the first checkpoint,
    log lambda_1 at k and its growth since the first checkpoint."""
    import torch

    from dtg_gpu.features.temporal import temporal_features

    k = int(f["k"])
    raw, lam = f["stats_raw"], f["lam_raw"]
    smooth = temporal_features(torch.as_tensor(raw[:, :k]), 0.5).numpy().reshape(len(raw), k, 5)
    growth = np.hstack([smooth[:, -1], raw[:, k - 1] - raw[:, 0], lam[:, k - 1 : k], lam[:, k - 1 : k] - lam[:, :1]])
    return {"seed": f["spec"][:, : 5 * kmin], "growth": growth, "peer": lam[:, k - 1] - lam[:, 0]}


def transfer(feats: dict[str, dict]) -> dict:
    """Leave one *family* out: a logistic regression fitted on the sweeps of the other
    architecture families, scored (ROC AUC with a bootstrap interval) on each sweep of the
    held-out family, no run of that family seen. Inputs: the seed's features (pooled
    standardisation, or normal scores of the ranks within each sweep) and the growth summary
    (within-sweep ranks); plus the warm start's peer score alone (log lambda_1 growth, no
    training at all). A prior would ship only if its lower bound is above 0.5 on every sweep."""
    from scipy.stats import norm, rankdata
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    kmin = min(int(f["k"]) for f in feats.values())
    data = {}
    for name, f in feats.items():
        keep = f["usable"].astype(bool)
        views = {v: X[keep] for v, X in transfer_views(f, kmin).items()}
        y = label_runs(f["acc"][keep], "median")
        good = np.isfinite(views["seed"]).all(1) & np.isfinite(views["growth"]).all(1)
        data[name] = ({v: X[good] for v, X in views.items()}, y[good])

    def within(X):
        return norm.ppf((rankdata(X, axis=0) - 0.5) / X.shape[0])

    rows = {
        "seed features, standard": ("seed", False),
        "seed features, within-sweep ranks": ("seed", True),
        "growth summary, within-sweep ranks": ("growth", True),
    }
    out: dict[str, dict] = {}
    for held in data:
        fam = family(held)
        train = [n for n in data if family(n) != fam]
        row = {}
        for label, (view, ranks) in rows.items():
            Xtr = np.vstack([within(data[n][0][view]) if ranks else data[n][0][view] for n in train])
            ytr = np.concatenate([data[n][1] for n in train])
            Xte = within(data[held][0][view]) if ranks else data[held][0][view]
            sc = StandardScaler().fit(Xtr)
            clf = LogisticRegression(C=0.1, max_iter=5000).fit(sc.transform(Xtr), ytr)
            row[label] = auc_interval(data[held][1], clf.predict_proba(sc.transform(Xte))[:, 1])
        peer = data[held][0]["peer"]
        row["peer score alone (no training)"] = auc_interval(data[held][1], np.where(np.isfinite(peer), peer, -1e9))
        out[held] = {"family": fam, "trained_on": train, "auc": row}
        print(f"transfer -> {held:26s} " + "  ".join(f"{k}: {v[0]:.3f}" for k, v in row.items()), flush=True)
    ship = {label: all(r["auc"][label][1] > 0.5 for r in out.values()) for label in next(iter(out.values()))["auc"]}
    return {"k": kmin, "rows": out, "ship": ship}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="folder with one trained sweep per preset (ROOT/NAME)")
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--only", nargs="*", default=None, help="candidates whose name contains one of these")
    p.add_argument("--stem", default="prediction_suite", help="name of the results page (without .md / .json)")
    p.add_argument("--transfer", action="store_true", help="only the transfer table (transfer_suite.md)")
    p.add_argument(
        "--sweeps",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the sweep folders under --root to score (default: every preset of the suite); e.g. a held-out "
        "check sweep that no default was chosen on",
    )
    p.add_argument(
        "--fraction", type=float, default=0.25, help="k as a share of the checkpoints (default 0.25; 1: every one)"
    )
    a = p.parse_args(argv)
    root = Path(a.root)
    if not 0 < a.fraction <= 1:
        p.error(f"--fraction must be in (0, 1], got {a.fraction}")
    tag = "" if a.fraction == 0.25 else f"-f{a.fraction:g}"  # caches of other fractions beside the default's
    feats = {}
    for name in a.sweeps or SUITE:
        folder = root / name
        if (folder / "sweep.json").is_file():
            t = time.time()
            try:
                feats[name] = sweep_features(folder, root / f"{name}.features{tag}.npz", a.fraction)
            except Exception as exc:  # an unfinished sweep: named, left out
                print(f"{name}: left out ({exc})")
                continue
            print(
                f"{name}: {int(feats[name]['usable'].sum())} runs, k={int(feats[name]['k'])} of {int(feats[name]['T'])} ({time.time() - t:.0f} s)"
            )
    command = shlex.join(["python", "benchmarks/bench_suite.py", *(argv if argv is not None else sys.argv[1:])])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    if a.transfer:
        moved = transfer(feats)
        atomic_write(out / "transfer_suite.json", json.dumps({"date": stamp, **moved}, indent=1))
        atomic_write(out / "transfer_suite.md", transfer_markdown(moved, stamp, command))
        print(f"-> {out / 'transfer_suite.md'}")
        return
    cands = candidates()
    if a.only:
        cands = {n: c for n, c in cands.items() if any(o in n for o in a.only)}
    cache_file = root / f"scores-r{a.repeats}{tag}.json"  # (sweep, candidate) cells already scored
    cached = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    table: dict[str, dict[str, dict]] = {}
    for sweep, f in feats.items():
        table[sweep] = {}
        for cname, spec in cands.items():
            t = time.time()
            key = f"{sweep}|{cname}"
            if key not in cached:
                cached[key] = score(f, cname, spec, a.repeats)
                if cache_file.is_file():  # cells another run (another candidate) wrote meanwhile are kept
                    cached = {**json.loads(cache_file.read_text()), **cached}
                atomic_write(cache_file, json.dumps(cached))
            table[sweep][cname] = s = cached[key]
            print(
                f"{sweep:26s} {cname:42s} {s['precision']['mean']:.3f} / {s['roc_auc']['mean']:.3f}  ({time.time() - t:.0f} s)",
                flush=True,
            )
    chosen = leave_one_sweep_out(table)
    doc = {"date": stamp, "repeats": a.repeats, "fraction": a.fraction, "table": table, "leave_one_sweep_out": chosen}
    if a.only:
        doc["only"] = list(a.only)
    atomic_write(out / f"{a.stem}.json", json.dumps(doc, indent=1))
    atomic_write(out / f"{a.stem}.md", markdown(doc, feats, command))
    print(f"-> {out / f'{a.stem}.md'}")


if __name__ == "__main__":
    main()
