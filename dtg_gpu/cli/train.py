"""`dtg train`: fit a predictor on a sweep and save it."""

from __future__ import annotations

import argparse

from dtg_gpu.cli.common import (
    Command,
    _classifier,
    _cluster,
    _eigenvalue_flag,
    _features,
    _load_sweep,
    _recipe,
    _scaling,
    _strict,
    _sweep_features,
    _threshold,
    _user_model,
    _writable,
    torch_index,
)


# ------------------------------------------------------------------------------ train
def _train_args(p: argparse.ArgumentParser) -> None:
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


def _train_run(a: argparse.Namespace) -> int:
    from dtg_gpu.predictor.estimator import marked_sets
    from dtg_gpu.predictor.labels import label_runs
    from dtg_gpu.topology.types import weight_layout

    _writable(a.out)

    runs = _load_sweep(a)
    label_runs([r.final_accuracy for r in runs], _threshold(a.threshold))  # fail before solving
    X, names, k, usable, ws = _sweep_features(a, runs)
    clf = _classifier(a)
    clf.set_params(**marked_sets(clf, X))  # before X loses its marks
    runs = [r for r, u in zip(runs, usable) if u]  # failed runs: named in a warning, left out
    X = X[torch_index(usable)]
    y = label_runs([r.final_accuracy for r in runs], _threshold(a.threshold))
    recipe = _recipe(a)
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
            "architecture": weight_layout(runs[0].topology),
        },
    )
    clf.fit(X.double().numpy(), y)
    clf.save(a.out)
    print(f"trained on {len(runs)} runs ({int(y.sum())} sufficient), k={k}: {a.out}")
    return 0


train = Command("train", "fit a predictor on a sweep and save it", _train_args, _train_run)
