"""Is early stopping from checkpoints worth it? Replay recorded sweeps as Optuna studies (issue #17).

Each recorded sweep (run folders written by ``dtg sweep``: one checkpoint and one validation
accuracy per epoch, the test accuracy at the end) is replayed as an in-memory Optuna study,
the runs arriving in a random order (``--orderings``, same orderings for every method), one
trial per run, each trial reporting one checkpoint per epoch through the same code path as
``dtg_gpu.integrations.optuna.report`` (the checkpoint records are computed once per sweep and
cached). A pruned trial has run the epochs up to the pruning step; a completed trial returns
the run's recorded final (test) accuracy.

Methods: no pruning; Optuna's MedianPruner, PercentilePruner(25), SuccessiveHalvingPruner,
HyperbandPruner, PatientPruner(MedianPruner, patience=2), WilcoxonPruner (all on the recorded
validation accuracy: they use data); DTGPruner data-free (``use_values=False``);
DTGPruner + weight statistics (data-free); DTGPruner with the reported validation accuracy as
one more feature; for batch-norm networks, both DTGPruners on the graph with batch norm folded
(``fold_batchnorm=True``). Metrics per method over the orderings: compute saved S = 1 - epochs run /
epochs of the full sweep; regret R = best final accuracy of the sweep - best final accuracy
among completed trials; how often the best run survives; recall of the top 10 %; and the
S-vs-R curve of the DTG pruners over ``min_probability``.

Usage: python benchmarks/bench_early_stopping.py SWEEP_DIR [SWEEP_DIR ...] [--orderings 20]
           [--out benchmarks/results] [--work DIR] [--quick] [--merge] [--only METHOD ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.early_stopping.records import many_run_records  # noqa: E402
from dtg_gpu.integrations.optuna import _STEP, DTGPruner  # noqa: E402
from dtg_gpu.sweeps import load_sweep  # noqa: E402
from dtg_gpu.sweeps.config import CHECKS, SUITE  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def sweep_records(folder: Path, work: Path) -> dict:
    """Checkpoint records, validation accuracies and final accuracies of every complete run
    (cached in ``work``)."""
    cache = work / f"records-v2-{folder.name}.json"  # v2: a "folded" block for batch-norm nets
    if cache.exists():
        return with_params(json.loads(cache.read_text()), folder)
    runs = load_sweep(folder)
    out = {"sweep": folder.name, "runs": []}
    t0 = time.perf_counter()
    records = many_run_records(runs, [0] * len(runs), device="cpu")  # one solve per architecture
    for run, recs in zip(runs, records):
        if isinstance(recs, str):
            raise SystemExit(f"{folder}: run {run.name}: {recs}")
        acc = [c.get("val_accuracy") for c in run.meta.get("checkpoints", [])]
        out["runs"].append({"name": run.name, "final": run.final_accuracy, "val": acc, "records": recs})
    out["seconds"] = time.perf_counter() - t0
    out["model"] = runs[0].meta.get("model")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, json.dumps(out))
    return with_params(out, folder)


#: the hyper-parameters a replayed trial suggests (the ones `dtg sweep` varies, but the seed)
PARAMS = {
    "lr": optuna.distributions.FloatDistribution(1e-6, 10.0, log=True),
    "dropout": optuna.distributions.FloatDistribution(0.0, 1.0),
}


def with_params(sweep: dict, folder: Path) -> dict:
    """Each run's learning rate and dropout from its run.json (the trial's `params` in a replay)."""
    for r in sweep["runs"]:
        if "params" not in r:
            meta = json.loads((folder / r["name"] / "run.json").read_text())
            r["params"] = {k: float(meta[k]) for k in PARAMS if k in meta}
    return sweep


SUITE_METHODS = (
    "none",
    "MedianPruner",
    "PercentilePruner(25)",
    "SuccessiveHalvingPruner",
    "HyperbandPruner",
    "PatientPruner(Median)",
    "DTGPruner (data-free)",
    "DTGPruner cold (data-free)",
    "DTGPruner+val_accuracy",
    "DTGPruner+val_accuracy, value_median=None",
    "DTGPruner cold+val_accuracy",
    "DTGPruner folded (data-free)",
    "DTGPruner folded+val_accuracy",
    "DTGPruner+covariates (data-free)",
    "DTGPruner+covariates+val_accuracy",
    "DTGPruner+val_accuracy, value_leader=0.75",
    "DTGPruner+val_accuracy (default)",
    "DTGPruner (data-free, default)",
)


def methods(quick: bool) -> dict:
    P = optuna.pruners
    m = {
        "none": lambda: P.NopPruner(),
        "MedianPruner": lambda: P.MedianPruner(),
        "PercentilePruner(25)": lambda: P.PercentilePruner(25.0),
        "SuccessiveHalvingPruner": lambda: P.SuccessiveHalvingPruner(),
        "HyperbandPruner": lambda: P.HyperbandPruner(),
        "PatientPruner(Median)": lambda: P.PatientPruner(P.MedianPruner(), patience=2),
        "WilcoxonPruner": lambda: P.WilcoxonPruner(),
        "DTGPruner (data-free)": lambda: DTGPruner(use_values=False, covariates=None, novelty_guard=False),
        "DTGPruner cold (data-free)": lambda: DTGPruner(
            use_values=False, covariates=None, warm_start=False, novelty_guard=False
        ),
        "DTGPruner cold+val_accuracy": lambda: DTGPruner(
            use_values=True, covariates=None, value_leader=None, warm_start=False, novelty_guard=False
        ),
        "DTGPruner+weight_stats (data-free)": lambda: DTGPruner(
            use_values=False, covariates=None, features="dtg+weight_stats", novelty_guard=False
        ),
        "DTGPruner+val_accuracy": lambda: DTGPruner(
            use_values=True, covariates=None, value_leader=None, novelty_guard=False
        ),
        # the rule before MedianPruner's test on the value (the value one more input to P)
        "DTGPruner+val_accuracy, value_median=None": lambda: DTGPruner(
            use_values=True, covariates=None, value_median=None, novelty_guard=False
        ),
        # no decision on the first two checkpoints (steps 0 and 1): VGG-11 lost its best run at epoch 1
        "DTGPruner n_warmup_steps=2 (data-free)": lambda: DTGPruner(
            use_values=False, covariates=None, n_warmup_steps=2, novelty_guard=False
        ),
        "DTGPruner n_warmup_steps=2+val_accuracy": lambda: DTGPruner(
            use_values=True, covariates=None, value_leader=None, n_warmup_steps=2, novelty_guard=False
        ),
        "DTGPruner folded (data-free)": lambda: DTGPruner(
            use_values=False, covariates=None, fold_batchnorm=True, novelty_guard=False
        ),
        "DTGPruner folded+val_accuracy": lambda: DTGPruner(
            use_values=True, covariates=None, value_leader=None, fold_batchnorm=True, novelty_guard=False
        ),
        # the trial's hyper-parameters beside the checkpoints (known before it runs: still data-free);
        # the default since covariates="auto" (the replayed trials suggest lr and dropout: the same names)
        "DTGPruner+covariates (data-free)": lambda: DTGPruner(
            use_values=False, covariates=["lr", "dropout"], novelty_guard=False
        ),
        "DTGPruner+covariates+val_accuracy": lambda: DTGPruner(
            use_values=True, covariates=["lr", "dropout"], value_leader=None, novelty_guard=False
        ),
        # the default of 2026-12-08: a run in the finished runs' top quarter by value is not the
        # checkpoints' to stop (between the median and the top quarter they may)
        "DTGPruner+val_accuracy, value_leader=0.75": lambda: DTGPruner(
            use_values=True, value_leader=0.75, novelty_guard=False
        ),
        # as it ships: covariates="auto" (lr and dropout here) and value_leader=0.5 (a run at or
        # above the finished runs' median value is not the checkpoints' to stop: the value decides)
        "DTGPruner+val_accuracy (default)": lambda: DTGPruner(use_values=True),
        # as it ships, data-free: covariates="auto" and novelty_guard=True (a run unlike every
        # finished run is not the online model's to stop)
        "DTGPruner (data-free, default)": lambda: DTGPruner(use_values=False),
    }
    return m


def has_batchnorm(sweep: dict) -> bool:
    """The records hold a folded block: the network has batch norm to fold."""
    return any("folded" in rec for r in sweep["runs"] for rec in r["records"][:1])


def replay(sweep: dict, order: np.ndarray, pruner, uses_values: bool = True) -> dict:
    runs = sweep["runs"]
    # a fixed name: HyperbandPruner assigns brackets by a hash of the study's name (random by default)
    study = optuna.create_study(
        study_name="replay-" + "-".join(map(str, order[:6])),
        direction="maximize",
        pruner=pruner,
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    epochs_run, completed, pruned_at, full = [], [], {}, []
    for i in order:
        r = runs[i]
        if r.get(
            "params"
        ):  # the trial suggests the run's hyper-parameters (no effect on the pruners without covariates)
            study.enqueue_trial(r["params"])
            trial = study.ask({k: PARAMS[k] for k in r["params"]})
        else:
            trial = study.ask()
        steps = len(r["records"])
        full.append(steps)
        pruned = False
        for s in range(steps):
            trial.storage.set_trial_system_attr(trial._trial_id, f"{_STEP}{s:09d}", r["records"][s])
            trial.report(float(r["val"][s]), s)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                epochs_run.append(s + 1)
                pruned_at[int(i)] = (s + 1, len(completed))  # epochs it ran, trials completed before it
                pruned = True
                break
        if not pruned:
            study.tell(trial, float(r["final"]))
            epochs_run.append(steps)
            completed.append(int(i))
    return {"epochs": epochs_run, "completed": completed, "pruned_at": pruned_at, "full": full}


def metrics(sweep: dict, res: dict) -> dict:
    finals = np.array([r["final"] for r in sweep["runs"]], dtype=float)
    total = sum(len(r["records"]) for r in sweep["runs"])
    best = float(np.nanmax(finals))
    kept = finals[res["completed"]] if res["completed"] else np.array([-np.inf])
    top = set(np.argsort(-finals)[: max(1, int(round(0.1 * len(finals))))].tolist())
    levels = np.unique(finals[np.isfinite(finals)])
    one = float(np.diff(levels).min()) if len(levels) > 1 else 0.0  # one test sample's worth
    regret = best - float(np.nanmax(kept))
    # why: the best run cut (after how many epochs, with how many trials completed before it);
    # the epochs spent on runs below the median that ran to the end (a completed run ran them all)
    ib = int(np.nanargmax(finals))
    low = finals < np.nanmedian(finals)
    wasted = sum(len(sweep["runs"][i]["records"]) for i in res["completed"] if low[i])
    cut = res.get("pruned_at", {}).get(ib)
    first = FIRST_TRIALS
    return {
        "saved": 1 - sum(res["epochs"]) / total,
        "saved_first": 1 - sum(res["epochs"][:first]) / sum(res["full"][:first]) if res.get("full") else None,
        "regret": regret,
        "regret_one_sample": regret <= one + 1e-9,
        "best_survives": ib in set(res["completed"]),
        "top10_recall": len(top & set(res["completed"])) / len(top),
        "best_cut": list(cut) if cut and regret > 1e-12 else None,
        "low_completed_share": wasted / total,
    }


FIRST_TRIALS = 20  # "saves almost nothing in a study's first 20-30 trials": measured on the first 20


def summarise(rows: list[dict]) -> dict:
    s = np.array([r["saved"] for r in rows])
    first = [r["saved_first"] for r in rows if r.get("saved_first") is not None]
    reg = np.array([r["regret"] for r in rows])
    return {
        "saved_mean": float(s.mean()),
        "saved_min": float(s.min()),
        "saved_max": float(s.max()),
        "regret_mean": float(reg.mean()),
        "regret_max": float(reg.max()),
        "regret_zero_share": float((reg <= 1e-12).mean()),
        "regret_one_sample_share": float(np.mean([r["regret_one_sample"] for r in rows])),
        "best_survives_share": float(np.mean([r["best_survives"] for r in rows])),
        "top10_recall_mean": float(np.mean([r["top10_recall"] for r in rows])),
        "orderings": len(rows),
        **({"saved_first_mean": float(np.mean(first))} if first else {}),
        # half-widths of the 95 % intervals of the means over the orderings (normal approximation)
        "saved_ci95": float(1.96 * s.std(ddof=1) / np.sqrt(len(s))) if len(s) > 1 else float("nan"),
        "regret_ci95": float(1.96 * reg.std(ddof=1) / np.sqrt(len(reg))) if len(reg) > 1 else float("nan"),
    } | _why(rows)


def _why(rows: list[dict]) -> dict:
    """Where the regret comes from: in the orders that lost the best run, after how many
    epochs it was cut and how many trials had completed before it; the share of the sweep's
    compute spent on runs below the median that ran to the end (what a pruner kept too long)."""
    cut = [r["best_cut"] for r in rows if r.get("best_cut")]
    out = {"low_completed_share": float(np.mean([r.get("low_completed_share", np.nan) for r in rows]))}
    if cut:
        out["best_cut_epochs"] = sorted(int(c[0]) for c in cut)
        out["best_cut_after_trials"] = sorted(int(c[1]) for c in cut)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="*")
    ap.add_argument(
        "--suite",
        action="store_true",
        help="every sweep of dtg_gpu.sweeps.config.SUITE under --root; the suite's methods; writes early_stopping_suite",
    )
    ap.add_argument("--root", default=None, help="with --suite: folder with one trained sweep per preset (ROOT/NAME)")
    ap.add_argument(
        "--presets",
        nargs="*",
        default=None,
        help="with --suite: these presets only, check sweeps (dtg_gpu.sweeps.CHECKS) allowed (with --merge: add them to the page)",
    )
    ap.add_argument("--stem", default=None, help="the results' file name (default early_stopping[_quick][_suite])")
    ap.add_argument("--orderings", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "dtg-bench-early-stopping"))
    ap.add_argument("--quick", action="store_true", help="3 orderings, no curve")
    ap.add_argument("--only", nargs="*", default=None, help="methods to run (default: all)")
    ap.add_argument(
        "--curve",
        nargs="*",
        type=float,
        default=None,
        help="min_probability points (default 0.1 0.2 0.3 0.5; none with --suite)",
    )
    ap.add_argument("--curve-orderings", type=int, default=None, help="default: all the orderings")
    ap.add_argument(
        "--thresholds",
        nargs="*",
        default=["median", "q0.75"],
        help="the curve's label thresholds (DTGPruner threshold=)",
    )
    ap.add_argument("--curve-only", action="store_true", help="only the curves (with --merge: keep the methods' rows)")
    ap.add_argument("--merge", action="store_true", help="add these sweeps to the saved results, keep the others")
    a = ap.parse_args()
    if a.suite:
        if not a.root:
            ap.error("--suite needs --root ROOT (ROOT/NAME for each preset of the suite)")
        unknown = sorted(set(a.presets or ()) - set(SUITE) - set(CHECKS))
        if unknown:
            ap.error(f"--presets: not in the suite or its check sweeps: {', '.join(unknown)}")
        # the suite by default; a check sweep (held out of the suite) only when named
        names = SUITE if a.presets is None else [n for n in (*SUITE, *CHECKS) if n in a.presets]
        a.sweeps = [str(Path(a.root) / n) for n in names]
        a.only = a.only or list(SUITE_METHODS)
        a.curve = a.curve or []
    elif not a.sweeps:
        ap.error("give SWEEP_DIR ... or --suite --root ROOT")
    a.curve = [0.1, 0.2, 0.3, 0.5] if a.curve is None else a.curve
    n_orders = 3 if a.quick else a.orderings
    out = Path(a.out)
    results = {"orderings": n_orders, "date": time.strftime("%Y-%m-%d %H:%M"), "sweeps": {}}
    stem = a.stem or ("early_stopping_quick" if a.quick else "early_stopping") + ("_suite" if a.suite else "")
    store = out / f"{stem}.json"
    before = set(json.loads(store.read_text()).get("sweeps", {})) if a.merge and store.exists() else set()
    for folder in map(Path, a.sweeps):
        sweep = sweep_records(folder, Path(a.work))
        n = len(sweep["runs"])
        rng = np.random.default_rng(0)
        orders = [rng.permutation(n) for _ in range(n_orders)]
        res = {
            "runs": n,
            "checkpoints": len(sweep["runs"][0]["records"]),
            "model": sweep.get("model"),
            "record_seconds": sweep.get("seconds"),
            "methods": {},
            "curve": {},
        }
        for name, make in methods(a.quick).items():
            if (a.only and name not in a.only) or a.curve_only:
                continue
            if "folded" in name and not has_batchnorm(sweep):
                continue  # no batch norm: the same decisions as the unfolded rows
            t0 = time.perf_counter()
            rows = [metrics(sweep, replay(sweep, o, make())) for o in orders]
            res["methods"][name] = summarise(rows) | {"seconds": time.perf_counter() - t0}
            m = res["methods"][name]
            print(
                f"{folder.name:>10} {name:<36} saved {m['saved_mean']:.3f} [{m['saved_min']:.3f}, "
                f"{m['saved_max']:.3f}]  regret mean {m['regret_mean']:.4f} max {m['regret_max']:.4f}  "
                f"R=0 in {m['regret_zero_share']:.0%}  top10 recall {m['top10_recall_mean']:.2f}  "
                f"({m['seconds']:.0f} s)",
                flush=True,
            )
        if not a.quick and a.curve:
            for th in a.thresholds:
                for label, kw in (("data-free", dict(use_values=False)), ("with val_accuracy", dict(use_values=True))):
                    label = label if th == "median" else f"{label}, threshold {th}"
                    pts = []
                    for mp in a.curve:
                        rows = [
                            metrics(sweep, replay(sweep, o, DTGPruner(min_probability=mp, threshold=th, **kw)))
                            for o in orders[: a.curve_orderings]
                        ]
                        pts.append({"min_probability": mp, "threshold": th} | summarise(rows))
                        print(
                            f"{folder.name:>10} curve {label:<40} min_p {mp:.2f}: saved {pts[-1]['saved_mean']:.3f} "
                            f"regret mean {pts[-1]['regret_mean']:.4f} max {pts[-1]['regret_max']:.4f} "
                            f"R=0 {pts[-1]['regret_zero_share']:.0%}",
                            flush=True,
                        )
                    res["curve"][label] = pts
        stamp = "curve_date" if a.curve_only else "rows_added" if (a.only and folder.name in before) else "date"
        res[stamp] = results["date"]
        results["sweeps"][folder.name] = res
    out.mkdir(parents=True, exist_ok=True)
    # keep the other sweeps' tables, rows and curves (read again: another replay may have merged since)
    if a.merge and store.exists():
        old = json.loads(store.read_text())
        merged = old.get("sweeps", {})
        for name, res in results["sweeps"].items():
            prev = merged.get(name, {})
            res["methods"] = {**prev.get("methods", {}), **res["methods"]}
            curve = dict(prev.get("curve", {}))
            for label, pts in res["curve"].items():  # a point per min_probability, the new one kept
                by_p = {p["min_probability"]: p for p in curve.get(label, []) + pts}
                curve[label] = [by_p[k] for k in sorted(by_p)]
            res["curve"] = curve
            merged[name] = prev | res
        if a.suite:  # the suite's order, whichever presets were added when
            merged = {n: merged[n] for n in SUITE if n in merged} | merged
        results["sweeps"] = merged
    atomic_write(store, json.dumps(results, indent=1))  # the merge's store: never half-written
    write_markdown(results, out / f"{stem}.md", suite=a.suite)
    if not a.quick and not a.suite:
        plot(results, out / "early_stopping_curve.png")
    print("wrote", out / f"{stem}.md")


def _share(x) -> str:
    """A share as a percentage; "–" for a table measured before the column existed."""
    return "–" if x is None else f"{x:.0%}"


def _cut(s: dict) -> str:
    """The orders that lost the best run: epochs it ran before the cut (median) and trials
    completed before it (median)."""
    e = s.get("best_cut_epochs")
    if "low_completed_share" not in s:
        return "–"
    if not e:
        return "never"
    t = s["best_cut_after_trials"]
    return f"{len(e)}×: epoch {int(np.median(e))}, after {int(np.median(t))} trials"


def _points(res: dict, data_free: bool) -> list[tuple[str, dict]]:
    """The DTG pruner's measured settings (rows and curve points) of one kind."""
    pts = [
        (m, s)
        for m, s in res["methods"].items()
        if m.startswith("DTGPruner") and ("data-free" in m) == data_free and "weight_stats" not in m
    ]
    for label, curve in res.get("curve", {}).items():
        if ("data-free" in label) == data_free:
            pts += [
                (f"threshold {p.get('threshold', 'median')}, min_probability {p['min_probability']}", p) for p in curve
            ]
    return pts


