"""What the stopping rule reads: one record per checkpoint (the DTG statistics, per layer, log λ₁, weight statistics, folded too), the feature vector of a run's first k records, peer scores and divergence."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dtg_gpu.features.layout import StatisticsLayout
from dtg_gpu.features.temporal import check_alpha, temporal_features

__all__ = [
    "RECORD_FEATURE_SETS",
    "checkpoint_record",
    "run_records",
    "many_run_records",
    "feature_vector",
    "peer_score",
    "is_diverged",
    "architecture_key",
]


RECORD_FEATURE_SETS = (
    "dtg",
    "dtg+eigenvalue",
    "dtg_per_layer",
    "dtg_per_layer+eigenvalue",
    "dtg+weight_stats",
    "dtg_per_layer+eigenvalue+weight_stats",
    "dtg_per_layer+eigenvalue+weight_stats+spec_block",
)


def _floats(x) -> list:
    return [float(v) if math.isfinite(v) else None for v in (float(u) for u in x)]


def _as_array(x) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in x], dtype=float)


def _statistics_blocks(stats: torch.Tensor, layout: StatisticsLayout) -> list[dict]:
    """Per timestep of `stats [T, F]` (per-layer and eigenvalue layout): the record's
    graph statistics, JSON-able."""
    spec, layers, lam = layout.split(stats.double())
    assert layers is not None and lam is not None  # run_records asks for both
    return [
        {"dtg": _floats(spec[t]), "per_layer": _floats(layers[t]), "log_eigenvalue": _floats(lam[t : t + 1])[0]}
        for t in range(spec.shape[0])
    ]


def _records_from_stats(
    blocks: list[dict], weight_stats: Sequence[Sequence[float] | None], folded: list[dict] | None = None
) -> list[dict]:
    return [
        {
            **b,
            "weight_stats": None if weight_stats[t] is None else _floats(weight_stats[t]),
            **({"folded": folded[t]} if folded is not None else {}),
        }
        for t, b in enumerate(blocks)
    ]


def run_records(run, device=None, start: int = 0) -> list[dict]:
    """The [`checkpoint_record`][dtg_gpu.early_stopping.records.checkpoint_record] of each checkpoint of `run` from `start` on, solved as
    one batch.

    Raises
    ------
    CheckpointError, TopologyError
        A checkpoint cannot be read or the model cannot be traced (names it).
    """
    from dtg_gpu.analysis import extract_features
    from dtg_gpu.features.baselines import tensor_statistics
    from dtg_gpu.features.temporal import FeatureRecipe
    from dtg_gpu.io.run import Run
    from dtg_gpu.topology.types import weight_layout

    part = Run(
        model=run.model,
        checkpoints=list(run.checkpoints)[start:],
        name=run.name,
        meta=run.meta,
        prefix=run.prefix,
        fallback=getattr(run, "fallback", False),
    )
    if len(part) == 0:
        return []

    layout = StatisticsLayout.of(part.topology, per_layer=True, eigenvalue=True)

    def solve(fold: bool) -> list[dict]:
        recipe = FeatureRecipe(per_layer=True, eigenvalue=True, fold_batchnorm=fold, weight_stats=False)
        stats = extract_features([part], len(part), features=recipe, device=device, strict=True).statistics
        return _statistics_blocks(stats[0], layout)

    folds = any(layer.batchnorm for layer in part.topology.layers)
    params = part.topology.params
    ws = []
    for t in range(len(part)):
        w = part.weights(t)
        ws.append([v for p in params for v in tensor_statistics(w[p])])
    arch = architecture_key(weight_layout(part.topology))
    return [{**r, "architecture": arch} for r in _records_from_stats(solve(False), ws, solve(True) if folds else None)]


def many_run_records(
    runs: Sequence, starts: Sequence[int], device=None, weight_stats: bool = True
) -> list[list[dict] | str]:
    """[`run_records`][dtg_gpu.early_stopping.records.run_records] of many runs at once: runs of one architecture with the same
    number of new checkpoints are solved as one batch (as [`featurize`][dtg_gpu.featurize]
    batches a sweep), instead of one solve per run. Each entry is the run's records, or the
    reason (a string) why they could not be made. `weight_stats=False`: the records' weight
    statistics are `None` (half the time of a pass goes to their quantiles; a rule that
    does not read them, [`StoppingRule.needs_weight_stats`][dtg_gpu.early_stopping.rule.StoppingRule.needs_weight_stats], skips them).
    """
    from dtg_gpu.analysis import extract_features
    from dtg_gpu.core.failures import READ_ERRORS
    from dtg_gpu.features.baselines import tensor_statistics
    from dtg_gpu.features.temporal import FeatureRecipe
    from dtg_gpu.io.run import Run
    from dtg_gpu.topology.types import weight_layout

    out: list[list[dict] | str] = [[] for _ in runs]
    groups: dict[tuple, list[int]] = {}
    parts = []
    for i, (run, start) in enumerate(zip(runs, starts)):
        part = Run(
            model=run.model,
            checkpoints=list(run.checkpoints)[start:],
            name=run.name,
            meta=run.meta,
            prefix=run.prefix,
            fallback=getattr(run, "fallback", False),
        )
        parts.append(part)
        if len(part) == 0:
            continue
        try:
            groups.setdefault((id(part.topology), len(part)), []).append(i)
        except READ_ERRORS as exc:
            out[i] = f"{type(exc).__name__}: {exc}"
    for (_, k), idx in groups.items():
        batch = [parts[i] for i in idx]
        topo = batch[0].topology
        layout = StatisticsLayout.of(topo, per_layer=True, eigenvalue=True)
        folds = any(layer.batchnorm for layer in topo.layers)
        solved = {}
        failures: dict[str, str] = {}
        for fold in (False, True) if folds else (False,):
            recipe = FeatureRecipe(per_layer=True, eigenvalue=True, fold_batchnorm=fold, weight_stats=False)
            res = extract_features(batch, k, features=recipe, device=device)
            solved[fold] = res.statistics
            failures.update(res.failures)
        arch = architecture_key(weight_layout(topo))
        for j, i in enumerate(idx):
            part = parts[i]
            if str(part.name) in failures:
                out[i] = failures[str(part.name)]
                continue
            ws: list = []
            try:
                for t in range(k if weight_stats else 0):
                    w = part.weights(t)
                    ws.append([v for p in topo.params for v in tensor_statistics(w[p])])
            except READ_ERRORS as exc:
                out[i] = f"{type(exc).__name__}: {exc}"
                continue
            folded = _statistics_blocks(solved[True][j], layout) if folds else None
            recs = _records_from_stats(_statistics_blocks(solved[False][j], layout), ws or [None] * k, folded)
            out[i] = [{**r, "architecture": arch} for r in recs]
    return out


def architecture_key(signature: Sequence) -> str:
    """A short hash of [`weight_layout`][dtg_gpu.topology.types.weight_layout] (what each checkpoint
    record carries, so a predictor of another architecture is refused)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_record(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None, device=None) -> dict:
    r"""Summarise one checkpoint for early stopping.

    Parameters
    ----------
    model : torch.nn.Module
        The architecture (traced once per architecture).
    state : mapping, optional
        The checkpoint's state dict (default: the model's current weights).
    device : optional
        Where the centrality is solved (default: CUDA when available).

    Returns
    -------
    dict
        `dtg` (the five statistics of the centrality vector), `log_eigenvalue`
        ($\log\lambda_1$), `per_layer` (the five statistics of each layer's nodes, see
        `layer_node_groups`), `weight_stats` (mean, std and five
        quantiles of each weight layer). Non-finite numbers are `None` (JSON-able). When the
        network has batch norm to fold (see `featurize` with batch norm folded), `folded`
        holds `dtg`, `per_layer` and `log_eigenvalue` of the graph of its
        inference-time effective weights too (a second solve).

    Examples
    --------
    >>> from torch import nn
    >>> rec = checkpoint_record(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    >>> len(rec["dtg"]), len(rec["weight_stats"])
    (5, 14)
    """
    from dtg_gpu.io.run import Run

    if state is None:
        state = {k: v.detach() for k, v in model.state_dict().items()}
    return run_records(Run(model=model, checkpoints=[dict(state)]), device=device)[0]


