"""`dtg watch`: as checkpoints land, each run's P(sufficient) and a stop/continue verdict."""

from __future__ import annotations

import argparse
import json

from dtg_gpu.cli.common import Command, _build_user_model, _device, _json_safe, _positive_int, _threshold, _user_model


# ------------------------------------------------------------------------------ watch
def _watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", help="sweep folder being trained (dtg sweep --out), or a folder of run folders")
    p.add_argument(
        "--predictor",
        default=None,
        help="file written by 'dtg train' (default: learn online from the sweep's finished runs)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per run and pass, for scripts")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between passes (default 30)")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--min-probability", type=float, default=0.3, help="stop below this P(sufficient) (default 0.3)")
    p.add_argument("--patience", type=_positive_int, default=1, help="checks in a row below it (default 1)")
    p.add_argument(
        "--n-startup",
        type=int,
        default=10,
        help="finished runs needed before the verdicts are learned from them (default 10); before that a "
        "run is compared with the others at the same checkpoint",
    )
    p.add_argument(
        "--no-warm-start",
        dest="warm_start",
        action="store_false",
        help="no verdict before --n-startup runs have finished (default: compare a run with its peers)",
    )
    p.add_argument(
        "--no-novelty-guard",
        dest="novelty_guard",
        action="store_false",
        help="let the learned model stop a run unlike every finished run (default: it does not)",
    )
    p.add_argument(
        "--threshold", default="median", help="sufficient: final accuracy >= 'median', 'qX' (e.g. q0.75) or a number"
    )
    p.add_argument(
        "--features",
        default="dtg_per_layer",
        help="dtg, dtg+eigenvalue, dtg_per_layer (default), dtg_per_layer+eigenvalue, dtg+weight_stats",
    )
    p.add_argument(
        "--fold-batchnorm",
        action="store_true",
        help="judge from the graph with batch norm folded into the layer before it (no effect without batch norm)",
    )
    p.add_argument(
        "--covariates",
        nargs="+",
        default=["auto"],
        metavar="NAME",
        help="hyper-parameters the verdicts also learn from: auto (default: the numbers of each run's grid "
        "point in sweep.json, seeds left out), none (the checkpoints alone), or run.json field names (e.g. lr dropout)",
    )
    _user_model(p)
    _device(p)


def _covariates(names: list[str]) -> str | list[str] | None:
    """`--covariates`: `auto`, `none`, or names (`auto` and `none` only alone)."""
    low = [n.lower() for n in names]
    if low in (["auto"], ["none"]):
        return None if low == ["none"] else "auto"
    if "auto" in low or "none" in low:
        raise ValueError(f"--covariates takes auto, none or hyper-parameter names, not a mix: {' '.join(names)}")
    return names


def _watch_run(a: argparse.Namespace) -> int:
    from dtg_gpu.early_stopping.rule import StoppingRule
    from dtg_gpu.predictor.estimator import PerformancePredictor
    from dtg_gpu.workflow.watch import SweepWatcher, check_interval

    check_interval(a.interval, "--interval")
    clf = PerformancePredictor.load(a.predictor) if a.predictor else None
    rule = StoppingRule(
        predictor=clf,
        min_probability=a.min_probability,
        patience=a.patience,
        n_startup_trials=a.n_startup,
        threshold=_threshold(a.threshold),
        features=a.features,
        use_values=False,
        fold_batchnorm=a.fold_batchnorm,
        warm_start=a.warm_start,
        novelty_guard=a.novelty_guard,
        covariates=_covariates(a.covariates),
    )
    watcher = SweepWatcher(a.sweep, rule=rule, model=_build_user_model(a), device=a.device)
    shown: dict[str, tuple] = {}
    for verdicts in watcher.watch(interval=a.interval, once=a.once):
        for v in verdicts:
            key = (v.checkpoints, v.verdict)
            if shown.get(v.run) == key:
                continue  # print a run again only when it changed
            shown[v.run] = key
            if a.json:
                print(json.dumps(_json_safe(v.to_dict())), flush=True)
            else:
                p = "-" if v.p_sufficient is None else f"{v.p_sufficient:.3f}"
                extra = (
                    f"\tfinal={v.final_accuracy:.4f}"
                    if v.final_accuracy is not None
                    else (f"\t{v.error}" if v.error else "")
                )
                print(f"{v.run}\tk={v.checkpoints}\tP(sufficient)={p}\t{v.verdict}{extra}", flush=True)
    return 0


watch = Command(
    "watch", "as checkpoints land: each run's P(sufficient) and a stop/continue verdict", _watch_args, _watch_run
)