def matched(res: dict) -> list[str]:
    """At equal regret: for MedianPruner and HyperbandPruner, the DTG setting that saves the
    most with a mean regret no larger and R = 0 at least as often, on as many orderings."""
    lines = []
    for ref in ("MedianPruner", "HyperbandPruner"):
        r = res["methods"].get(ref)
        if r is None:
            continue
        for data_free in (True, False):
            ok = [
                (name, p)
                for name, p in _points(res, data_free)
                if p["orderings"] == r["orderings"]
                and p["regret_mean"] <= r["regret_mean"] + 1e-12
                and p["regret_zero_share"] >= r["regret_zero_share"]
            ]
            kind = "data-free" if data_free else "+val_accuracy"
            ref_cell = f"{r['saved_mean']:.3f} (R mean {r['regret_mean']:.4f}, R = 0 {r['regret_zero_share']:.0%})"
            if not ok:
                lines.append(f"| {ref} | {ref_cell} | DTG {kind} | none measured | – |")
                continue
            name, p = max(ok, key=lambda x: x[1]["saved_mean"])
            lines.append(
                f"| {ref} | {ref_cell} | DTG {kind}: {name} | {p['saved_mean']:.3f} (R mean {p['regret_mean']:.4f}, "
                f"R = 0 {p['regret_zero_share']:.0%}) | {p['saved_mean'] - r['saved_mean']:+.3f} |"
            )
    if not lines:
        return []
    return [
        "",
        "At equal regret: the DTG setting (rows above and curve points, same orderings) that saves the most "
        "with a mean regret no larger and R = 0 at least as often as the Optuna pruner:",
        "",
        "| Optuna pruner | its S | DTG pruner | S | ΔS |",
        "|---|---|---|---|---|",
        *lines,
    ]