def _columns(rec: Mapping[str, Any], features: str, fold_batchnorm: bool = False) -> list:
    if fold_batchnorm and rec.get("folded"):  # a net without batch norm to fold has no block
        rec = rec["folded"]
    cols = list(rec.get("dtg") or [None] * 5)
    if features.startswith("dtg_per_layer"):
        cols += list(rec.get("per_layer") or [])
    if "+eigenvalue" in features:
        cols.append(rec.get("log_eigenvalue"))
    return cols


def feature_vector(
    records: Sequence[Mapping[str, Any]],
    k: int,
    features: str = "dtg",
    alpha: float = 0.5,
    values: Sequence[float | None] | None = None,
    fold_batchnorm: bool = False,
) -> np.ndarray:
    """The feature of a run's first `k` checkpoint records: the method's temporal feature
    (`5·k` numbers for `"dtg"`), then the weight statistics of checkpoint `k`
    (`"dtg+weight_stats"`), then the seed's `5·k` columns again as their own block
    (`"+spec_block"`, as `featurize`'s default recipe), then the first `k` reported values
    when `values` is given.
    `fold_batchnorm`: the graph statistics of the records' `folded` block where they
    have one (a network with batch norm to fold), as `featurize` with batch norm folded.

    Examples
    --------
    >>> recs = [{"dtg": [1.0, 2, 3, 4, 5]}, {"dtg": [3.0, 2, 1, 0, 5]}]
    >>> feature_vector(recs, 2).tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0, 2.0, 2.0, 2.0, 2.0, 5.0]
    """
    if features not in RECORD_FEATURE_SETS:
        raise ValueError(f"features must be one of {', '.join(RECORD_FEATURE_SETS)}; got {features!r}")
    if not 1 <= k <= len(records):
        raise ValueError(f"k must be in [1, {len(records)}], got {k!r}")
    spec_block = features.endswith("+spec_block")
    features = features.removesuffix("+spec_block")
    rows = [_as_array(_columns(r, features, fold_batchnorm)) for r in records[:k]]
    width = {len(r) for r in rows}
    if len(width) != 1:
        raise ValueError(
            "checkpoint records of one run have different widths (per-layer statistics of different architectures?)"
        )
    stats = torch.from_numpy(np.stack(rows))
    out = [temporal_features(stats, check_alpha(alpha)).numpy()]
    if features.endswith("+weight_stats"):
        ws = records[k - 1].get("weight_stats")
        if ws is None:
            raise ValueError("these checkpoint records were made without weight statistics (weight_stats=False)")
        out.append(_as_array(ws))
    if spec_block:  # every row leads with the graph's five statistics: the first 5 of each timestep
        out.append(out[0].reshape(k, -1)[:, :5].reshape(-1))
    if values is not None:
        out.append(_as_array(list(values)[:k]))
    return np.concatenate(out)


