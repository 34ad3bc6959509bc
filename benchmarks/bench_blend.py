"""Issue #33: does a *learned* combination of the default's two feature sets beat their plain average?

The default predictor gives each feature set (the DTG statistics per layer with log lambda_1
and batch norm folded; the weight statistics) a logistic regression of its own and averages
their probabilities with equal weights. Here the weight is learned, on the training split
only, three ways: the weight w in {0, 1/4, 1/2, 3/4, 1} with the least out-of-fold log loss
(5 inner folds), the same with the largest out-of-fold AUC, and a logistic regression
stacked on the out-of-fold logits. Beside them: each set alone, the equal average (the
default's rule) and the average of logits. Every row reads the same 100 stratified 90/10
splits; the models are scikit-learn's LR on quantile-normalised columns (the proxy of
``bench_suite.py``'s "LR(q)" rows), so the rows differ only in how the two are combined.

Usage: python benchmarks/bench_blend.py --root ROOT [--repeats 100] [--out benchmarks/results]
(ROOT: the trained suite, as for bench_suite.py; its .features.npz caches are reused.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_suite import lr_q, sweep_features  # noqa: E402

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.predictor import label_runs  # noqa: E402
from dtg_gpu.predictor.evaluation import summarize  # noqa: E402
from dtg_gpu.predictor.labels import split_runs  # noqa: E402
from dtg_gpu.sweeps.config import SUITE  # noqa: E402

WEIGHTS = np.linspace(0.0, 1.0, 5)
ROWS = (
    "DTG per layer+lam folded alone",
    "weight statistics alone",
    "equal average (the default's rule)",
    "average of logits",
    "weight by inner CV, log loss",
    "weight by inner CV, AUC",
    "stacked LR on out-of-fold logits",
)


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def out_of_fold(blocks: list[np.ndarray], y: np.ndarray, folds: int = 5, seed: int = 0) -> np.ndarray:
    """`[blocks, rows]`: each block's probability for each training row from a model that did not see it."""
    from sklearn.model_selection import StratifiedKFold

    P = np.zeros((len(blocks), y.size))
    for tr, te in StratifiedKFold(folds, shuffle=True, random_state=seed).split(blocks[0], y):
        for i, B in enumerate(blocks):
            P[i, te] = lr_q().fit(B[tr], y[tr]).predict_proba(B[te])[:, 1]
    return P


def choose_weight(O: np.ndarray, y: np.ndarray, by: str) -> float:
    """The weight of block 0 in `w p0 + (1 - w) p1` that scores best out of fold (ties: the first)."""
    from sklearn.metrics import log_loss, roc_auc_score

    if by == "log_loss":
        scores = [-log_loss(y, w * O[0] + (1 - w) * O[1], labels=[0, 1]) for w in WEIGHTS]
    else:
        scores = [roc_auc_score(y, w * O[0] + (1 - w) * O[1]) for w in WEIGHTS]
    return float(WEIGHTS[int(np.argmax(scores))])


def combine(blocks: list[np.ndarray], y: np.ndarray, train: np.ndarray, test: np.ndarray, seed: int) -> dict:
    """Every row's probabilities on `test`, fitted on `train`; also the weights chosen."""
    from sklearn.linear_model import LogisticRegression

    P = np.array([lr_q().fit(B[train], y[train]).predict_proba(B[test])[:, 1] for B in blocks])
    O = out_of_fold([B[train] for B in blocks], y[train], seed=seed)
    w_ll, w_auc = choose_weight(O, y[train], "log_loss"), choose_weight(O, y[train], "auc")
    stack = LogisticRegression(C=1.0).fit(logit(O).T, y[train])
    probs = dict(
        zip(
            ROWS,
            (
                P[0],
                P[1],
                P.mean(0),
                1 / (1 + np.exp(-logit(P).mean(0))),
                w_ll * P[0] + (1 - w_ll) * P[1],
                w_auc * P[0] + (1 - w_auc) * P[1],
                stack.predict_proba(logit(P).T)[:, 1],
            ),
        )
    )
    return {"probs": probs, "w_log_loss": w_ll, "w_auc": w_auc}