def _wilson(share: float, n: int) -> str:
    """The 95 % Wilson interval of a share measured on ``n`` orderings."""
    z = 1.96
    c = (share + z * z / (2 * n)) / (1 + z * z / n)
    h = z * np.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"[{max(0.0, c - h):.0%}, {min(1.0, c + h):.0%}]"


#: the README's early-stopping table: these rows, ranged over the suite's sweeps
README_ROWS = (
    "DTGPruner (data-free)",
    "DTGPruner+val_accuracy",
    "DTGPruner+val_accuracy, value_median=None",
    "MedianPruner",
    "HyperbandPruner",
)


#: the data-free pruner with the trials' hyper-parameters (a row of the suite's replay): the
#: default since covariates="auto" (the replayed trials suggest lr and dropout); with the value
COVARIATES = "DTGPruner+covariates (data-free)"
COVARIATES_VALUE = "DTGPruner+covariates+val_accuracy"
#: the with-value pruner as it ships (covariates="auto", value_leader=0.5)
DEFAULT_VALUE = "DTGPruner+val_accuracy (default)"
#: the data-free pruner as it ships (covariates="auto", novelty_guard=True)
DEFAULT_FREE = "DTGPruner (data-free, default)"
#: the with-value default of 2026-12-08 (value_leader=0.75), kept as a row of the pages
LEADER_75 = "DTGPruner+val_accuracy, value_leader=0.75"
#: the same pruners from the checkpoints alone (covariates=None; the default before "auto")
PLAIN, PLAIN_VALUE = "DTGPruner (data-free)", "DTGPruner+val_accuracy"