def _finite_record(rec: Mapping[str, Any]) -> bool:
    d = rec.get("dtg")
    return d is not None and len(d) > 0 and all(v is not None for v in d)


def is_diverged(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the latest checkpoint's centrality statistics are not finite (its weights
    hold a NaN or an infinity, or its graph could not be solved)."""
    return bool(records) and not _finite_record(records[-1])


def peer_score(records: Sequence[Mapping[str, Any]], k: int) -> float | None:
    r"""What a run's first `k` checkpoint records say before any run has finished: the growth
    of its graph's leading eigenvalue since the first checkpoint,
    $\log\lambda_1(k) - \log\lambda_1(1)$.

    A run that learns makes the weights that carry its signal larger, and the spectral radius
    of the channel graph with them; a run whose learning rate is too small for it to learn
    barely moves it. On the eight sweeps of the benchmark suite the best run's score was
    never below the 38th percentile of all runs' from the second checkpoint on (on six of
    them never below the 61st), and the score's ROC AUC against the median label at 25 % of
    training was 0.43–0.95 (`benchmarks/results/peer_score_loso.md`). `None` before the second checkpoint
    (nothing has grown yet); `-inf` when the eigenvalue is not finite (a diverged run).

    Examples
    --------
    >>> peer_score([{"log_eigenvalue": 1.0}, {"log_eigenvalue": 1.5}], 2)
    0.5
    """
    if k < 2 or len(records) < k:
        return None
    first, last = records[0].get("log_eigenvalue"), records[k - 1].get("log_eigenvalue")
    if first is None or last is None or not (math.isfinite(first) and math.isfinite(last)):
        return -math.inf
    return float(last) - float(first)


def _share_below(x: float, others: np.ndarray) -> float:
    """The share of `others` below `x`, ties counted half (a percentile rank in [0, 1])."""
    return float(((others < x).sum() + 0.5 * (others == x).sum()) / len(others))
