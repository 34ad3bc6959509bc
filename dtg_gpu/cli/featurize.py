"""`dtg featurize`: temporal features of every run of a sweep, as CSV."""

from __future__ import annotations

import argparse

from dtg_gpu.cli.common import (
    Command,
    _cluster,
    _eigenvalue_flag,
    _features,
    _load_sweep,
    _strict,
    _sweep_features,
    _user_model,
    _writable,
)


# -------------------------------------------------------------------------- featurize
def _featurize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", help="sweep folder (sweep.json), or with --model a folder of your own run folders")
    _user_model(p)
    p.add_argument("--out", required=True, help="write features here (.csv)")
    _features(p)
    _eigenvalue_flag(p)
    _strict(p)
    _cluster(p)


def _featurize_run(a: argparse.Namespace) -> int:
    import pandas as pd

    from dtg_gpu.core.files import atomic_write
    from dtg_gpu.features.statistics import STATISTICS

    _writable(a.out)

    runs = _load_sweep(a)
    X, names, k, _, ws = _sweep_features(a, runs)
    cols = [f"{s}_t{t + 1}" for t in range(k) for s in names] + ws
    if "mlp" in getattr(X, "column_block_models", ()):  # --spec-block: the seed's columns, before covariates
        cols += [f"spec:{s}_t{t + 1}" for t in range(k) for s in STATISTICS]
    cols += list(a.covariates)
    df = pd.DataFrame(X.double().numpy(), columns=cols)
    df.insert(0, "run", [r.name for r in runs])
    df.insert(1, "final_accuracy", [r.final_accuracy for r in runs])
    left_out = list(getattr(runs, "failed", {}))  # runs that could not even be loaded: NaN rows too
    if left_out:
        df = pd.concat([df, pd.DataFrame({"run": left_out})], ignore_index=True)[df.columns]
    atomic_write(a.out, lambda tmp: df.to_csv(tmp, index=False))
    print(f"{len(df)} runs x {X.shape[1]} features -> {a.out}")
    return 0


featurize = Command("featurize", "temporal features of every run of a sweep (CSV)", _featurize_args, _featurize_run)