def goals(results: dict) -> list[str]:
    """Issue #33's early-stopping goals, one row per sweep, met or missed with the numbers.

    The goal rows are the default's: `covariates="auto"` reads the replayed trials' lr and
    dropout, the rows `COVARIATES` and `COVARIATES_VALUE`; a page replayed before those rows
    existed falls back to the pruner without them (and says so)."""
    rows = []
    met = {"free": 0, "value": 0, "n": 0, "plain": 0, "plain_n": 0}
    fallback = False
    for name, res in results["sweeps"].items():
        m = res["methods"]
        plain = m.get(PLAIN)
        free = m.get(DEFAULT_FREE) or m.get(COVARIATES)
        val = m.get(DEFAULT_VALUE) or m.get(COVARIATES_VALUE) or m.get(PLAIN_VALUE)
        if free is None:
            free, plain, fallback = plain, None, True
        med, cold = m.get("MedianPruner"), m.get("DTGPruner cold (data-free)")
        if not (free and val and med):
            continue
        n = free["orderings"]
        ok_free = free["regret_zero_share"] >= 0.95 and free["saved_mean"] >= 0.5
        ok_val = val["saved_mean"] >= med["saved_mean"] and val["regret_mean"] <= med["regret_mean"] + 1e-12
        if plain:
            ok_plain = plain["regret_zero_share"] >= 0.95 and plain["saved_mean"] >= 0.5
            met["plain"] += ok_plain
            met["plain_n"] += 1
        plain_cell = (
            f"{plain['regret_zero_share']:.0%} / {plain['saved_mean']:.3f} ({'met' if ok_plain else 'missed'})"
            if plain
            else "–"
        )
        met["free"] += ok_free
        met["value"] += ok_val
        met["n"] += 1
        first = (
            f"{cold.get('saved_first_mean', float('nan')):.0%} → {free.get('saved_first_mean', float('nan')):.0%}"
            if cold
            else "–"
        )
        rows.append(
            f"| {name} | {free['regret_zero_share']:.0%} {_wilson(free['regret_zero_share'], n)} | "
            f"{free['saved_mean']:.3f} ± {free['saved_ci95']:.3f} | {'met' if ok_free else 'missed'} | "
            f"{val['saved_mean']:.3f} ± {val['saved_ci95']:.3f} / {val['regret_mean']:.4f} ± {val['regret_ci95']:.4f} | "
            f"{med['saved_mean']:.3f} ± {med['saved_ci95']:.3f} / {med['regret_mean']:.4f} ± {med['regret_ci95']:.4f} | "
            f"{'met' if ok_val else 'missed'} | {first} | {plain_cell} |"
        )
    if not rows:
        return []
    rows_used = (
        "the rows without covariates (this page was replayed before they existed)"
        if fallback
        else f"rows `{DEFAULT_FREE}` (else `{COVARIATES}`) and `{DEFAULT_VALUE}` (else `{COVARIATES_VALUE}`, "
        f"else `{PLAIN_VALUE}`), where replayed"
    )
    return [
        "## Goals",
        "",
        "Data-free: `DTGPruner(use_values=False)` keeps the best run (R = 0: a completed trial reaches the "
        "sweep's best final accuracy) in ≥ 95 % of the orderings and saves "
        "≥ 50 % of the compute. With the value: `DTGPruner(use_values=True)` saves at least as much as "
        '`MedianPruner` at no more mean regret. Both as they ship, `covariates="auto"` (the replayed trials '
        f"suggest lr and dropout): {rows_used}. Intervals: 95 % (Wilson for shares, normal for means "
        f"over the orderings). *First {FIRST_TRIALS} trials*: compute saved on the first {FIRST_TRIALS} "
        "trials of a study, cold start without covariates → default. *Checkpoints alone*: the data-free "
        "pruner with `covariates=None`, best kept / S (the data-free goal).",
        "",
        "| sweep | data-free: best kept | data-free: S | goal | with value: S / R mean | MedianPruner: S / R mean "
        f"| goal | first {FIRST_TRIALS} trials (data-free) | checkpoints alone (data-free) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Met: data-free {met['free']} of {met['n']} sweeps; with the value {met['value']} of {met['n']}"
        + (f"; data-free from the checkpoints alone {met['plain']} of {met['plain_n']}." if met["plain_n"] else "."),
        "",
    ]