def score_sweep(f: dict, repeats: int) -> dict:
    from sklearn.metrics import precision_score, recall_score, roc_auc_score

    keep = f["usable"].astype(bool)
    y = label_runs(f["acc"][keep], "median").astype(int)
    blocks = [f["layer_lam_folded"][keep], f["ws"][keep]]
    good = np.all([np.isfinite(B).all(1) for B in blocks], axis=0)
    blocks = [np.where(good[:, None], B, 0.0) for B in blocks]  # diverged: insufficient by rule, below
    vals: dict[str, dict[str, list]] = {r: {"precision": [], "recall": [], "roc_auc": []} for r in ROWS}
    weights: dict[str, list] = {"w_log_loss": [], "w_auc": []}
    for r in range(repeats):
        train, test = split_runs(y, test_size=0.1, seed=r)
        out = combine(blocks, y, train, test, seed=r)
        for k in weights:
            weights[k].append(out[k])
        for row, p in out["probs"].items():
            p = np.where(good[test], p, 0.0)
            vals[row]["precision"].append(precision_score(y[test], p > 0.5, zero_division=0))
            vals[row]["recall"].append(recall_score(y[test], p > 0.5, zero_division=0))
            vals[row]["roc_auc"].append(roc_auc_score(y[test], p))
    table = {
        row: {m: {k: v for k, v in summarize(x).items() if k != "values"} for m, x in ms.items()}
        for row, ms in vals.items()
    }
    return {"table": table, "weight_mean": {k: float(np.mean(v)) for k, v in weights.items()}}


def markdown(doc: dict, command: str) -> str:
    sweeps = list(doc["sweeps"])
    lines = [
        "# A learned combination of the default's feature sets",
        "",
        f"`{command}` ({doc['date']}, {doc['repeats']} stratified 90/10 splits per sweep, the same for every row;"
        " label: final accuracy >= the sweep median; k = 25 % of the checkpoints). Each cell: precision / recall /"
        " ROC AUC of the sufficient class, mean over the splits (95 % intervals in the .json). The sweeps are the"
        " suite's presets retrained on this machine (not bit-identical to those of prediction_suite.md).",
        "",
        "| row | " + " | ".join(sweeps) + " |",
        "|---|" + "---|" * len(sweeps),
    ]
    for row in ROWS:
        cells = []
        for s in sweeps:
            t = doc["sweeps"][s]["table"][row]
            cells.append(f"{t['precision']['mean']:.3f} / {t['recall']['mean']:.3f} / {t['roc_auc']['mean']:.3f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += [
        "| mean weight of the DTG set, log loss / AUC | "
        + " | ".join(
            f"{doc['sweeps'][s]['weight_mean']['w_log_loss']:.2f} / {doc['sweeps'][s]['weight_mean']['w_auc']:.2f}"
            for s in sweeps
        )
        + " |",
        "",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    root = Path(a.root)
    doc: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": a.repeats, "sweeps": {}}
    for name in SUITE:
        if not (root / name / "sweep.json").is_file():
            continue
        t = time.time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                f = sweep_features(root / name, root / f"{name}.features.npz")
            except Exception as exc:  # an unfinished sweep: named, left out
                print(f"{name}: left out ({exc})")
                continue
            doc["sweeps"][name] = score_sweep(f, a.repeats)
        rows = doc["sweeps"][name]["table"]
        print(name, f"({time.time() - t:.0f} s)", flush=True)
        for row in ROWS:
            print(f"  {row:38s} {rows[row]['precision']['mean']:.3f} / {rows[row]['roc_auc']['mean']:.3f}", flush=True)
    command = " ".join(["python benchmarks/bench_blend.py", *(argv if argv is not None else sys.argv[1:])])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "prediction_blend.json", json.dumps(doc, indent=1))
    atomic_write(out / "prediction_blend.md", markdown(doc, command))
    print(f"-> {out / 'prediction_blend.md'}")


if __name__ == "__main__":
    main()
