"""What the sub-commands share: common flags, loading a sweep with them, featurising it, the user's model, and `Command` (how a module registers a sub-command)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


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
        "batch norm folded, weight statistics, the seed's five statistics as a block of their own"
        + (
            "; a logistic regression on quantile-scaled features per set, the seed's MLP on its block, weighted by out-of-fold stacking)"
            if what != "features"
            else ")"
        ),
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
    p.add_argument(
        "--spec-block",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="option beyond the method: append the seed's five statistics per checkpoint as a block "
        "of their own, which the predictor gives the seed's MLP beside its logistic regressions "
        "(default: on; off with --spec)",
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


def _executor(a: argparse.Namespace) -> dict:
    if a.address and not a.ray:
        raise ValueError("--address needs --ray")
    out = {"executor": "ray" if a.ray else "local", "address": a.address}
    if hasattr(a, "no_cache"):
        out["cache"] = False if a.no_cache else None
    return out


def _load_sweep(a: argparse.Namespace) -> Any:
    from dtg_gpu.sweeps.loading import load_sweep

    return load_sweep(a.sweep, strict=a.strict, model=_build_user_model(a), prefix=a.prefix, pattern=a.pattern)


def _sweep_features(a: argparse.Namespace, runs: Any) -> Any:
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
    k = layout.timesteps(res.column_blocks[0])  # the DTG block comes first
    return X, layout.names, k, usable, ws


def _recipe(a: argparse.Namespace) -> Any:
    """The feature recipe of the command's flags: `--spec` or the default, with overrides."""
    from dtg_gpu.features.temporal import feature_recipe

    return feature_recipe(
        "spec" if getattr(a, "spec", False) else "default",
        per_layer=getattr(a, "per_layer", None),
        eigenvalue=getattr(a, "eigenvalue", None),
        fold_batchnorm=getattr(a, "fold_batchnorm", None),
        weight_stats=getattr(a, "weight_stats", None),
        spec_block=getattr(a, "spec_block", None),
    )


def _weight_stat_names(run: Any) -> list[str]:
    """Column names of the weight statistics: `ws_<layer>_<statistic>`."""
    stats = ("mean", "std", "min", "q25", "median", "q75", "max")
    return [f"ws_{p.removesuffix('.weight')}_{s}" for p in run.topology.params for s in stats]


def _json_safe(obj: Any) -> Any:
    """NaN and ±Inf as null: JSON has no such numbers (`json.dumps` would print bare NaN)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


@dataclass(frozen=True)
class Command:
    """A sub-command: its name and help, how it configures its parser, and what it runs."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    def add_parser(self, sub: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(self.name, help=self.help, description=self.help)
        self.configure(p)
        p.set_defaults(func=self.run)
        return p


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


def _build_user_model(a: argparse.Namespace) -> Any:
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


def _scaling(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--head-weights",
        choices=("stacked", "equal"),  # predictor.HEAD_WEIGHTS
        default=None,
        help="how the default's per-feature-set models are combined: stacked (the default: weights "
        "from 3-fold out-of-fold probabilities of the training split, halfway to equal) or equal "
        "(their mean, the default until 2026-12-07)",
    )


def _classifier(a: argparse.Namespace) -> Any:
    """The predictor of the command's flags: the default, or the seed's MLP with `--spec`;
    `--scaling`, `--select`, `--auto`, `--head-weights` and `--epochs` override."""
    from dtg_gpu.predictor.estimator import PerformancePredictor

    clf = PerformancePredictor.spec() if getattr(a, "spec", False) else PerformancePredictor()
    changes = {"select": a.select, "auto": a.auto}
    if getattr(a, "head_weights", None) is not None:
        changes["head_weights"] = a.head_weights
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


def torch_index(mask: np.ndarray) -> Any:
    """A NumPy boolean mask as a torch index."""
    import torch

    return torch.as_tensor(mask)


def _threshold(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text
