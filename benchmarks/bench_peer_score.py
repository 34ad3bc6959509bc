"""Which per-checkpoint score should the warm-start pruner compare peers on? Checked leave one
sweep out on the suite's recorded checkpoints.

The warm start (``StoppingRule(warm_start=True)``) ranks a run among its peers at the same
checkpoint by ``dtg_gpu.early_stopping.peer_score``: the growth of the graph's log λ₁ since the
first checkpoint. That score was first screened on all eight suite sweeps together. This script
repeats the screening leave one sweep out: for each sweep, the candidate with the best mean
criterion on the other seven is chosen and scored on the held-out sweep.

Criteria, per sweep: *best-run floor*, the lowest percentile of the sweep's best run among all
runs over the checkpoints k = 2 … T − 1 (a run is stopped when it ranks low, so a high floor
protects the best run); *AUC*, the ROC AUC of the score at k = 25 % of the checkpoints against
the median label.

    python benchmarks/bench_peer_score.py --work /root/dtg-es   # records cached by bench_early_stopping --suite
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from dtg_gpu.core.files import atomic_write
from dtg_gpu.early_stopping import peer_score
from dtg_gpu.sweeps.config import SUITE

RESULTS = Path(__file__).resolve().parent / "results"


def _arr(x) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in x], float)


def _log_eig(rec) -> float:
    v = rec.get("log_eigenvalue")
    return np.nan if v is None else float(v)


CANDIDATES = {
    "log λ₁ growth since the first checkpoint (shipped)": lambda recs, k: peer_score(recs, k),
    "log λ₁ change since the previous checkpoint": lambda recs, k: _log_eig(recs[k - 1]) - _log_eig(recs[k - 2]),
    "mean log growth of the weights' std": lambda recs, k: float(
        np.nanmean(
            np.log(
                _arr(recs[k - 1]["weight_stats"]).reshape(-1, 7)[:, 1]
                / _arr(recs[0]["weight_stats"]).reshape(-1, 7)[:, 1]
            )
        )
    ),
    "last layer's mean centrality": lambda recs, k: _arr(recs[k - 1]["per_layer"]).reshape(-1, 5)[-1, 0],
    "last layer's median centrality": lambda recs, k: _arr(recs[k - 1]["per_layer"]).reshape(-1, 5)[-1, 2],
}


def _score(runs, k, fn) -> np.ndarray:
    x = np.array([np.nan if (v := fn(r["records"], k)) is None else v for r in runs], float)
    return np.where(np.isfinite(x), x, -np.inf)


def criteria(runs) -> dict[str, tuple[float, float]]:
    fin = np.array([r["final"] for r in runs], float)
    best = int(np.argmax(fin))
    T = min(len(r["records"]) for r in runs)
    y = (fin >= np.median(fin)).astype(int)
    out = {}
    for name, fn in CANDIDATES.items():
        floor = min((rankdata(_score(runs, k, fn))[best] - 1) / (len(runs) - 1) for k in range(2, T))
        x = _score(runs, max(2, T // 4), fn)
        auc = roc_auc_score(y, np.where(np.isfinite(x), x, np.nanmin(x[np.isfinite(x)]) - 1))
        out[name] = (float(floor), float(auc))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--work", required=True, help="folder of records-v2-<sweep>.json (bench_early_stopping --suite --work)"
    )
    args = ap.parse_args()
    table = {}
    for name in SUITE:
        data = json.loads((Path(args.work) / f"records-v2-{name}.json").read_text())
        table[name] = criteria(data["runs"])
    lines = [
        "# The warm start's peer score, leave one sweep out",
        "",
        f"`python benchmarks/bench_peer_score.py --work WORK` ({time.strftime('%Y-%m-%d %H:%M')}). Each cell: "
        "best-run floor (lowest percentile of the sweep's best run among all runs over k = 2 … T − 1) / "
        "ROC AUC of the score at k = 25 % against the median label.",
        "",
        "| candidate | " + " | ".join(table) + " |",
        "|---|" + "---|" * len(table),
    ]
    for cand in CANDIDATES:
        lines.append(
            f"| {cand} | " + " | ".join(f"{table[s][cand][0]:.2f} / {table[s][cand][1]:.2f}" for s in table) + " |"
        )
    lines += [
        "",
        "## Chosen on the other seven sweeps (mean floor, then mean AUC)",
        "",
        "| held-out sweep | chosen | floor / AUC there | shipped score there |",
        "|---|---|---|---|",
    ]
    same = 0
    shipped = next(iter(CANDIDATES))
    for held in table:
        others = [s for s in table if s != held]
        chosen = max(
            CANDIDATES,
            key=lambda c: (np.mean([table[s][c][0] for s in others]), np.mean([table[s][c][1] for s in others])),
        )
        same += chosen == shipped
        f, a = table[held][chosen]
        fs, as_ = table[held][shipped]
        lines.append(f"| {held} | {chosen} | {f:.2f} / {a:.2f} | {fs:.2f} / {as_:.2f} |")
    lines += ["", f"The shipped score is chosen on {same} of {len(table)} folds."]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    atomic_write(RESULTS / "peer_score_loso.md", text)
    atomic_write(RESULTS / "peer_score_loso.json", json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
