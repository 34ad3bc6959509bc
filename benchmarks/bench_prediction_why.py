"""Where the data-free signal of the prediction sweeps lives (issue #7): ablations at k = 25 %.

bench_prediction.py shows that weight statistics (Unterthiner et al.) predict the LeNet-5 digits
sweep with higher precision than DTG, while DTG with per-layer statistics and quantile scaling
has the higher AUC. This script asks why, on the same sweeps, with the median label, the first
25 % of checkpoints and the same stratified splits and MLP seeds for every row:

1. ``layers``: weight statistics of one layer only, and of every layer but one (SPEC scaling,
   the weight statistics' better one);
2. ``statistics``: each of the seven weight statistics of the most informative layer alone;
3. ``sign``: the weight statistics computed on ``|w|`` instead of ``w`` (a graph of norms sees
   only ``|w|``); SPEC's five statistics applied to that layer's weights, signed and not, and
   to its edge weights in the graph (the norms of its kernel slices) and their logs;
4. ``signed nodes``: a DTG variant beyond SPEC. Beside each node's centrality, a signed node
   attribute: the sum of the weights of the channel's filter (``out``) and of the weights it
   feeds (``in``); per layer, the five statistics of each, smoothed in time as DTG;
5. ``operating point``: the main feature sets under both scalings, with recall, average
   precision, and the precision each reaches at the recall that weight statistics reach at
   the 0.5 cut (read off the test scores pooled over all splits).

``--part selection`` instead evaluates the predictor's ``select`` option (beyond SPEC: the MLP
sees only the m features with the largest ANOVA F in the training split) on the main feature
sets for every m of SELECT_GRID, and with m chosen inside each training split (``--nested``).

Usage: python benchmarks/bench_prediction_why.py [--work DIR] [--repeats 100] [--jobs 2] [--only lenet5]
       python benchmarks/bench_prediction_why.py --part selection [--nested lenet5]
The sweeps are bench_prediction.py's (trained into ``--work`` if missing; complete runs are reused).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_prediction import sweeps  # noqa: E402

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.features import temporal_features  # noqa: E402
from dtg_gpu.features.baselines import tensor_statistics  # noqa: E402
from dtg_gpu.features.statistics import timestep_statistics  # noqa: E402
from dtg_gpu.graph import filter_norms  # noqa: E402
from dtg_gpu.predictor import PerformancePredictor, label_runs  # noqa: E402
from dtg_gpu.predictor.evaluation import evaluate  # noqa: E402
from dtg_gpu.sweeps import load_sweep, run_sweep  # noqa: E402
from dtg_gpu.workflow import feature_sets, featurize_sweep  # noqa: E402

WS_NAMES = ("mean", "std", "q0", "q25", "q50", "q75", "q100")
SCALINGS = ("standard", "quantile")
SELECT_GRID = (3, 5, 10, 20, None)


def weight_tables(runs, k: int) -> dict[str, np.ndarray]:
    """Per run and layer at checkpoint ``k``: the seven weight statistics of ``w`` and ``|w|``
    ``[runs, L, 7]``; SPEC's five statistics of ``w``, of ``|w|``, of the layer's edge weights
    in the graph (:func:`~dtg_gpu.graph.filter_norms`) and of their logs ``[runs, L, 5]``."""
    out = {"ws": [], "ws_abs": [], "five": [], "five_abs": [], "five_edges": [], "five_log_edges": []}
    five = lambda v: timestep_statistics(v.reshape(1, -1))[0].tolist()  # noqa: E731
    for run in runs:
        w = run.weights(k - 1)
        xs = [w[p].detach().double().reshape(-1) for p in run.topology.params]
        edges = [filter_norms(w[layer.param].detach().double()[None], layer)[0] for layer in run.topology.layers]
        out["ws"].append([tensor_statistics(x) for x in xs])
        out["ws_abs"].append([tensor_statistics(x.abs()) for x in xs])
        out["five"].append([five(x) for x in xs])
        out["five_abs"].append([five(x.abs()) for x in xs])
        out["five_edges"].append([five(e) for e in edges])
        out["five_log_edges"].append([five(e.clamp_min(torch.finfo(e.dtype).tiny).log()) for e in edges])
    return {n: np.asarray(v, dtype=float) for n, v in out.items()}


def signed_node_statistics(runs, k: int, alpha: float) -> dict[str, np.ndarray]:
    r"""Signed node attributes beside DTG (option beyond SPEC), smoothed as DTG.

    For a layer with weight viewed as ``[out, in, S]`` (the same channel blocks as the graph's
    edges), output channel ``i`` gets :math:`\sum_{j,s} W_{ijs}` (``out``) and input channel
    ``j`` gets :math:`\sum_{i,s} W_{ijs}` (``in``). Per timestep and layer: the five statistics
    over the layer's channels (sides with fewer than 3 channels are skipped, as in the
    per-layer DTG statistics); then temporal reinforcement. Returns ``out`` and ``in``,
    ``[runs, 5·L·k]`` each.
    """
    feats = {"out": [], "in": []}
    for run in runs:
        ws = [run.weights(t) for t in range(k)]
        per = {"out": [], "in": []}
        for layer in run.topology.layers:
            out, cin = layer.block_shape
            w = torch.stack([x[layer.param] for x in ws]).double().reshape(k, out, cin, -1).sum(-1)
            for side, v, n in (("out", w.sum(2), out), ("in", w.sum(1), cin)):
                if n >= 3:
                    per[side].append(timestep_statistics(v))  # [k, 5]
        for side in feats:
            feats[side].append(torch.cat(per[side], 1))
    return {side: temporal_features(torch.stack(v), alpha).numpy() for side, v in feats.items()}


def _clf(scaling: str, select):
    """The predictor of a row: ``select`` an int, None, or ``"cv"`` (chosen in each training
    split by 5-fold cross-validated average precision among SELECT_GRID)."""
    if select != "cv":
        return PerformancePredictor(scaling=scaling, select=select)
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    return GridSearchCV(
        PerformancePredictor(scaling=scaling, random_state=0),
        {"select": list(SELECT_GRID)},
        scoring="average_precision",
        cv=StratifiedKFold(5, shuffle=True, random_state=0),
    )


def _job(args):
    label, X, y, scaling, repeats, *select = args
    torch.set_num_threads(1)
    s = evaluate(_clf(scaling, select[0] if select else None), X, y, repeats=repeats)
    cm = np.asarray(s["confusion_matrix"])
    keep = {
        m: {q: s[m][q] for q in ("mean", "ci_low", "ci_high")}
        for m in ("precision", "recall", "roc_auc", "average_precision")
    }
    return label, scaling, X.shape[1], keep, s["roc"], int(cm[1].sum()), int(cm[0].sum())


def precision_at_recall(roc: dict, positives: int, negatives: int, recall: float) -> float:
    """Precision of the pooled test scores at the first cut whose recall reaches ``recall``."""
    fpr, tpr = np.asarray(roc["fpr"]), np.asarray(roc["tpr"])
    i = int(np.argmax(tpr >= recall - 1e-12))
    tp, fp = tpr[i] * positives, fpr[i] * negatives
    return float(tp / (tp + fp)) if tp + fp > 0 else float("nan")


def _row(section: str, label: str, scaling: str, dims: int, keep: dict) -> dict:
    return {"section": section, "features": label, "scaling": scaling, "dims": dims, **keep}


def study(name: str, runs, repeats: int, pool) -> dict:
    sf = featurize_sweep(runs, alpha=0.5)
    k = max(1, sf.timesteps // 4)
    y = label_runs(sf.accuracies, "median")
    params = runs[0].topology.params
    tab = weight_tables(runs, k)
    ws = tab["ws"].reshape(len(runs), -1)
    signed = signed_node_statistics(runs, k, sf.alpha)
    base = feature_sets(sf, k, ["dtg", "dtg_per_layer", "spectral", "learning_curve"])
    pl = base["dtg_per_layer"]
    rows, t0 = [], time.perf_counter()

    # 1 + 3 + 4 + 5: everything that does not depend on the best layer
    jobs = []
    for i, p in enumerate(params):
        jobs.append((f"only {p}", tab["ws"][:, i], y, "standard", repeats))
        jobs.append((f"all but {p}", np.delete(tab["ws"], i, axis=1).reshape(len(runs), -1), y, "standard", repeats))
    sections = {"layers": len(jobs)}
    main_sets = {
        "dtg": base["dtg"],
        "dtg_per_layer": pl,
        "weight_stats": ws,
        "spectral": base["spectral"],
        "learning_curve": base["learning_curve"],
    }
    sign_sets = {"weight_stats of |w|": tab["ws_abs"].reshape(len(runs), -1)}
    node_sets = {
        "signed out": signed["out"],
        "signed out+in": np.hstack([signed["out"], signed["in"]]),
        "dtg_per_layer + signed out": np.hstack([pl, signed["out"]]),
        "dtg_per_layer + signed out+in": np.hstack([pl, signed["out"], signed["in"]]),
    }
    for sec, sets in (("sign", sign_sets), ("signed nodes", node_sets), ("operating point", main_sets)):
        for label, X in sets.items():
            for sc in SCALINGS:
                jobs.append((label, X, y, sc, repeats))
        sections[sec] = len(jobs)
    done = list(pool.map(_job, jobs))
    bounds = [0] + list(sections.values())
    for (sec, _), lo, hi in zip(sections.items(), bounds[:-1], bounds[1:]):
        rows += [_row(sec, *d[:4]) for d in done[lo:hi]]
    pooled = {(d[0], d[1]): d[4:] for d in done}

    # 2 + 3: the most informative layer (highest AUC alone), statistic by statistic
    only = [r for r in rows if r["section"] == "layers" and r["features"].startswith("only ")]
    best_i = int(np.argmax([r["roc_auc"]["mean"] for r in only]))
    best = params[best_i]
    jobs = [(f"{best}: {s}", tab["ws"][:, best_i, [j]], y, "standard", repeats) for j, s in enumerate(WS_NAMES)]
    jobs.append((f"{best}: q25, q75", tab["ws"][:, best_i, [3, 5]], y, "standard", repeats))
    jobs.append((f"{best}: mean, std", tab["ws"][:, best_i, [0, 1]], y, "standard", repeats))
    n_stat = len(jobs)
    assert [layer.param for layer in runs[0].topology.layers] == list(params)
    for label, key in (
        (f"{best}: the five statistics of w", "five"),
        (f"{best}: the five statistics of |w|", "five_abs"),
        (f"{best}: the five statistics of its edge weights", "five_edges"),
        (f"{best}: the five statistics of its log edge weights", "five_log_edges"),
    ):
        for sc in SCALINGS:
            jobs.append((label, tab[key][:, best_i], y, sc, repeats))
    done = list(pool.map(_job, jobs))
    rows += [_row("statistics", *d[:4]) for d in done[:n_stat]]
    rows += [_row("sign", *d[:4]) for d in done[n_stat:]]

    # 5: precision at the recall weight statistics reach at the 0.5 cut
    ref = next(
        r
        for r in rows
        if r["section"] == "operating point" and r["features"] == "weight_stats" and r["scaling"] == "standard"
    )
    target = ref["recall"]["mean"]
    for r in rows:
        if r["section"] in ("operating point", "signed nodes"):
            roc, pos, neg = pooled[r["features"], r["scaling"]]
            r["precision_at_ws_recall"] = precision_at_recall(roc, pos, neg, target)
    return {
        "k": k,
        "timesteps": sf.timesteps,
        "runs": len(runs),
        "best_layer": best,
        "weight_stats_recall": target,
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }


def selection_study(name: str, runs, repeats: int, pool, nested: bool) -> dict:
    """The predictor's ``select`` option (beyond SPEC) on the main feature sets: every ``m`` of
    SELECT_GRID, and (``nested``) ``m`` chosen inside each training split."""
    sf = featurize_sweep(runs, alpha=0.5)
    k = max(1, sf.timesteps // 4)
    y = label_runs(sf.accuracies, "median")
    sets = feature_sets(sf, k, ["dtg", "dtg_per_layer", "weight_stats", "spectral"])
    plan = [
        ("dtg", "quantile"),
        ("dtg_per_layer", "quantile"),
        ("dtg_per_layer", "standard"),
        ("weight_stats", "standard"),
        ("weight_stats", "quantile"),
        ("spectral", "quantile"),
    ]
    jobs = [(fs, sets[fs], y, sc, repeats, m) for fs, sc in plan for m in SELECT_GRID]
    if nested:
        jobs += [
            (fs, sets[fs], y, sc, repeats, "cv")
            for fs, sc in (("dtg_per_layer", "quantile"), ("weight_stats", "standard"))
        ]
    t0 = time.perf_counter()
    done = list(pool.map(_job, jobs))
    rows = [{**_row("selection", *d[:4]), "select": "all" if j[5] is None else j[5]} for j, d in zip(jobs, done)]
    return {
        "k": k,
        "timesteps": sf.timesteps,
        "runs": len(runs),
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }


def selection_markdown(results: dict) -> str:
    lines = [
        f"Median label, k = 25 % of checkpoints, {results['repeats']} stratified 90/10 splits shared "
        "by every row; mean [95 % CI]. `select`: the predictor keeps the m features with the largest "
        "ANOVA F on the scaled training split (option beyond SPEC; `all` is SPEC). `cv`: m chosen in "
        f"each training split among {list(SELECT_GRID)} by 5-fold cross-validated average precision "
        "(scikit-learn `GridSearchCV`, MLP seed 0). Written by "
        "`benchmarks/bench_prediction_why.py --part selection`.",
        "",
    ]
    for name, e in results["sweeps"].items():
        lines += [
            f"## {name}, k = {e['k']} of {e['timesteps']}, {e['runs']} runs",
            "",
            "| features | scaling | select | precision | recall | AUC | average precision |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in e["rows"]:
            lines.append(
                "| "
                + " | ".join(
                    [r["features"].replace("|", "\\|"), r["scaling"], str(r["select"])]
                    + [_cell(r[m]) for m in ("precision", "recall", "roc_auc", "average_precision")]
                )
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def _cell(s: dict) -> str:
    return f"{s['mean']:.3f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"


def markdown(results: dict) -> str:
    lines = [
        f"Median label, k = 25 % of checkpoints, {results['repeats']} stratified 90/10 splits shared "
        "by every row (same MLP seeds); mean [95 % CI]. Scaling: the predictor's feature scaling, "
        "`standard` (SPEC) or `quantile` (option). Written by `benchmarks/bench_prediction_why.py`.",
        "",
    ]
    titles = {
        "layers": "Which layer: weight statistics of one layer, or of all layers but one",
        "statistics": "Which statistic of the most informative layer",
        "sign": "What the graph keeps: statistics of w, of \\|w\\| and of the layer's edge weights",
        "signed nodes": "Signed node attributes beside DTG (option beyond SPEC, not in the library)",
        "operating point": "Operating point: recall at the 0.5 cut, average precision, and precision "
        "at the recall weight statistics reach",
    }
    for name, e in results["sweeps"].items():
        lines += [
            f"## {name}, k = {e['k']} of {e['timesteps']}, {e['runs']} runs "
            f"(most informative layer: `{e['best_layer']}`; weight statistics' recall "
            f"{e['weight_stats_recall']:.3f})",
            "",
        ]
        for sec, title in titles.items():
            rows = [r for r in e["rows"] if r["section"] == sec]
            extra = sec in ("operating point", "signed nodes")
            lines += [
                f"### {title}",
                "",
                "| features | scaling | dims | precision | recall | AUC | average precision |"
                + (" precision at ws recall |" if extra else ""),
                "|---|---|---|---|---|---|---|" + ("---|" if extra else ""),
            ]
            for r in rows:
                cells = [r["features"].replace("|", "\\|"), r["scaling"], str(r["dims"])] + [
                    _cell(r[m]) for m in ("precision", "recall", "roc_auc", "average_precision")
                ]
                if extra:
                    cells.append(f"{r['precision_at_ws_recall']:.3f}")
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "dtg-bench-prediction"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel evaluations, one CPU thread each"
    )
    p.add_argument("--only", nargs="*", default=None, help="sweeps to run (default: lenet5 vgg11n)")
    p.add_argument("--quick", action="store_true", help="one seed per configuration (32 runs a sweep)")
    p.add_argument(
        "--part",
        choices=("why", "selection"),
        default="why",
        help="why: the ablations; selection: the predictor's select option",
    )
    p.add_argument(
        "--nested",
        nargs="*",
        default=["lenet5"],
        help="with --part selection: sweeps that also get select chosen inside each split",
    )
    a = p.parse_args(argv)
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": a.repeats, "sweeps": {}}
    # spawn, not fork: the parent has already run torch's OpenMP threads
    with ProcessPoolExecutor(max_workers=a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for name, cfg in sweeps(a.quick).items():
            if a.only and name not in a.only:
                continue
            runs = load_sweep(run_sweep(cfg, Path(a.work) / name, progress=False))
            if a.part == "selection":
                e = selection_study(name, runs, a.repeats, pool, name in a.nested)
            else:
                e = study(name, runs, a.repeats, pool)
            results["sweeps"][name] = e
            print(f"{name}: {len(e['rows'])} rows in {e['seconds']} s", flush=True)
            for r in e["rows"]:
                print(
                    f"  {r['section']:<16} {r['features']:<42} {r['scaling']:<9} {r.get('select', '')} "
                    f"P={r['precision']['mean']:.3f} R={r['recall']['mean']:.3f} "
                    f"AUC={r['roc_auc']['mean']:.3f} AP={r['average_precision']['mean']:.3f}",
                    flush=True,
                )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = ("prediction_why" if a.part == "why" else "prediction_selection") + ("_quick" if a.quick else "")
    atomic_write(out / f"{stem}.json", json.dumps(results, indent=2))
    atomic_write(out / f"{stem}.md", markdown(results) if a.part == "why" else selection_markdown(results))
    print(f"wrote {out / stem}.json and .md")


if __name__ == "__main__":
    main()