def ranges(results: dict) -> list[str]:
    """The README's table: for each of `README_ROWS` (and the covariates rows, the default's,
    where every sweep has them), S, R = 0 and mean regret ranged over the sweeps that have every row."""
    sweeps = [r["methods"] for r in results["sweeps"].values() if all(m in r["methods"] for m in README_ROWS)]
    if not sweeps:
        return []
    names = [
        *README_ROWS,
        *(
            c
            for c in (COVARIATES, COVARIATES_VALUE, LEADER_75, DEFAULT_VALUE, DEFAULT_FREE)
            if all(c in m for m in sweeps)
        ),
    ]
    lines = [
        f"## Over the {len(sweeps)} sweeps (the README's table)",
        "",
        "| pruner | S, range over sweeps | R = 0, range over sweeps | R mean, range over sweeps |",
        "|---|---|---|---|",
    ]
    for name in names:
        S = [m[name]["saved_mean"] for m in sweeps]
        Z = [m[name]["regret_zero_share"] for m in sweeps]
        R = [m[name]["regret_mean"] for m in sweeps]
        lines.append(f"| {name} | {min(S):.2f}–{max(S):.2f} | {min(Z):.0%}–{max(Z):.0%} | {min(R):.4f}–{max(R):.4f} |")
    return [*lines, ""]


