"""Covariates: the known hyper-parameters of each run (from its run.json), as columns after the temporal features."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dtg_gpu.core.validation import is_finite_number
from dtg_gpu.io.run import Run

__all__ = ["covariate_matrix", "covariate_value", "LOG_COVARIATES"]


#: covariates taken as log10: rates that span decades
LOG_COVARIATES = ("lr", "learning_rate", "weight_decay", "wd")


def covariate_value(name: str, v: object) -> float:
    r"""One hyper-parameter as a covariate column takes it: $\log_{10}$ for `LOG_COVARIATES`
    (0 as -10), the number itself otherwise; NaN when it is not a finite number (a bool is not)."""
    x = float(v) if is_finite_number(v) else math.nan
    if name in LOG_COVARIATES:
        x = math.log10(x) if x > 0 else (-10.0 if x == 0 else math.nan)
    return x


def covariate_matrix(runs: Sequence[Run], names: Sequence[str]) -> tuple[torch.Tensor, dict[int, str]]:
    r"""The known hyper-parameters of each run: `[len(runs), len(names)]` (float64).

    Each name is looked up in `run.meta` (a sweep's `run.json`). Names in
    `LOG_COVARIATES` (learning rate, weight decay: rates that span decades) are taken as
    $\log_{10}$ (`weight_decay = 0` as `-10`); others as they are (dropout, momentum,
    batch size, seed).

    Returns
    -------
    (Tensor, dict)
        The matrix, NaN where a value is missing or not a finite number, and per such row the
        reason (it names the run and the field).

    Raises
    ------
    ValueError
        `names` is not a sequence of strings, or no run has one of them.
    """
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"covariates must be a list of run.json field names, got {names!r}")
    out = torch.full((len(runs), len(names)), float("nan"), dtype=torch.float64)
    missing: dict[int, str] = {}
    for j, name in enumerate(names):
        found = False
        for i, run in enumerate(runs):
            v = run.meta.get(name) if isinstance(run.meta, dict) else None
            x = covariate_value(name, v)
            if math.isfinite(x):
                out[i, j] = x
                found = True
            elif i not in missing:
                missing[i] = f"covariate {name!r}: run.json of run {run.name!r} has no finite number for it ({v!r})"
        if not found:
            raise ValueError(
                f"covariate {name!r} is in no run's run.json"
                + (
                    f" (fields: {', '.join(sorted(runs[0].meta)[:12])})"
                    if runs and isinstance(runs[0].meta, dict)
                    else ""
                )
            )
    return out, missing
