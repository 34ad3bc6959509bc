"""Prediction quality against baselines (issue #7): how early, how precise, better than what.

Two sweeps trained on the embedded digits data (8 learning rates x 4 dropouts x 3 seeds = 96
runs, 20 checkpoints each):
* ``lenet5``: LeNet-5, 20 epochs, a checkpoint each epoch (the default sweep of bench_sweep.py);
* ``vgg11n``: CIFAR-form VGG-11 at width 1/16 (no batch norm), 20 epochs, a checkpoint each
  epoch, learning rates 0.002 ... 0.1 (where it trains at all).

Feature sets: dtg, weight_stats, spectral (WeightWatcher alpha), dtg+weight_stats,
and options beyond SPEC: dtg+eigenvalue (log lambda_1 per timestep), dtg_per_layer (the
five statistics of each layer's nodes too) and both, and the data-using learning_curve; k in {1, 2, 3, 5, 10, 20}; labels at the sweep median and at a
fixed accuracy; 20 stratified 90/10 splits each. Then, on the first 25 % of checkpoints,
variations of the DTG pipeline that explain where it falls short (alpha, classifier capacity,
normalisation of the features, lambda_1, per-layer statistics, the predictor's feature scaling).

Usage: python benchmarks/bench_prediction.py [--quick] [--work DIR] [--out DIR] [--repeats 20]
       python benchmarks/bench_prediction.py --focus [--repeats 100] [--float64]   (the headline only)
       python benchmarks/bench_prediction.py --families [--repeats 100]   (across families, issue #19)
       python benchmarks/bench_prediction.py --suite --root ROOT [--repeats 100]   (the suite, issue #33)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dtg_gpu import SolverOptions  # noqa: E402
from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.features import temporal_features  # noqa: E402
from dtg_gpu.predictor import PerformancePredictor, label_runs  # noqa: E402
from dtg_gpu.predictor.evaluation import evaluate  # noqa: E402
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep  # noqa: E402
from dtg_gpu.workflow import compare, featurize_sweep  # noqa: E402

NAMES = [
    "dtg",
    "weight_stats",
    "spectral",
    "dtg+weight_stats",
    "dtg+eigenvalue",
    "dtg_per_layer",
    "dtg_per_layer+eigenvalue",
    "learning_curve",
]


def sweeps(quick: bool) -> dict[str, SweepConfig]:
    """The benchmark's plain-CNN sweeps: ``dtg sweep``'s presets (one seed with ``quick``)."""
    seeds = 1 if quick else 3
    return {
        "lenet5": SweepConfig.preset("lenet5-digits", seeds=seeds),
        "vgg11n": SweepConfig.preset("vgg11-digits", seeds=seeds),
    }


def _score(s: dict) -> dict:
    return {m: {k: s[m][k] for k in ("mean", "ci_low", "ci_high")} for m in ("precision", "roc_auc")}


def investigate(sf, k: int, threshold, repeats: int) -> list[dict]:
    """DTG at ``k`` under variations; the SPEC pipeline is the first row."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y = label_runs(sf.accuracies, threshold)
    spec = PerformancePredictor()
    rows = []

    def add(what, X, clf=spec):
        X = np.asarray(X, dtype=float)
        ok = np.isfinite(X).all(1)
        s = evaluate(clf, np.where(np.isfinite(X), X, np.nan), y, repeats=repeats)
        rows.append({"variant": what, "dims": int(X.shape[1]), "rows_nonfinite": int((~ok).sum()), **_score(s)})

    add("SPEC: alpha=0.5, MLP(32)", sf.dtg(k))
    for a in (0.2, 0.8, 1.0):
        add(f"alpha={a} (1.0 = no smoothing)", temporal_features(sf.stats[:, :k], a).double().numpy())
    add("last timestep only (5 features)", sf.dtg(k)[:, -5:])
    add("MLP(8)", sf.dtg(k), PerformancePredictor(hidden_sizes=(8,)))
    add("MLP(64, 64)", sf.dtg(k), PerformancePredictor(hidden_sizes=(64, 64)))
    add("logistic regression", sf.dtg(k), make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)))
    # normalisation: centrality of unit L2 norm (SPEC) -> statistics of sqrt(N)*c (unit mean square),
    # which only rescales mean/std/max; skew and kurtosis are scale-free.
    n = sf.runs[0].topology.num_nodes
    st = sf.stats[:, :k].clone()
    st[..., :3] *= n**0.5
    add("centrality scaled to unit mean square", temporal_features(st, sf.alpha).double().numpy())
    add("dtg + smoothed log lambda_1 (option eigenvalue=True)", sf.dtg(k, eigenvalue=True))
    add("smoothed log lambda_1 alone", temporal_features(sf.log_eigenvalue[:, :k, None], sf.alpha).double().numpy())
    add("per-layer statistics (option per_layer=True)", sf.dtg(k, per_layer=True))
    add("per-layer statistics + log lambda_1", sf.dtg(k, per_layer=True, eigenvalue=True))
    add(
        "per-layer statistics, alpha=1.0",
        temporal_features(torch.cat([sf.stats[:, :k], sf.layer_stats[:, :k]], -1), 1.0).double().numpy(),
    )
    add(
        "per-layer statistics, logistic regression",
        sf.dtg(k, per_layer=True),
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)),
    )
    quantile = PerformancePredictor(scaling="quantile")
    add("quantile scaling (option scaling='quantile')", sf.dtg(k), quantile)
    add("per-layer statistics, quantile scaling", sf.dtg(k, per_layer=True), quantile)
    add("per-layer statistics + log lambda_1, quantile scaling", sf.dtg(k, per_layer=True, eigenvalue=True), quantile)
    return rows


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(sw, th) for sw in results["sweeps"] for th in results["sweeps"][sw]["thresholds"]]
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.3 * len(panels)), constrained_layout=True, squeeze=False)
    for (sw, th), row in zip(panels, axes):
        rows = results["sweeps"][sw]["thresholds"][th]["rows"]
        for ax, metric in zip(row, ("precision", "roc_auc")):
            for name in NAMES:
                sel = sorted((r for r in rows if r["features"] == name), key=lambda r: r["k"])
                k = [r["k"] for r in sel]
                ax.plot(k, [r[metric]["mean"] for r in sel], marker="o", ms=3, label=name)
                ax.fill_between(k, [r[metric]["ci_low"] for r in sel], [r[metric]["ci_high"] for r in sel], alpha=0.12)
            ax.set_xscale("log")
            ax.set_xticks([1, 2, 3, 5, 10, 20], ["1", "2", "3", "5", "10", "20"])
            ax.set_ylim(0.0, 1.02)
            ax.grid(alpha=0.3)
            ax.set_xlabel("checkpoints used, k of 20")
            ax.set_ylabel(metric.replace("roc_auc", "ROC AUC"))
            ax.set_title(f"{sw}, label: {th} - {metric.replace('roc_auc', 'ROC AUC')} (95 % CI)", fontsize=10)
        row[0].legend(loc="lower right", fontsize=8)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def hyperparameter_oracle(runs, y) -> dict:
    """What knowing a run's exact hyper-parameters is worth: score each run by the share of
    sufficient runs among the other seeds of its (lr, dropout), leave-one-out. A predictor
    that only recovers the hyper-parameters from early weights cannot beat it; one that
    does has read something of the run itself."""
    from sklearn.metrics import precision_score, roc_auc_score

    keys = [(r.meta.get("lr"), r.meta.get("dropout")) for r in runs]
    y = np.asarray(y)
    score = np.array(
        [np.mean([y[j] for j in range(len(runs)) if keys[j] == keys[i] and j != i] or [0.5]) for i in range(len(runs))]
    )
    mixed = sum(len({int(y[j]) for j in range(len(runs)) if keys[j] == k}) > 1 for k in set(keys))
    return {
        "precision": float(precision_score(y, (score >= 0.5).astype(int), zero_division=0)),
        "roc_auc": float(roc_auc_score(y, score)),
        "configs": len(set(keys)),
        "configs_seeds_disagree": int(mixed),
    }


