"""Each sub-command: `add_parser(subparsers)` and `run(args) -> int`, calling the library."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from dtg_gpu.sweeps.config import LR_SCHEDULES, OPTIMIZERS, PRESETS


def _device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA when available)")


def _features(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timesteps", "-k", type=_positive_int, default=None, help="use the first k checkpoints (default: all)"
    )
    p.add_argument("--alpha", type=float, default=0.5, help="temporal reinforcement in (0, 1] (default 0.5)")
    _device(p)


def _spec_flag(p: argparse.ArgumentParser, what: str = "features") -> None:
    p.add_argument(
        "--spec",
        action="store_true",
        help=f"the seed's method exactly ({what}): the five centrality statistics per checkpoint"
        + (" and an MLP of 32 on standardised features" if what != "features" else "")
        + "; default: the suite's best recipe (per-layer statistics and log lambda_1 of the graph with "
        "batch norm folded, weight statistics"
        + (", a logistic regression on quantile-scaled features)" if what != "features" else ")"),
    )


def _eigenvalue_flag(p: argparse.ArgumentParser) -> None:
    _spec_flag(p, "features" if p.prog.split()[-1] == "featurize" else "features and classifier")
    p.add_argument(
        "--per-layer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the five statistics of each layer's nodes too (default: on; off with --spec)",
    )
    p.add_argument(
        "--eigenvalue",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="log(lambda_1) as a last statistic per timestep (default: on; off with --spec)",
    )
    p.add_argument(
        "--weight-stats",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="append the weight statistics of checkpoint k (default: on; off with --spec)",
    )
    _family_flags(p, tri_state=True)


def _family_flags(p: argparse.ArgumentParser, tri_state: bool = False) -> None:
    p.add_argument(
        "--fold-batchnorm",
        action=argparse.BooleanOptionalAction if tri_state else "store_true",
        default=None if tri_state else False,
        help="edges from the inference-time weights of layers followed by batch norm "
        "(gamma/sqrt(var+eps) * W per output channel)" + ("; default: on, off with --spec" if tri_state else ""),
    )
    p.add_argument(
        "--covariates",
        nargs="+",
        default=[],
        metavar="FIELD",
        help="option beyond the method: append these run.json fields (e.g. lr dropout; rates as log10)",
    )


def _strict(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first run that cannot be read or solved (default: name it, "
        "leave it out, go on with the rest)",
    )


def _cluster(p: argparse.ArgumentParser, cache: bool = True) -> None:
    p.add_argument(
        "--ray",
        action="store_true",
        help="run the work as Ray tasks (pip install 'dtg_gpu[ray]'); without --address, "
        "on a local Ray instance started and shut down by this command",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="the Ray cluster to use with --ray: 'auto', HOST:6379 or ray://HOST:10001",
    )
    if cache:
        p.add_argument(
            "--no-cache", action="store_true", help="neither read nor write the feature cache (SWEEP/.dtg-cache)"
        )


def _executor(a) -> dict:
    if a.address and not a.ray:
        raise ValueError("--address needs --ray")
    out = {"executor": "ray" if a.ray else "local", "address": a.address}
    if hasattr(a, "no_cache"):
        out["cache"] = False if a.no_cache else None
    return out


def _load_sweep(a):
    from dtg_gpu.sweeps.loading import load_sweep

    return load_sweep(a.sweep, strict=a.strict, model=_build_user_model(a), prefix=a.prefix, pattern=a.pattern)


def _sweep_features(a, runs):
    """Featurise `runs` with the command's flags: `(X, statistic names, k, usable)`;
    `usable[i]` is False for a run that could not be read or solved (its row is NaN)."""
    from dtg_gpu.analysis import extract_features
    from dtg_gpu.core.failures import warn_failures
    from dtg_gpu.exceptions import TopologyError
    from dtg_gpu.features.layout import StatisticsLayout
    from dtg_gpu.features.temporal import feature_recipe

    recipe = _recipe(a)
    res = extract_features(
        runs,
        a.timesteps,
        alpha=a.alpha,
        device=a.device,
        progress=True,
        strict=a.strict,
        covariates=a.covariates,
        features=feature_recipe(recipe),
        **_executor(a),
    )
    X, failures = res.features, res.failures
    warn_failures(failures)
    usable = np.array([r.name not in failures for r in runs], dtype=bool)
    if not usable.any():
        raise TopologyError("no run of the sweep could be read: " + "; ".join(list(failures.values())[:3]))
    first = runs[int(np.flatnonzero(usable)[0])]
    layout = StatisticsLayout.of(first.topology, per_layer=recipe.per_layer, eigenvalue=recipe.eigenvalue)
    ws = _weight_stat_names(first) if recipe.weight_stats else []
    k = layout.timesteps(X.shape[1] - len(a.covariates) - len(ws))
    return X, layout.names, k, usable, ws


def _recipe(a):
    """The feature recipe of the command's flags: `--spec` or the default, with overrides."""
    from dtg_gpu.features.temporal import feature_recipe

    return feature_recipe(
        "spec" if getattr(a, "spec", False) else "default",
        per_layer=getattr(a, "per_layer", None),
        eigenvalue=getattr(a, "eigenvalue", None),
        fold_batchnorm=getattr(a, "fold_batchnorm", None),
        weight_stats=getattr(a, "weight_stats", None),
    )


