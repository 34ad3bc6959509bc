"""How much do a sweep's first checkpoints say about its final accuracy? The data-free pruner's
online model (standardised L2 logistic regression, C = 1, on ``dtg_per_layer`` records) fitted
on all of a sweep's runs, scored by 10-fold cross-validation at each checkpoint k.

An upper bound on what the pruner sees in a study (it learns from the runs finished so far):
where the cross-validated AUC at k = 1 is near chance, a cut at the first checkpoint is a guess.
Also the best run's cross-validated probability at each k (the pruner stops a run below 0.3).

    python benchmarks/bench_early_signal.py --work /root/es-work   # records cached by bench_early_stopping --suite
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

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.early_stopping.records import feature_vector  # noqa: E402
from dtg_gpu.sweeps.config import SUITE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
KS = (1, 2, 3, 4, 6, 8)


def signal(runs: list[dict], ks=KS) -> dict[int, tuple[float, float]]:
    """k -> (cross-validated AUC against the median label, the best run's probability)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    fin = np.array([r["final"] for r in runs], float)
    y = (fin >= np.median(fin)).astype(int)
    best = int(np.argmax(fin))
    T = min(len(r["records"]) for r in runs)
    out = {}
    for k in (k for k in ks if k <= T):
        X = np.stack([feature_vector(r["records"], k, "dtg_per_layer", 0.5, None, False) for r in runs])
        ok = np.isfinite(X).all(axis=1)
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        p = np.full(len(runs), np.nan)
        cv = StratifiedKFold(10, shuffle=True, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p[ok] = cross_val_predict(clf, X[ok], y[ok], cv=cv, method="predict_proba")[:, 1]
        out[k] = (float(roc_auc_score(y[ok], p[ok])), float(p[best]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--work", required=True, help="folder of records-v2-<sweep>.json (bench_early_stopping --suite --work)"
    )
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    table = {}
    for name in SUITE:
        path = Path(args.work) / f"records-v2-{name}.json"
        if path.is_file():
            table[name] = signal(json.loads(path.read_text())["runs"])
    lines = [
        "# What the first checkpoints say: the pruner's online model, cross-validated on whole sweeps",
        "",
        f"`python benchmarks/bench_early_signal.py --work WORK` ({time.strftime('%Y-%m-%d %H:%M')}; "
        f"the sweeps whose records are in WORK, {len(table)} here). Each cell: 10-fold cross-validated "
        "ROC AUC against the median label / the best run's cross-validated probability, the data-free "
        "pruner's features and model fitted on all 96 runs (an upper bound on what it knows in a study).",
        "",
        "| sweep | " + " | ".join(f"k = {k}" for k in KS) + " |",
        "|---|" + "---|" * len(KS),
    ]
    for name, row in table.items():
        cells = [f"{row[k][0]:.2f} / {row[k][1]:.2f}" if k in row else "–" for k in KS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "early_signal.md", text)
    atomic_write(
        out / "early_signal.json", json.dumps({s: {str(k): v for k, v in r.items()} for s, r in table.items()})
    )


if __name__ == "__main__":
    main()