FOCUS = [
    "dtg",
    "dtg_per_layer",
    "dtg_per_layer+eigenvalue",
    "weight_stats",
    "spectral",
    "dtg+weight_stats",
    "learning_curve",
]


def focus(a) -> None:
    """The headline (k = 25 % of checkpoints, median label) with many splits, each feature set
    under both feature scalings of the predictor: ``standard`` (SPEC) and ``quantile`` (option),
    features solved in float32; ``--float64`` adds SPEC scaling on features solved in float64
    (whether float32 rounding of the centralities moves the predictor). All columns share the
    splits and the MLP seeds."""
    columns = [("standard", "float32"), ("quantile", "float32")] + ([("standard", "float64")] if a.float64 else [])
    label = {c: f"{c[0]} ({c[1]})" for c in columns}
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "repeats": a.repeats or 100,
        "columns": [label[c] for c in columns],
        "sweeps": {},
    }
    lines = [
        f"Median label, k = 25 % of checkpoints, {results['repeats']} stratified 90/10 splits; "
        "precision / AUC mean [95 % CI]. Columns: the predictor's feature scaling, `standard` "
        "(SPEC: mean and std of the training split) or `quantile` (option beyond SPEC: normal "
        "scores of the training ranks), and the dtype the centralities were solved in. "
        "All columns share the splits and MLP seeds.",
        "",
    ]
    for name, cfg in sweeps(a.quick).items():
        if a.only and name not in a.only:
            continue
        runs = load_sweep(run_sweep(cfg, Path(a.work) / name, progress=False))
        per_dtype = {
            dt: featurize_sweep(runs, alpha=0.5, solver=SolverOptions(dtype=getattr(torch, dt)))
            for dt in {c[1] for c in columns}
        }
        base = per_dtype["float32"]
        k = max(1, base.timesteps // 4)
        rows = []
        for fs in FOCUS:
            row = {"features": fs}
            for scaling, dt in columns:
                if fs in ("weight_stats", "spectral", "learning_curve") and dt == "float64":
                    row[label[scaling, dt]] = row[label[scaling, "float32"]]  # no centrality in these
                    continue
                r = compare(
                    per_dtype[dt],
                    [k],
                    [fs],
                    threshold="median",
                    repeats=results["repeats"],
                    clf=PerformancePredictor(scaling=scaling),
                )[0]
                row[label[scaling, dt]] = _score(r["scores"])
            rows.append(row)
            print(
                name,
                fs,
                {
                    c: (round(v["precision"]["mean"], 3), round(v["roc_auc"]["mean"], 3))
                    for c, v in row.items()
                    if c != "features"
                },
                flush=True,
            )
        oracle = hyperparameter_oracle(runs, label_runs(base.accuracies, "median"))
        results["sweeps"][name] = {"k": k, "rows": rows, "hyperparameter_oracle": oracle}
        lines += [
            f"### {name}, k = {k} of {base.timesteps}",
            "",
            f"Hyperparameter oracle (each run gets the share of sufficient runs among the other seeds "
            f"of its own lr and dropout; no features): precision {oracle['precision']:.3f}, AUC "
            f"{oracle['roc_auc']:.3f}; {oracle['configs_seeds_disagree']} of {oracle['configs']} "
            "configurations have seeds on both sides of the label.",
            "",
            "| features | " + " | ".join(f"precision, {label[c]} | AUC, {label[c]}" for c in columns) + " |",
            "|---|" + "---|---|" * len(columns),
        ]
        for row in rows:
            cells = [
                f"{row[label[c]][m]['mean']:.3f} [{row[label[c]][m]['ci_low']:.2f}, {row[label[c]][m]['ci_high']:.2f}]"
                for c in columns
                for m in ("precision", "roc_auc")
            ]
            lines.append(f"| {row['features']} | " + " | ".join(cells) + " |")
        lines.append("")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "prediction_focus.json", json.dumps(results, indent=2))
    atomic_write(out / "prediction_focus.md", "\n".join(lines))
    print("\n".join(lines))


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if "--suite" in args:  # every sweep of the suite (bench_suite.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_suite

        args.remove("--suite")
        return bench_suite.main(args)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one seed (32 runs a sweep), 5 splits")
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "dtg-bench-prediction"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--fixed", type=float, default=0.9, help="fixed accuracy threshold (default 0.9)")
    p.add_argument("--only", nargs="*", default=None, help="sweeps to run (default: all)")
    p.add_argument(
        "--focus",
        action="store_true",
        help="only the headline (k = 25 %%, median label) with 100 splits, standard and quantile scaling",
    )
    p.add_argument("--float64", action="store_true", help="with --focus: also features solved in float64")
    p.add_argument(
        "--families",
        action="store_true",
        help="the table across network families (bench_families.py): LeNet-5, VGG-11, ResNet-20 with batch norm",
    )
    p.add_argument("--threshold", type=float, default=0.9, help="with --families: the label's accuracy cut")
    p.add_argument("--jobs", type=int, default=2, help="with --families: evaluations run in parallel")
    p.add_argument("--cross-repeats", type=int, default=20, help="with --families: MLP seeds of the cross-sweep check")
    p.add_argument(
        "--smooth-label",
        action="store_true",
        help="with --families: only the ResNet check with the label from the last three validation accuracies",
    )
    a = p.parse_args(argv)
    if a.families:
        import bench_families

        return bench_families.smooth_label(a) if a.smooth_label else bench_families.run(a)
    if a.focus:
        return focus(a)
    repeats = a.repeats or (5 if a.quick else 20)
    ks = [1, 2, 3, 5, 10, 20]
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": repeats, "ks": ks, "sweeps": {}}
    for name, cfg in sweeps(a.quick).items():
        if a.only and name not in a.only:
            continue
        t0 = time.perf_counter()
        folder = run_sweep(cfg, Path(a.work) / name, progress=False)
        trained = time.perf_counter() - t0
        runs = load_sweep(folder)
        t0 = time.perf_counter()
        sf = featurize_sweep(runs, alpha=0.5)
        featurised = time.perf_counter() - t0
        acc = sf.accuracies
        entry = {
            "runs": len(runs),
            "timesteps": sf.timesteps,
            "train_s": round(trained, 1),
            "featurize_s": round(featurised, 1),
            "final_accuracy": {
                "min": float(np.nanmin(acc)),
                "median": float(np.nanmedian(acc)),
                "max": float(np.nanmax(acc)),
            },
            "diverged": int(sum(r.meta.get("status") == "diverged" for r in runs)),
            "thresholds": {},
        }
        for th in ("median", a.fixed):
            y = label_runs(acc, th)
            t0 = time.perf_counter()
            rows = compare(sf, ks, NAMES, threshold=th, repeats=repeats)
            entry["thresholds"][str(th)] = {
                "positives": int((y == 1).sum()),
                "negatives": int((y == 0).sum()),
                "rows": [{"features": r["features"], "k": r["k"], **_score(r["scores"])} for r in rows],
                "evaluate_s": round(time.perf_counter() - t0, 1),
            }
            print(f"{name} threshold={th}: {int((y == 1).sum())} sufficient of {len(y)}", flush=True)
            for r in rows:
                s = r["scores"]
                print(
                    f"  {r['features']:<18} k={r['k']:<3} precision {s['precision']['mean']:.3f} "
                    f"AUC {s['roc_auc']['mean']:.3f}",
                    flush=True,
                )
        k25 = max(1, sf.timesteps // 4)
        entry["investigation"] = {"k": k25, "threshold": "median", "rows": investigate(sf, k25, "median", repeats)}
        for r in entry["investigation"]["rows"]:
            print(
                f"  [k={k25}] {r['variant']:<42} precision {r['precision']['mean']:.3f} AUC {r['roc_auc']['mean']:.3f}",
                flush=True,
            )
        results["sweeps"][name] = entry
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "prediction" + ("_quick" if a.quick else "")
    atomic_write(out / f"{stem}.json", json.dumps(results, indent=2))
    plot(results, out / f"{stem}_vs_k.png")
    lines = []
    for sw, e in results["sweeps"].items():
        for th, t in e["thresholds"].items():
            lines += [
                f"### {sw}, label: final accuracy >= {th} ({t['positives']} of {e['runs']} runs sufficient)",
                "",
                "| features | " + " | ".join(f"k={k}" for k in ks) + " |",
                "|---|" + "---|" * len(ks),
            ]
            for fs in NAMES:
                cells = []
                for k in ks:
                    r = next(r for r in t["rows"] if r["features"] == fs and r["k"] == k)
                    cells.append(f"{r['precision']['mean']:.2f} / {r['roc_auc']['mean']:.2f}")
                lines.append(f"| {fs} | " + " | ".join(cells) + " |")
            lines.append("")
        inv = e["investigation"]
        lines += [
            f"### {sw}: DTG variants at k={inv['k']} (first 25 %), median label",
            "",
            "| variant | dims | precision [95 % CI] | AUC [95 % CI] |",
            "|---|---|---|---|",
        ]
        for r in inv["rows"]:
            pr, au = r["precision"], r["roc_auc"]
            lines.append(
                f"| {r['variant']} | {r['dims']} | {pr['mean']:.3f} [{pr['ci_low']:.2f}, {pr['ci_high']:.2f}] "
                f"| {au['mean']:.3f} [{au['ci_low']:.2f}, {au['ci_high']:.2f}] |"
            )
        lines.append("")
    atomic_write(out / f"{stem}.md", "cells: precision / AUC, mean over stratified 90/10 splits\n\n" + "\n".join(lines))
    print(f"wrote {out / stem}.json, .md, _vs_k.png")


if __name__ == "__main__":
    main()
