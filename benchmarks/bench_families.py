"""Prediction across network families (issue #19): the same table for every sweep.

Sweeps (``dtg sweep --preset NAME``; 96 runs each on the embedded digits data):
``lenet5`` (lenet5-digits), ``vgg11n`` (vgg11-digits: plain VGG-11 at width 1/16) and
``resnet20bn`` (resnet20-digits: CIFAR ResNet-20 at width 4 with batch norm, SGD + momentum
0.9 + weight decay 5e-4, 16 epochs). Label: final accuracy >= ``--threshold`` (default 0.9).

Rows (every one a ``PerformancePredictor`` with the library's defaults unless named):
* ``dtg`` (the method), ``dtg_per_layer``, ``dtg_per_layer+eigenvalue`` (options);
* ``... [fold]``: the same with batch norm folded into the edges (``fold_batchnorm=True``;
  only on sweeps with batch norm: elsewhere the features are identical);
* ``... +cov``: with the known hyper-parameters ``lr`` (log10) and ``dropout`` appended;
* baselines: ``weight_stats``, ``weight_stats+cov``, ``spectral``; the data-using
  ``learning_curve``; ``covariates`` (an MLP on lr and dropout alone: the hyper-parameter
  oracle as features) and the leave-one-out hyper-parameter oracle of bench_prediction.py;
* ``auto`` (at the headline k, 25 % of the checkpoints, only: it costs ~37 fits a split):
  ``PerformancePredictor(auto=True)`` choosing, inside each training split, among the
  column sets ``dtg``, ``dtg_per_layer+eigenvalue [fold]`` and the latter ``+cov``, with
  both scalings and select in {all, 5}.
k in {1, 2, 3, 5, 10, all} and the headline k; ``--repeats`` stratified 90/10 splits (100),
shared by every row. Then the cross-sweep check: predictors fitted on ``resnet20bn``,
tested on ``resnet20bn-grid2`` (the same architecture and recipe, another grid: other
learning rates and dropouts, 48 runs), and the reverse, against the in-sweep numbers.

``--only resnet20bn-cosine`` runs the table on a variant of ``resnet20bn`` trained with a
cosine learning-rate schedule (``lr_schedule="cosine"``), not part of the default set.

Usage: python benchmarks/bench_prediction.py --families [--repeats 100] [--work DIR] [--jobs 2]
       [--only NAME ...] [--out DIR]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from dtg_gpu.core.files import atomic_write
from dtg_gpu.predictor import PerformancePredictor, label_runs
from dtg_gpu.predictor.evaluation import evaluate
from dtg_gpu.sweeps import PRESETS, SweepConfig, load_sweep, run_sweep
from dtg_gpu.workflow import feature_sets, featurize_sweep

SWEEPS = {"lenet5": "lenet5-digits", "vgg11n": "vgg11-digits", "resnet20bn": "resnet20-digits"}
CROSS = ("resnet20bn", "resnet20bn-grid2")
GRID2 = dict(lrs=(0.003, 0.007, 0.015, 0.03, 0.07, 0.15, 0.3, 0.7), dropouts=(0.1, 0.4), seeds=3)
# the same ResNet sweep with a cosine learning-rate schedule (run with --only resnet20bn-cosine)
VARIANTS = {"resnet20bn-cosine": ("resnet20-digits", dict(lr_schedule="cosine"))}
COV = ("lr", "dropout")


def _has_batchnorm(sf) -> bool:
    return any(layer.batchnorm is not None for layer in sf.runs[0].topology.layers)


def matrices(sf, sff, k: int) -> dict[str, np.ndarray]:
    """Every row's feature matrix at ``k`` (``sff``: batch norm folded, or None). Each
    baseline is computed once (the weight statistics read every run's checkpoint); the
    ``+cov`` rows append the covariate columns to it."""
    fold = " [fold]" if sff is not None else ""
    dtg = feature_sets(sf, k, ["dtg", "dtg_per_layer", "dtg_per_layer+eigenvalue"])
    folded = feature_sets(sff, k, ["dtg", "dtg_per_layer+eigenvalue"]) if sff is not None else {}
    base = feature_sets(sf, k, ["weight_stats", "spectral", "learning_curve", "covariates"])
    cov = base["covariates"]
    per = folded.get("dtg_per_layer+eigenvalue", dtg["dtg_per_layer+eigenvalue"])
    return {
        **dtg,
        **{f"{name} [fold]": X for name, X in folded.items()},
        "dtg+cov": np.hstack([dtg["dtg"], cov]),
        f"dtg_per_layer+eigenvalue+cov{fold}": np.hstack([per, cov]),
        "weight_stats": base["weight_stats"],
        "weight_stats+cov": np.hstack([base["weight_stats"], cov]),
        "spectral": base["spectral"],
        "learning_curve": base["learning_curve"],
        "covariates": cov,
    }


def auto_inputs(m: dict[str, np.ndarray], folded: bool) -> tuple[np.ndarray, dict[str, list[int]]]:
    """One matrix and the column sets ``auto`` chooses among, from :func:`matrices`' ``m``."""
    fold = " [fold]" if folded else ""
    dtg, per, cov = m["dtg"], m[f"dtg_per_layer+eigenvalue{fold}"], m["covariates"]
    a, b = dtg.shape[1], per.shape[1]
    sets = {
        "dtg": list(range(a)),
        f"dtg_per_layer+eigenvalue{fold}": list(range(a, a + b)),
        f"dtg_per_layer+eigenvalue+cov{fold}": list(range(a, a + b + cov.shape[1])),
    }
    return np.hstack([dtg, per, cov]), sets


def label_noise(runs, threshold: float) -> dict:
    """How much of the label the last epochs decide: for each of the last 5 checkpoints, how
    often "validation accuracy there >= threshold" agrees with the label (final test accuracy
    >= threshold); the mean epoch-to-epoch change of validation accuracy over the last 3; and
    the spread of final accuracy across the seeds of one configuration."""
    from collections import defaultdict

    val = np.array([[c.get("val_accuracy", np.nan) for c in r.meta.get("checkpoints", [])] for r in runs], dtype=float)
    final = np.array([r.final_accuracy if r.final_accuracy is not None else np.nan for r in runs], dtype=float)
    y = final >= threshold
    T = val.shape[1]
    agree = {int(t + 1): float(np.mean((val[:, t] >= threshold) == y)) for t in range(max(0, T - 5), T)}
    seeds = defaultdict(list)
    for r, f in zip(runs, final):
        seeds[(r.meta.get("lr"), r.meta.get("dropout"))].append(f)
    return {
        "val_label_agreement": agree,
        "last_epochs_mean_abs_change": float(np.nanmean(np.abs(np.diff(val[:, -4:], axis=1)))),
        "seed_std_of_final_accuracy": float(np.nanmean([np.nanstd(v) for v in seeds.values()])),
    }


def _score(s: dict) -> dict:
    return {m: {q: s[m][q] for q in ("mean", "ci_low", "ci_high")} for m in ("precision", "roc_auc")}


def _job(name: str, k: int, clf, X: np.ndarray, y: np.ndarray, repeats: int) -> tuple:
    t0 = time.perf_counter()
    s = evaluate(clf, X, y, repeats=repeats)
    return name, k, _score(s), round(time.perf_counter() - t0, 1)


def _load(name: str, work: Path):
    if name in SWEEPS:
        cfg = PRESETS[SWEEPS[name]]
    elif name in VARIANTS:
        cfg = SweepConfig.preset(VARIANTS[name][0], **VARIANTS[name][1])
    else:
        cfg = SweepConfig.preset("resnet20-digits", **GRID2)
    return load_sweep(run_sweep(cfg, work / name, progress=False))


def cross_sweep(sfs: dict, ks: list[int], threshold: float, repeats: int) -> list[dict]:
    """Fit on all of one sweep, test on all of the other (``repeats`` MLP seeds)."""
    from sklearn.metrics import precision_score, roc_auc_score

    rows = []
    for src, dst in (CROSS, CROSS[::-1]):
        (a, af), (b, bf) = sfs[src], sfs[dst]
        ya, yb = label_runs(a.accuracies[a.usable], threshold), label_runs(b.accuracies[b.usable], threshold)
        for k in ks:
            ma, mb = matrices(a, af, k), matrices(b, bf, k)
            for name in ma:
                if name == "learning_curve":
                    continue
                p, auc = [], []
                for seed in range(repeats):
                    clf = PerformancePredictor(random_state=seed).fit(ma[name][a.usable], ya)
                    pr = clf.predict_proba(mb[name][b.usable])[:, 1]
                    p.append(precision_score(yb, (pr >= 0.5).astype(int), zero_division=0))
                    auc.append(roc_auc_score(yb, pr))
                rows.append(
                    {
                        "train": src,
                        "test": dst,
                        "k": k,
                        "features": name,
                        "precision": float(np.mean(p)),
                        "roc_auc": float(np.mean(auc)),
                    }
                )
                print(f"cross {src}->{dst} k={k} {name}: {np.mean(p):.3f} / {np.mean(auc):.3f}", flush=True)
    return rows


def run(a) -> None:
    from bench_prediction import hyperparameter_oracle
    from joblib import Parallel, delayed

    work, repeats, th = Path(a.work), a.repeats or 100, a.threshold
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": repeats, "threshold": th, "sweeps": {}}
    sfs = {}
    for name in list(SWEEPS) + [CROSS[1]] + list(VARIANTS):
        if (a.only and name not in a.only) or (name in VARIANTS and not (a.only and name in a.only)):
            continue
        runs = _load(name, work)
        sf = featurize_sweep(runs)
        sfs[name] = (sf, featurize_sweep(runs, fold_batchnorm=True) if _has_batchnorm(sf) else None)
    jobs, meta = [], {}
    for name in list(SWEEPS) + list(VARIANTS):
        if name not in sfs:
            continue
        sf, sff = sfs[name]
        T = sf.timesteps
        k25 = max(1, T // 4)
        ks = sorted({1, 2, 3, 5, 10, T, k25} & set(range(1, T + 1)))
        y = label_runs(sf.accuracies[sf.usable], th)
        ok = [r for r, u in zip(sf.runs, sf.usable) if u]
        meta[name] = {
            "runs": len(sf.runs),
            "timesteps": T,
            "k25": k25,
            "ks": ks,
            "positives": int(y.sum()),
            "batchnorm": sff is not None,
            "hyperparameter_oracle": hyperparameter_oracle(ok, y),
            "label_noise": label_noise(ok, th),
        }
        for k in ks:
            m = matrices(sf, sff, k)
            for row, X in m.items():
                jobs.append((name, row, k, PerformancePredictor(), X[sf.usable], y))
            if k == k25:  # not X: the loop above rebinds it for every row and k
                X_auto, sets = auto_inputs(m, sff is not None)
        jobs.append((name, "auto", k25, PerformancePredictor(auto=True, column_sets=sets), X_auto[sf.usable], y))
    t0 = time.perf_counter()
    done = Parallel(n_jobs=a.jobs, verbose=0)(
        delayed(_job)(f"{sw}|{row}", k, clf, X, y, repeats) for sw, row, k, clf, X, y in jobs
    )
    for key, k, score, secs in done:
        sw, row = key.split("|", 1)
        meta[sw].setdefault("rows", []).append({"features": row, "k": k, **score, "seconds": secs})
    results["sweeps"] = meta
    results["evaluate_s"] = round(time.perf_counter() - t0, 1)
    if all(n in sfs for n in CROSS):
        T = sfs[CROSS[0]][0].timesteps
        results["cross_sweep"] = cross_sweep(sfs, [max(1, T // 4), T], th, repeats=a.cross_repeats)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "prediction_families.json", json.dumps(results, indent=2))
    atomic_write(out / "prediction_families.md", markdown(results))
    print(markdown(results))


def smooth_label(a) -> None:
    """Is the label the limit? On ``resnet20bn``, label each run by the mean validation
    accuracy of its last three checkpoints (>= ``--threshold``) instead of the final test
    accuracy, and score the headline rows again at 25 % of the checkpoints."""
    from joblib import Parallel, delayed

    runs = _load("resnet20bn", Path(a.work))
    sf, sff = featurize_sweep(runs), featurize_sweep(runs, fold_batchnorm=True)
    val = np.array([[c["val_accuracy"] for c in r.meta["checkpoints"]] for r in sf.runs], dtype=float)
    y = (val[:, -3:].mean(1) >= a.threshold).astype(int)
    k = max(1, sf.timesteps // 4)
    rows = {
        name: X
        for name, X in matrices(sf, sff, k).items()
        if name in ("dtg", "dtg_per_layer+eigenvalue [fold]", "weight_stats", "learning_curve", "covariates")
    }
    repeats = a.repeats or 100
    done = Parallel(n_jobs=a.jobs)(
        delayed(_job)(name, k, PerformancePredictor(), X, y, repeats) for name, X in rows.items()
    )
    lines = [
        f"resnet20bn, label: mean validation accuracy of the last three checkpoints >= {a.threshold} "
        f"({int(y.sum())} of {len(y)} runs sufficient), k = {k}, {repeats} stratified 90/10 splits. "
        "Written by `benchmarks/bench_prediction.py --families --smooth-label`.",
        "",
        "| features | precision | AUC |",
        "|---|---|---|",
    ]
    for name, _, s, _ in done:
        p, au = s["precision"], s["roc_auc"]
        lines.append(
            f"| {name} | {p['mean']:.3f} [{p['ci_low']:.2f}, {p['ci_high']:.2f}] | "
            f"{au['mean']:.3f} [{au['ci_low']:.2f}, {au['ci_high']:.2f}] |"
        )
    out = Path(a.out)
    atomic_write(out / "prediction_families_smooth_label.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def markdown(results: dict) -> str:
    th = results["threshold"]
    lines = [
        f"Label: final accuracy >= {th}. Cells: precision / AUC of the sufficient class, mean over "
        f"{results['repeats']} stratified 90/10 splits shared by every row; the headline column (25 % of "
        "the checkpoints) also gives 95 % intervals below. Written by `benchmarks/bench_prediction.py "
        "--families`.",
        "",
    ]
    for sw, e in results["sweeps"].items():
        ks = e["ks"]
        o = e["hyperparameter_oracle"]
        lines += [
            f"## {sw}: {e['runs']} runs x {e['timesteps']} checkpoints, {e['positives']} sufficient"
            + (", batch norm" if e["batchnorm"] else ""),
            "",
            f"Leave-one-out hyper-parameter oracle (share of sufficient runs among the other seeds of the "
            f"same lr and dropout): precision {o['precision']:.3f}, AUC {o['roc_auc']:.3f}; "
            f"{o['configs_seeds_disagree']} of {o['configs']} configurations have seeds on both sides of the label.",
            "",
        ]
        if e.get("label_noise"):
            n = e["label_noise"]
            agree = ", ".join(f"epoch {t}: {v:.2f}" for t, v in n["val_label_agreement"].items())
            lines += [
                f"How much the last epochs decide the label: validation accuracy >= {th} at a checkpoint agrees "
                f"with the label in {agree}; validation accuracy moves {n['last_epochs_mean_abs_change']:.3f} "
                f"per epoch over the last three; final accuracy varies by {n['seed_std_of_final_accuracy']:.3f} "
                "(std) across the seeds of one configuration.",
                "",
            ]
        lines += [
            "| features | " + " | ".join(f"k={k}" + (" (25 %)" if k == e["k25"] else "") for k in ks) + " |",
            "|---|" + "---|" * len(ks),
        ]
        names = list(dict.fromkeys(r["features"] for r in e["rows"]))
        for name in names:
            cells = []
            for k in ks:
                r = next((r for r in e["rows"] if r["features"] == name and r["k"] == k), None)
                cells.append(f"{r['precision']['mean']:.2f} / {r['roc_auc']['mean']:.2f}" if r else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", f"At k = {e['k25']} with 95 % intervals:", "", "| features | precision | AUC |", "|---|---|---|"]
        for r in e["rows"]:
            if r["k"] == e["k25"]:
                p, a = r["precision"], r["roc_auc"]
                lines.append(
                    f"| {r['features']} | {p['mean']:.3f} [{p['ci_low']:.2f}, {p['ci_high']:.2f}] | "
                    f"{a['mean']:.3f} [{a['ci_low']:.2f}, {a['ci_high']:.2f}] |"
                )
        lines.append("")
    if results.get("cross_sweep"):
        lines += [
            "## Across sweeps: fit on one, predict the other",
            "",
            "`resnet20bn` (8 lr x 3 dropouts x 4 seeds) and `resnet20bn-grid2` (8 other lr x 2 other "
            "dropouts x 3 seeds), the same architecture and recipe. Fitted on every run of one sweep, "
            "tested on every run of the other; mean over MLP seeds.",
            "",
            "| train -> test | k | features | precision | AUC |",
            "|---|---|---|---|---|",
        ]
        for r in results["cross_sweep"]:
            lines.append(
                f"| {r['train']} -> {r['test']} | {r['k']} | {r['features']} | {r['precision']:.3f} | {r['roc_auc']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)