def write_markdown(results: dict, path: Path, suite: bool = False) -> None:
    lines = [
        f"# Early stopping: replayed sweeps ({results['orderings']} orderings, {results['date']})",
        "",
        "`python benchmarks/bench_early_stopping.py SWEEP ...`. S: share of the sweep's epochs not run; "
        "R: best final accuracy of the sweep minus the best among completed trials; "
        "one test sample is the smallest gap between two runs' final accuracies (1/270 on digits). "
        "Optuna's pruners (and `+val_accuracy`) read the recorded validation accuracy; "
        "`data-free` ones read only the weights. Why: *best run cut* counts the orders that lost "
        "the best run, with the epochs it ran and the trials completed before it was cut (medians); "
        "*kept too long* is the share of the sweep's compute spent on runs below the median final "
        "accuracy that ran to the end (no pruning: about 0.5); – for rows measured before these columns.",
        "",
    ]
    if suite:
        lines[2] = lines[2].replace(
            "`python benchmarks/bench_early_stopping.py SWEEP ...`",
            "`python benchmarks/bench_early_stopping.py --suite --root ROOT [--presets NAME ...]` (the sweeps of "
            f"`dtg_gpu.sweeps.config.SUITE`{' or its check sweeps, `CHECKS`' if set(results['sweeps']) & set(CHECKS) else ''}, "
            f"{len(results['sweeps'])} here: {', '.join(results['sweeps'])}; each trained with "
            "`dtg sweep --preset NAME`)",
        )
        lines += goals(results)
        lines += ranges(results)
    for name, res in results["sweeps"].items():
        lines += [
            f"## {name}: {res['model']}, {res['runs']} runs x {res['checkpoints']} checkpoints"
            + (f" (measured {res['date']})" if res.get("date") else "")
            + (f" (curves {res['curve_date']})" if res.get("curve_date") else "")
            + (f" (rows added {res['rows_added']})" if res.get("rows_added") else ""),
            "",
            "| method | S mean [min, max] | R mean | R max | R = 0 | R ≤ 1 test sample | best survives "
            f"| top-10 % recall | best run cut | kept too long | S, first {FIRST_TRIALS} trials |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for m, s in res["methods"].items():
            lines.append(
                f"| {m} | {s['saved_mean']:.3f} [{s['saved_min']:.3f}, {s['saved_max']:.3f}] | "
                f"{s['regret_mean']:.4f} | {s['regret_max']:.4f} | {s['regret_zero_share']:.0%} | "
                f"{_share(s.get('regret_one_sample_share'))} | {s['best_survives_share']:.0%} | "
                f"{s['top10_recall_mean']:.2f} | {_cut(s)} | "
                f"{_share(s.get('low_completed_share')) if 'low_completed_share' in s else '–'} | "
                f"{_share(s.get('saved_first_mean'))} |"
            )
        for label, pts in res.get("curve", {}).items():
            lines += [
                "",
                f"DTGPruner {label}, over `min_probability` ({pts[0]['orderings']} orderings):",
                "",
                "| min_probability | S mean | R mean | R max | R = 0 | R ≤ 1 test sample | best run cut | kept too long |",
                "|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {p['min_probability']} | {p['saved_mean']:.3f} | {p['regret_mean']:.4f} | {p['regret_max']:.4f} | "
                f"{p['regret_zero_share']:.0%} | {_share(p.get('regret_one_sample_share'))} | {_cut(p)} | "
                f"{_share(p.get('low_completed_share')) if 'low_completed_share' in p else '–'} |"
                for p in pts
            ]
        lines += matched(res)
        lines.append("")
    atomic_write(path, "\n".join(lines))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = results["sweeps"]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4), squeeze=False)
    for ax, (name, res) in zip(axes[0], sweeps.items()):
        for label, pts in res.get("curve", {}).items():
            ax.plot([p["regret_mean"] for p in pts], [p["saved_mean"] for p in pts], "o-", label=f"DTG {label}")
        for m, s in res["methods"].items():
            if not m.startswith("DTG"):
                ax.scatter([s["regret_mean"]], [s["saved_mean"]], marker="x")
                ax.annotate(m.replace("Pruner", ""), (s["regret_mean"], s["saved_mean"]), fontsize=7)
        ax.set_title(f"{name} ({res['model']})")
        ax.set_xlabel("mean regret (accuracy)")
        ax.set_ylabel("compute saved")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