def _weight_stat_names(run) -> list[str]:
    """Column names of the weight statistics: `ws_<layer>_<statistic>`."""
    stats = ("mean", "std", "min", "q25", "median", "q75", "max")
    return [f"ws_{p.removesuffix('.weight')}_{s}" for p in run.topology.params for s in stats]


def _json_safe(obj):
    """NaN and ±Inf as null: JSON has no such numbers (`json.dumps` would print bare NaN)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _command(name: str, help: str, configure, run):
    def add_parser(sub):
        p = sub.add_parser(name, help=help, description=help)
        configure(p)
        p.set_defaults(func=run)
        return p

    return SimpleNamespace(add_parser=add_parser, run=run)


# ------------------------------------------------------------------------------ sweep
def _sweep_args(p):
    p.add_argument(
        "--preset",
        default=None,
        choices=tuple(PRESETS),
        help="a sweep of the benchmark suite; the flags below override its fields",
    )
    p.add_argument(
        "--model", default=None, help="lenet5, vgg11/13/16/19, resnet18/34, resnet20/32, mobilenet-s (default lenet5)"
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="digits (offline, default), shapes (offline, procedural), mnist, cifar10, cifar100",
    )
    p.add_argument("--lr", type=float, nargs="+", default=None, help="default 0.001 0.01 0.1")
    p.add_argument("--dropout", type=float, nargs="+", default=None, help="default 0 0.3 0.6")
    p.add_argument("--seeds", type=int, default=None, help="default 1")
    p.add_argument("--epochs", type=int, default=None, help="default 20")
    p.add_argument("--checkpoint-every", type=int, default=None, help="default 1")
    p.add_argument("--checkpoint-unit", choices=["epoch", "step"], default=None, help="default epoch")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="default sgd")
    p.add_argument("--momentum", type=float, default=None, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=None, help="L2 weight decay (default 0)")
    p.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default=None,
        help="per-epoch learning rate: constant, cosine, or step (x0.1 after 1/2 and 3/4 of the epochs); default constant",
    )
    p.add_argument(
        "--width",
        type=float,
        default=None,
        help="VGG: channel multiplier (e.g. 0.0625); resnet20/32: base width (16); mobilenet-s: base width (8)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=32,
        help="runs of one seed trained at once as one grouped network (1: one at a time)",
    )
    p.add_argument("--data-root", default="data", help="where MNIST/CIFAR live (default ./data)")
    p.add_argument("--download", action="store_true", help="let torchvision download a missing dataset")
    p.add_argument("--out", required=True, help="sweep folder (resumable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _device(p)
    _cluster(p, cache=False)


def _width_kwargs(model: str, width: float | None) -> dict:
    if width is None:
        return {}
    if not width > 0:
        raise ValueError(f"--width must be positive, got {width}")
    if model.startswith("vgg"):
        return {"width": width}
    if model.replace("-", "") in ("resnet20", "resnet32", "mobilenets") and float(width).is_integer():
        return {"width": int(width)}
    raise ValueError(
        f"--width applies to vgg* (a multiplier) and resnet20/32, mobilenet-s (an integer base width), "
        f"not to {model} with {width}"
    )


def _sweep_run(a) -> int:
    from dtg_gpu.sweeps.config import SweepConfig
    from dtg_gpu.sweeps.runner import run_sweep

    base = SweepConfig.preset(a.preset) if a.preset else SweepConfig()
    given = {
        "model": a.model,
        "dataset": a.dataset,
        "lrs": a.lr,
        "dropouts": a.dropout,
        "seeds": a.seeds,
        "epochs": a.epochs,
        "checkpoint_every": a.checkpoint_every,
        "checkpoint_unit": a.checkpoint_unit,
        "batch_size": a.batch_size,
        "optimizer": a.optimizer,
        "momentum": a.momentum,
        "weight_decay": a.weight_decay,
        "lr_schedule": a.lr_schedule,
    }
    changes: dict = {k: v for k, v in given.items() if v is not None}
    model = changes.get("model", base.model)
    if a.width is not None:  # other keywords of the preset's model (VGG's batch_norm) are kept
        same = model == base.model
        changes["model_kwargs"] = {**(base.model_kwargs if same else {}), **_width_kwargs(model, a.width)}
    elif "model" in changes and model != base.model:
        changes["model_kwargs"] = {}  # the preset's width belongs to the preset's model
    cfg = SweepConfig.preset(a.preset, **changes) if a.preset else SweepConfig(**changes)
    if a.group_size < 1:
        raise ValueError(f"--group-size must be >= 1, got {a.group_size}")
    out = run_sweep(
        cfg,
        a.out,
        data_root=a.data_root,
        download=a.download,
        device=a.device,
        progress=not a.quiet,
        group_size=a.group_size,
        **_executor(a),
    )
    print(f"sweep complete: {out}")
    return 0


sweep = _command(
    "sweep", "train a lr x dropout x seed grid of one model (writes the on-disk format)", _sweep_args, _sweep_run
)


# ---------------------------------------------------------------------------- analyze
def _user_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        metavar="PKG.MODULE:CLASS",
        help="your own model class (importable; built with --model-kwargs), for run folders "
        "without run.json (Lightning, Hugging Face, numbered files)",
    )
    p.add_argument("--model-kwargs", default="{}", metavar="JSON", help="keyword arguments of --model")
    p.add_argument("--prefix", default=None, help="key prefix of the weights in the checkpoints (e.g. 'ema.')")
    p.add_argument(
        "--pattern",
        default=None,
        metavar="GLOB",
        help="which checkpoint files of a run folder without run.json (e.g. 'ema_*.pt' beside model_*.pt)",
    )


def _build_user_model(a):
    """`--model pkg.module:Class` with `--model-kwargs`: the user's own code, imported."""
    if a.model is None:
        return None
    import importlib

    if ":" not in a.model:
        raise ValueError(f"--model must be PKG.MODULE:CLASS, got {a.model!r}")
    mod_name, _, attr = a.model.partition(":")
    try:
        kwargs = json.loads(a.model_kwargs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--model-kwargs is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise ValueError("--model-kwargs must be a JSON object")
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would: the working folder first
        sys.path.insert(0, os.getcwd())
    try:
        cls: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--model {a.model!r}: {exc}") from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"--model {a.model!r} with --model-kwargs {kwargs}: {exc}") from None


def _analyze_args(p):
    p.add_argument(
        "run",
        help="a run folder: run.json + checkpoints, or (with --model) Lightning "
        "*.ckpt, Hugging Face checkpoint-N/ or numbered checkpoint files",
    )
    _user_model(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--alpha", type=float, default=0.5, help="temporal reinforcement in (0, 1] (default 0.5)")
    p.add_argument(
        "--dtype", choices=["float32", "float64"], default="float32", help="solver precision (default float32)"
    )
    p.add_argument("--tol", type=float, default=1e-6, help="convergence tolerance of the centrality (default 1e-6)")
    p.add_argument(
        "--method",
        choices=["auto", "lanczos", "networkx"],
        default="auto",
        help="eigen-solver: auto (Lanczos), lanczos, or networkx's (A + I) power iteration (default auto)",
    )
    p.add_argument(
        "--registration-order",
        action="store_true",
        help="a model that cannot be traced: chain its conv/linear layers in registration order "
        "(right only for plain chains) instead of refusing it",
    )
    _device(p)


def _analyze_run(a) -> int:
    import torch

    from dtg_gpu.analysis import analyze
    from dtg_gpu.io.checkpoints import Run

    run = Run.from_dir(a.run, model=_build_user_model(a), prefix=a.prefix, pattern=a.pattern)
    run.fallback = a.registration_order
    res = analyze(run, alpha=a.alpha, device=a.device, dtype=getattr(torch, a.dtype), tol=a.tol, method=a.method)
    if a.json:
        print(json.dumps(_json_safe(res.to_dict()), indent=2, allow_nan=False))
    else:
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_columns", 30):
            cols = [
                "t",
                "mean",
                "std",
                "median",
                "skewness",
                "kurtosis",
                "eigenvalue",
                "iterations",
                "converged",
                "connected",
            ]
            print(
                f"{res.run.name}: {res.topology.num_nodes} nodes, {res.topology.num_edges} edges, "
                f"{len(res)} checkpoints"
            )
            cov = res.coverage
            mats = cov[cov["shape"].map(len) >= 2]
            graphed = int((mats["role"] == "graphed").sum())
            print(
                f"coverage: {graphed} of {len(mats)} weight matrices in the graph; "
                + ", ".join(f"{n} {role}" for role, n in cov["role"].value_counts().items())
            )
            for _, row in mats[mats["role"] != "graphed"].iterrows():
                print(f"  not graphed: {row['parameter']} {list(row['shape'])}: {row['reason']}")
            print(res.table()[cols].to_string(index=False))
    return 0


analyze = _command("analyze", "centrality statistics of every checkpoint of one run", _analyze_args, _analyze_run)


# -------------------------------------------------------------------------- featurize
def _featurize_args(p):
    p.add_argument("sweep", help="sweep folder (sweep.json), or with --model a folder of your own run folders")
    _user_model(p)
    p.add_argument("--out", required=True, help="write features here (.csv)")
    _features(p)
    _eigenvalue_flag(p)
    _strict(p)
    _cluster(p)


def _featurize_run(a) -> int:
    import pandas as pd

    from dtg_gpu.core.files import atomic_write

    _writable(a.out)

    runs = _load_sweep(a)
    X, names, k, _, ws = _sweep_features(a, runs)
    cols = [f"{s}_t{t + 1}" for t in range(k) for s in names] + ws + list(a.covariates)
    df = pd.DataFrame(X.double().numpy(), columns=cols)
    df.insert(0, "run", [r.name for r in runs])
    df.insert(1, "final_accuracy", [r.final_accuracy for r in runs])
    left_out = list(getattr(runs, "failed", {}))  # runs that could not even be loaded: NaN rows too
    if left_out:
        df = pd.concat([df, pd.DataFrame({"run": left_out})], ignore_index=True)[df.columns]
    atomic_write(a.out, lambda tmp: df.to_csv(tmp, index=False))
    print(f"{len(df)} runs x {X.shape[1]} features -> {a.out}")
    return 0


featurize = _command("featurize", "temporal features of every run of a sweep (CSV)", _featurize_args, _featurize_run)


# ------------------------------------------------------------------------------ train
def _train_args(p):
    p.add_argument("sweep", help="sweep folder (sweep.json), or with --model a folder of your own run folders")
    _user_model(p)
    p.add_argument("--out", required=True, help="predictor file (.safetensors)")
    p.add_argument("--threshold", default="median", help="accuracy threshold, 'median' or 'qX'")
    p.add_argument("--epochs", type=int, default=None, help="training epochs of the classifier (default 300)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the classifier's initialisation and batches (default 0)"
    )
    _features(p)
    _eigenvalue_flag(p)
    _scaling(p)
    _strict(p)
    _cluster(p)


def _scaling(p):
    # predictor.SCALINGS, spelled out so that parsing arguments does not import torch
    p.add_argument(
        "--scaling",
        choices=("standard", "quantile"),
        default=None,
        help="feature scaling before the classifier: quantile (normal scores of the training ranks; "
        "the default) or standard (the seed's method, the default with --spec)",
    )
    p.add_argument(
        "--select",
        type=_positive_int,
        default=None,
        metavar="M",
        help="train the MLP on the M features with the largest ANOVA F between the classes "
        "in the training split (option beyond the method; default: all features)",
    )
    p.add_argument(
        "--auto",
        action="store_true",
        help="option beyond the method: choose the scaling and --select by 3-fold cross-validation "
        "inside each training split (nested; overrides --scaling and --select)",
    )


def _classifier(a):
    """The predictor of the command's flags: the default, or the seed's MLP with `--spec`;
    `--scaling`, `--select`, `--auto` and `--epochs` override."""
    from dtg_gpu.predictor.estimator import PerformancePredictor

    clf = PerformancePredictor.spec() if getattr(a, "spec", False) else PerformancePredictor()
    changes = {"select": a.select, "auto": a.auto}
    if a.scaling is not None:
        changes["scaling"] = a.scaling
    if getattr(a, "epochs", None) is not None:
        changes["epochs"] = a.epochs
    return clf.set_params(**changes)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _writable(out: str) -> None:
    """Fail before any work when `--out` cannot be written (no such folder, a folder, an
    empty name, a special file, a name too long)."""
    from dtg_gpu.core.files import check_target

    check_target(out, what="--out")


def torch_index(mask: np.ndarray):
    """A NumPy boolean mask as a torch index."""
    import torch

    return torch.as_tensor(mask)


def _threshold(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _train_run(a) -> int:
    from dtg_gpu.predictor.estimator import architecture_signature, label_runs

    _writable(a.out)

    runs = _load_sweep(a)
    label_runs([r.final_accuracy for r in runs], _threshold(a.threshold))  # fail before solving
    X, names, k, usable, ws = _sweep_features(a, runs)
    blocks = getattr(X, "column_blocks", None)
    runs = [r for r, u in zip(runs, usable) if u]  # failed runs: named in a warning, left out
    X = X[torch_index(usable)]
    y = label_runs([r.final_accuracy for r in runs], _threshold(a.threshold))
    recipe = _recipe(a)
    clf = _classifier(a)
    if clf.blocks == "auto":
        clf.set_params(blocks=blocks)
    clf.set_params(
        random_state=a.seed,
        feature_settings={
            "alpha": a.alpha,
            "timesteps": k,
            "threshold": a.threshold,
            "statistics": names,
            "features": "spec" if a.spec else "default",
            **recipe.to_dict(),
            "covariates": list(a.covariates),
            "architecture": architecture_signature(runs[0].topology),
        },
    )
    clf.fit(X.double().numpy(), y)
    clf.save(a.out)
    print(f"trained on {len(runs)} runs ({int(y.sum())} sufficient), k={k}: {a.out}")
    return 0


train = _command("train", "fit a predictor on a sweep and save it", _train_args, _train_run)


# ---------------------------------------------------------------------------- predict
def _predict_args(p):
    p.add_argument("predictor", help="file written by 'dtg train'")
    p.add_argument("runs", nargs="+", help="run folders")
    p.add_argument(
        "--min-probability",
        type=float,
        default=0.3,
        help="verdict 'stop' below this P(sufficient) (default 0.3, as dtg watch)",
    )
    _user_model(p)
    _device(p)
    _strict(p)


def _predict_run(a) -> int:
    from dtg_gpu.core.failures import READ_ERRORS
    from dtg_gpu.io.checkpoints import Run
    from dtg_gpu.predictor.estimator import PerformancePredictor

    clf = PerformancePredictor.load(a.predictor)
    runs, bad = [], {}
    model = _build_user_model(a)
    for folder in a.runs:
        try:
            runs.append(Run.from_dir(folder, model=model, prefix=a.prefix, pattern=a.pattern))
        except READ_ERRORS as exc:
            if a.strict:
                raise
            bad[folder] = str(exc)
    proba: Any = clf.predict_runs(runs, device=a.device, strict=a.strict)[:, -1] if runs else []
    if not 0 <= a.min_probability <= 1:
        raise ValueError(f"--min-probability must be in [0, 1], got {a.min_probability}")
    for run, p in zip(runs, proba):
        verdict = "failed" if not np.isfinite(p) else ("sufficient" if p >= 0.5 else "insufficient")
        action = "" if not np.isfinite(p) else ("\tstop" if p < a.min_probability else "\tcontinue")
        print(f"{run.name}\tP(sufficient)={p:.3f}\t{verdict}{action}")
    for folder, why in bad.items():
        print(f"{folder}\tP(sufficient)=nan\tfailed: {why}")
    return 1 if bad or not np.isfinite(np.asarray(proba, dtype=float)).all() else 0


predict = _command("predict", "predict whether runs end sufficient", _predict_args, _predict_run)


# --------------------------------------------------------------------------- evaluate
def _evaluate_args(p):
    p.add_argument("sweep", help="sweep folder (sweep.json), or with --model a folder of your own run folders")
    _user_model(p)
    p.add_argument(
        "--threshold", default="median", help="sufficient accuracy: a number, 'median' or 'qX' (default median)"
    )
    p.add_argument("--repeats", type=int, default=20, help="stratified 90/10 splits to score on (default 20)")
    p.add_argument(
        "--features",
        nargs="+",
        default=["default", "dtg"],
        help="default (the library's default recipe and classifier), dtg (the seed's method), weight_stats, "
        "spectral, dtg+weight_stats, dtg+eigenvalue, dtg_per_layer, dtg_per_layer+eigenvalue, "
        "learning_curve, covariates (the hyper-parameters alone); default: default dtg",
    )
    p.add_argument("--json", action="store_true", help="print the scores as JSON instead of a table")
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="also write an HTML report (every run's P(sufficient) and verdict, plots) into DIR",
    )
    _features(p)
    _family_flags(p)
    _scaling(p)
    _strict(p)
    _cluster(p)


def _evaluate_run(a) -> int:
    from dtg_gpu.predictor.estimator import PerformancePredictor
    from dtg_gpu.predictor.evaluation import METRICS
    from dtg_gpu.workflow.report import results_table
    from dtg_gpu.workflow.verdicts import FEATURE_SETS, compare, featurize_sweep

    unknown = [f for f in a.features if f not in FEATURE_SETS]
    if unknown:
        raise ValueError(f"unknown feature set(s) {unknown}; choose from {', '.join(FEATURE_SETS)}")
    sf = featurize_sweep(
        _load_sweep(a),
        alpha=a.alpha,
        device=a.device,
        progress=True,
        strict=a.strict,
        fold_batchnorm=a.fold_batchnorm,
        **_executor(a),
    )
    k = a.timesteps or sf.timesteps
    if k > sf.timesteps:
        from dtg_gpu.exceptions import InsufficientCheckpointsError

        raise InsufficientCheckpointsError(f"--timesteps {k}: the sweep's runs have only {sf.timesteps} checkpoints")
    rows = compare(
        sf,
        [k],
        a.features,
        threshold=_threshold(a.threshold),
        repeats=a.repeats,
        clf=(
            None  # each row's own: the seed's MLP for dtg, the default classifier for the others
            if a.scaling is None and a.select is None and not a.auto
            else PerformancePredictor(**({"scaling": a.scaling} if a.scaling else {}), select=a.select, auto=a.auto)
        ),
        covariates=a.covariates,
    )
    if a.report:
        from dtg_gpu.analysis import analyze
        from dtg_gpu.workflow.report import write_report
        from dtg_gpu.workflow.verdicts import run_verdicts

        usable = [r for r, ok in zip(sf.runs, sf.usable) if ok]
        example = analyze(usable[len(usable) // 2], device=a.device) if usable else None
        verdicts = run_verdicts(sf, [k], features=a.features[0], threshold=_threshold(a.threshold))
        index = write_report(
            Path(a.report), sf, rows, example, rows[0], title=f"dtg evaluate: {a.sweep}", verdicts=verdicts
        )
        print(f"report: {index}", file=sys.stderr)
    if a.json:
        print(
            json.dumps(
                _json_safe(
                    [{"features": r["features"], "k": r["k"], **{m: r["scores"][m] for m in METRICS}} for r in rows]
                ),
                indent=2,
                allow_nan=False,
            )
        )
    else:
        print(results_table(rows))
    return 0


evaluate = _command("evaluate", "repeated 90/10 evaluation of the predictor on a sweep", _evaluate_args, _evaluate_run)


# ------------------------------------------------------------------------------ bench
def _bench_args(p):
    p.add_argument("--quick", action="store_true", help="small graphs only")
    p.add_argument("--out", default="benchmarks/results", help="results folder")


def _bench_run(a) -> int:
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_centrality.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} not found: 'dtg bench' runs from a source checkout")
    runpy.run_path(str(script))["main"]((["--quick"] if a.quick else []) + ["--out", a.out])
    return 0


bench = _command("bench", "run the centrality benchmark (from a source checkout)", _bench_args, _bench_run)


# -------------------------------------------------------------------------------- env
def _env_args(p):
    pass


def _env_run(a) -> int:
    import platform

    import networkx
    import scipy
    import sklearn
    import torch
    import torch_geometric

    from dtg_gpu.core.version import __version__

    print(f"dtg_gpu         {__version__}")
    print(f"python          {platform.python_version()} ({platform.platform()})")
    for mod in (torch, torch_geometric, networkx, scipy, sklearn, np):
        print(f"{mod.__name__:<15} {mod.__version__}")
    print(f"cuda available  {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        print(f"cuda device     {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})")
    print(f"cpu threads     {torch.get_num_threads()}")
    try:
        import torch_scatter  # noqa: F401

        print("torch-scatter   installed (optional)")
    except ImportError:
        print("torch-scatter   not installed (optional)")
    return 0


env = _command("env", "versions, device and CUDA, for bug reports", _env_args, _env_run)


# ------------------------------------------------------------------------------- demo
def _demo_args(p):
    p.add_argument("--quick", action="store_true", help="a one-minute version")
    p.add_argument(
        "--out", default="demo-out", help="folder for the sweep, results.json and report/ (default demo-out)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _device(p)
    _strict(p)


def _demo_run(a) -> int:
    from dtg_gpu.workflow.demo import run_demo

    run_demo(a.out, quick=a.quick, device=a.device, progress=not a.quiet, strict=a.strict)
    return 0


demo = _command("demo", "train the digits sweep, featurise, evaluate, write a report", _demo_args, _demo_run)


# ------------------------------------------------------------------------------ watch
def _watch_args(p):
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
    _user_model(p)
    _device(p)


def _watch_run(a) -> int:
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


watch = _command(
    "watch", "as checkpoints land: each run's P(sufficient) and a stop/continue verdict", _watch_args, _watch_run
)
