r"""`analyze` one run and `featurize` many: the public face of steps 2–4."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from dtg_gpu.centrality import Method
from dtg_gpu.core.devices import parse_device, resolve_device
from dtg_gpu.core.failures import READ_ERRORS, unique_name, warn_failures
from dtg_gpu.core.validation import check_int
from dtg_gpu.engine.executors import default_cache, featurize_runs
from dtg_gpu.engine.options import SolverOptions
from dtg_gpu.engine.solve import SolvedGraphs, warn_results
from dtg_gpu.engine.units import SolveSettings, solve_graphs
from dtg_gpu.exceptions import CheckpointError, DTGWarning, InsufficientCheckpointsError
from dtg_gpu.features.covariates import covariate_matrix
from dtg_gpu.features.statistics import STATISTICS, layer_node_groups, timestep_statistics
from dtg_gpu.features.temporal import FeatureRecipe, check_alpha, feature_recipe, temporal_features
from dtg_gpu.graph.convert import to_networkx as _to_networkx
from dtg_gpu.graph.convert import to_pyg
from dtg_gpu.graph.scaling import load_blocks
from dtg_gpu.io.run import Run
from dtg_gpu.topology.types import ChannelTopology

__all__ = ["AnalysisResult", "analyze", "featurize", "extract_features", "FeatureResult"]


@dataclass
class AnalysisResult(SolvedGraphs):
    r"""Everything [`analyze`][dtg_gpu.analyze] learns about one run.

    Attributes
    ----------
    centrality : Tensor `[T, N]`
        Eigenvector centrality per timestep, nodes in method step 2 order. NaN rows for
        checkpoints with non-finite weights.
    eigenvalue, residual : Tensor `[T]`
        `λ₁` and the relative residual `‖Ax − λx‖₂/λ`.
    iterations : LongTensor `[T]`
    converged, finite, connected : BoolTensor `[T]`
        Solver converged; weights all finite; positive-weight graph connected (else the
        Perron vector is not unique).
    stats : Tensor `[T, 5]`
        Mean, std, median, skewness, kurtosis of each timestep (before smoothing).
    features : Tensor `[5·T]`
        Smoothed statistics, concatenated in time order.
    """

    run: Run
    topology: ChannelTopology
    stats: torch.Tensor
    features: torch.Tensor
    alpha: float
    settings: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.centrality.shape[0]

    def _blocks(self, t: int):
        if not -len(self) <= t < len(self):
            raise IndexError(f"timestep {t} out of range for a run of {len(self)} checkpoints")
        t = t % len(self)
        blocks, _ = load_blocks(self.topology, [self.run.weights(t)], torch.device("cpu"), self.centrality.dtype)
        return blocks

    def graph(self, t: int):
        """Timestep `t` as `torch_geometric.data.Data(edge_index, edge_weight, num_nodes)`.

        Both directions of every edge, self-loops once, parallel edges summed. The weights
        are re-read from checkpoint `t`.
        """
        return to_pyg(self.topology, self._blocks(t), 0)

    def to_networkx(self, t: int):
        """Timestep `t` as a `networkx.Graph` with edge attribute `"weight"`."""
        return _to_networkx(self.topology, self._blocks(t), 0)

    @property
    def coverage(self):
        """Every parameter of the model and its role in the graph (see
        [`coverage`][dtg_gpu.ChannelTopology.coverage])."""
        return self.topology.coverage()

    def table(self):
        """One row per timestep: statistics, smoothed statistics and solver flags (pandas)."""
        t = len(self)
        return statistics_frame(
            self.stats[None],
            self.features.reshape(1, t, len(STATISTICS)),
            {"run": [self.run.name]},
            eigenvalue=self.eigenvalue.tolist(),
            residual=self.residual.tolist(),
            iterations=self.iterations.tolist(),
            converged=self.converged.tolist(),
            finite=self.finite.tolist(),
            connected=self.connected.tolist(),
        )

    def to_dict(self) -> dict:
        """Plain-Python summary (JSON-serialisable): per-timestep table and settings."""
        return {
            "run": self.run.name,
            "num_nodes": self.topology.num_nodes,
            "num_layers": len(self.topology.layers),
            "alpha": self.alpha,
            "settings": self.settings,
            "timesteps": self.table().to_dict(orient="records"),
        }


def analyze(
    run: Run,
    *,
    alpha: float = 0.5,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    tol: float = 1e-6,
    max_iter: int = 1000,
    method: Method = "auto",
    chunk_size: int | None = None,
    fold_batchnorm: bool = False,
    solver: SolverOptions | None = None,
) -> AnalysisResult:
    r"""Centrality, statistics and temporal features of every checkpoint of one run.

    Parameters
    ----------
    run : Run
    alpha : float in (0, 1], default 0.5
        Temporal reinforcement constant (method step 4).
    device : str or torch.device, optional
        `None` picks CUDA when available, else the CPU.
    dtype, tol, max_iter, method, chunk_size
        The solver's settings ([`SolverOptions`][dtg_gpu.SolverOptions]; NetworkX's names).
        For float64 agreement with NetworkX to 1e-9, ask `tol=1e-10`.
    fold_batchnorm : bool, default False
        **Option beyond the method.** Edges from the inference-time weights of layers
        followed by batch norm, $\gamma/\sqrt{\sigma^2+\varepsilon}\cdot W$ per output
        channel ([`fold_batchnorm`][dtg_gpu.ChannelTopology.fold_batchnorm]).
    solver : SolverOptions, optional
        The solver's settings as one object; `dtype` … `chunk_size` given beside it
        replace its fields.

    Returns
    -------
    AnalysisResult

    Raises
    ------
    ValueError
        An empty run, or a bad parameter (named in the message).
    CheckpointError
        A checkpoint is unreadable or does not fit the model (names the file and parameter).

    Warns
    -----
    NonFiniteWeightsWarning
        A checkpoint holds NaN or Inf weights: its centrality is NaN and `finite` is False.
    ConvergenceWarning
        The solver stopped at `max_iter` above `tol` for some checkpoint (`converged` False;
        `residual` says how far).
    DisconnectedGraphWarning
        A graph is disconnected (or all zero): its Perron vector is not unique
        (`connected` False).

    Examples
    --------
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 2))
    >>> res = analyze(Run(model=net, checkpoints=[net.state_dict()] * 3), device="cpu")
    >>> res.centrality.shape, res.stats.shape, res.features.shape
    (torch.Size([3, 7]), torch.Size([3, 5]), torch.Size([15]))
    """
    if not isinstance(run, Run):
        raise TypeError(f"analyze expects a dtg_gpu.Run, got {type(run).__name__}")
    if len(run) == 0:
        raise ValueError(f"run {run.name!r} has no checkpoints")
    alpha = check_alpha(alpha)
    solver = _solver_options(solver, dtype=dtype, tol=tol, max_iter=max_iter, method=method, chunk_size=chunk_size)
    dev = resolve_device(device)
    topo = run.topology.folded if fold_batchnorm else run.topology
    out = solve_graphs([run], len(run), topo, dev, solver)
    warn_results([(run, t) for t in range(len(run))], out)
    first = next((e for e in out.error if e is not None), None)
    if first is not None:
        raise CheckpointError(first)
    stats = timestep_statistics(out.centrality)
    settings = {**solver.to_dict(), "device": str(dev), "fold_batchnorm": bool(fold_batchnorm)}
    settings.pop("chunk_size", None)
    return AnalysisResult(
        run=run,
        topology=topo,
        **out.solved_fields(),
        stats=stats,
        features=temporal_features(stats, alpha),
        alpha=alpha,
        settings=settings,
    )


def _solver_options(solver: SolverOptions | None, **flat: Any) -> SolverOptions:
    """`solver` (default options when `None`) with the flat keywords that were given (not at
    their defaults) put in."""
    if solver is None:
        solver = SolverOptions()
    if not isinstance(solver, SolverOptions):
        raise TypeError(f"solver must be a dtg_gpu.SolverOptions, got {type(solver).__name__}")
    default = SolverOptions()
    changed = {k: v for k, v in flat.items() if not (v is getattr(default, k) or v == getattr(default, k))}
    return dataclasses.replace(solver, **changed) if changed else solver


def featurize(
    runs: Sequence[Run],
    timesteps: int | None = None,
    *,
    features: str | FeatureRecipe = "default",
    alpha: float = 0.5,
    device: str | torch.device | None = None,
    solver: SolverOptions | None = None,
    covariates: Sequence[str] = (),
    strict: bool = False,
    progress: bool = False,
) -> torch.Tensor:
    r"""Temporal features of many runs, one row each.

    `features="spec"` is the seed's method exactly: the five centrality statistics of each
    of the first `k` checkpoints, smoothed, `[len(runs), 5·k]`. The default,
    `features="default"`, is the recipe that gave the best verdict on the benchmark suite
    (`FEATURE_RECIPES`): per-layer statistics and $\log\lambda_1$ of the graph with batch
    norm folded, then the weight statistics of the `k`-th checkpoint, then the seed's `5·k`
    columns of that graph as a block of their own (covariates, when given, come last). A
    [`FeatureRecipe`][dtg_gpu.features.temporal.FeatureRecipe] chooses each part:
    `features=feature_recipe("default", weight_stats=False)`.

    Runs that share an architecture are solved together, `runs·k` graphs per batch
    (chunked to a memory budget).

    Parameters
    ----------
    runs : sequence of Run
    timesteps : int, optional
        `k`: use the first `k` checkpoints of each run (default: the shortest run's length).
    features : {"default", "spec"} or FeatureRecipe, default "default"
        **Options beyond the method** in the recipe: `per_layer` (the five statistics of each
        layer's nodes too, layers of at least 3 nodes: `F = 5 + 5·L`; every run must then
        have as many such layers), `eigenvalue` ($\log\lambda_1$ appended per timestep,
        `F + 1`: the unit-norm centrality is blind to the weights' scale), `fold_batchnorm`
        ([`fold_batchnorm`][dtg_gpu.ChannelTopology.fold_batchnorm]) and `weight_stats`
        (mean, std and five quantiles of each weight layer at checkpoint `k`,
        [`weight_statistics`][dtg_gpu.features.baselines.weight_statistics]), `spec_block` (the
        seed's `5·k` columns of the solved graph appended as a block of their own, which
        `PerformancePredictor()` gives the seed's MLP beside its logistic regressions).
    alpha, device
        As in [`analyze`][dtg_gpu.analyze].
    solver : SolverOptions, optional
        The solver's settings (dtype, tol, max_iter, method, chunk_size).
    covariates : sequence of str, default ()
        **Option beyond the method.** Hyper-parameters of each run, read from its
        `meta` (`run.json`), appended last in this order
        ([`covariate_matrix`][dtg_gpu.features.covariates.covariate_matrix]: learning rates and weight
        decay as `log10`). A run without one of them is a failed run.
    strict : bool, default False
        `False`: a run whose model cannot be traced or one of whose first `k` checkpoints
        cannot be read gets a NaN row, and one
        [`FailedRunsWarning`][dtg_gpu.exceptions.FailedRunsWarning] names every such run
        with its file and cause; the rest is computed. `True`: the first such error is raised.
    progress : bool, default False
        Show a tqdm bar over graphs.

    Returns
    -------
    Tensor `[len(runs), F·k + W + 5·k + len(covariates)]` (`5·k` with `spec_block`)
        Its `column_blocks` attribute holds the widths of its feature sets (DTG, weight
        statistics, the seed's block, covariates) and `column_block_models` the model of
        each (`"mlp"` for the seed's block), which `PerformancePredictor(blocks="auto")` and
        [`evaluate`][dtg_gpu.evaluate] read. A run with non-finite weights has NaN features
        from that timestep on; a failed run has a NaN row.
        [`extract_features`][dtg_gpu.analysis.extract_features] also returns the raw
        statistics and the failures.

    Raises
    ------
    ValueError
        No runs, `alpha` outside (0, 1], `timesteps < 1`.
    InsufficientCheckpointsError
        A run has fewer than `k` checkpoints (the message names it).
    CheckpointError, TopologyError
        With `strict=True`, a run that cannot be read.
    """
    res = extract_features(
        runs,
        timesteps,
        features=features,
        alpha=alpha,
        device=device,
        solver=solver,
        covariates=covariates,
        strict=strict,
        progress=progress,
    )
    warn_failures(res.failures, stacklevel=3)
    return res.features


@dataclass
class FeatureResult:
    """What [`extract_features`][dtg_gpu.analysis.extract_features] returns.

    Attributes
    ----------
    features : Tensor `[R, F·k + W + C]`
        [`featurize`][dtg_gpu.featurize]'s matrix (with its `column_blocks`).
    statistics : Tensor `[R, k, F]`
        The raw per-timestep statistics, before smoothing.
    failures : dict of str to str
        Each run that could not be read or solved (its rows are NaN), with the reason.
    column_blocks : tuple of int
        Widths of the feature sets in `features`, in order.
    column_block_models : tuple of str
        The model [`PerformancePredictor`][dtg_gpu.PerformancePredictor] gives each set
        (`"mlp"` for the seed's block of `spec_block=True`, else `"linear"`).
    """

    features: torch.Tensor
    statistics: torch.Tensor
    failures: dict[str, str]
    column_blocks: tuple[int, ...]
    column_block_models: tuple[str, ...] = ()


def statistics_frame(stats: torch.Tensor, smoothed: torch.Tensor, per_run: dict[str, list], **per_row: list):
    """The tidy per-timestep table shared by [`AnalysisResult.table`][dtg_gpu.AnalysisResult.table] and
    [`table`][dtg_gpu.AnalysisResult.table] (pandas): one row per (run, t) with the
    `per_run` columns (one value per run, repeated; `t` after the first), the five
    statistics, the smoothed ones, then the `per_row` columns (one value per row)."""
    import pandas as pd

    r, t = int(stats.shape[0]), int(stats.shape[1])
    data: dict[str, Any] = {}
    for j, (name, values) in enumerate(per_run.items()):
        data[name] = [v for v in values for _ in range(t)]
        if j == 0:  # the run's name, then t
            data["t"] = list(range(t)) * r
    flat, flat_smooth = stats.reshape(r * t, -1), smoothed.reshape(r * t, -1)
    for i, s in enumerate(STATISTICS):
        data[s] = flat[:, i].double().tolist()
    for i, s in enumerate(STATISTICS):
        data[f"{s}_smoothed"] = flat_smooth[:, i].double().tolist()
    data.update(per_row)
    return pd.DataFrame(data)


def extract_features(
    runs: Sequence[Run],
    timesteps: int | None = None,
    *,
    features: str | FeatureRecipe = "default",
    alpha: float = 0.5,
    device: str | torch.device | None = None,
    solver: SolverOptions | None = None,
    covariates: Sequence[str] = (),
    strict: bool = False,
    progress: bool = False,
    executor: Literal["local", "ray"] = "local",
    address: str | None = None,
    cache: Any = False,
) -> FeatureResult:
    """[`featurize`][dtg_gpu.featurize]'s work, with everything it learns: the features, the
    raw statistics and the failed runs (named, not warned about: the caller decides).

    `executor`, `address` and `cache` as in
    [`featurize_sweep`][dtg_gpu.workflow.verdicts.featurize_sweep] (default here: no cache).
    """
    recipe = feature_recipe(features)
    solver = _solver_options(solver)
    cache = default_cache(runs, cache)
    runs = list(runs)
    if not runs:
        raise ValueError("featurize needs at least one run; the sweep is empty")
    alpha = check_alpha(alpha)
    k = _timesteps(runs, timesteps)
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    dev = (None if device is None else parse_device(device)) if executor == "ray" else resolve_device(device)
    failures: dict[str, str] = {}
    failed_rows: list[int] = []

    def fail(i: int, reason: str) -> None:
        failures[unique_name(runs[i], i, failures)] = reason
        failed_rows.append(i)

    cov, missing = covariate_matrix(runs, covariates)
    for i, reason in missing.items():
        if strict:
            raise ValueError(reason)
        fail(i, reason)
    groups = _architecture_groups(runs, recipe, set(missing), strict, fail)
    settings = SolveSettings(
        k=k,
        solver=solver,
        per_layer=recipe.per_layer,
        eigenvalue=recipe.eigenvalue,
        fold_batchnorm=recipe.fold_batchnorm,
    )
    stats, why = featurize_runs(
        runs, groups, settings, dev, cache=cache, executor=executor, address=address, progress=progress, strict=strict
    )
    for i in sorted(why):
        fail(i, why[i])
    if failed_rows:
        stats[failed_rows] = float("nan")
    feats = temporal_features(stats, alpha)
    block_widths, models = [feats.shape[1]], ["linear"]
    if recipe.weight_stats:
        ws = _weight_stats(runs, k, failures, failed_rows, strict).to(feats.dtype)
        block_widths.append(ws.shape[1])
        models.append("linear")
        feats = torch.cat([feats, ws], 1)
    if recipe.spec_block:  # the seed's 5·k columns: the whole graph's statistics lead each timestep
        n, r = len(STATISTICS), len(runs)
        block_widths.append(n * k)
        models.append("mlp")
        feats = torch.cat([feats, feats[:, : block_widths[0]].reshape(r, k, -1)[..., :n].reshape(r, n * k)], 1)
    feats[failed_rows] = float("nan")  # with the runs whose weight statistics failed
    if covariates:  # always last
        cov[failed_rows] = float("nan")
        block_widths.append(cov.shape[1])
        models.append("linear")
        feats = torch.cat([feats, cov.to(feats.dtype)], 1)
    # the feature sets, in order: PerformancePredictor(blocks="auto") gives each a model of its own
    blocks = tuple(w for w in block_widths if w)
    block_models = tuple(m for m, w in zip(models, block_widths) if w)
    feats.column_blocks = blocks  # type: ignore[attr-defined]
    feats.column_block_models = block_models  # type: ignore[attr-defined]
    return FeatureResult(
        features=feats, statistics=stats, failures=failures, column_blocks=blocks, column_block_models=block_models
    )


def _timesteps(runs: list[Run], timesteps: int | None) -> int:
    """`k`: `timesteps`, or the shortest run's length (with a warning when runs differ)."""
    shortest = min(runs, key=len)
    if timesteps is None:
        k = len(shortest)
        if len(max(runs, key=len)) != k:
            warnings.warn(
                f"runs have {k} to {len(max(runs, key=len))} checkpoints; using the first {k} of "
                f"each (run {shortest.name!r} is the shortest): pass timesteps= to choose",
                DTGWarning,
                stacklevel=4,
            )
    else:
        k = check_int("timesteps", timesteps)
    short = [r for r in runs if len(r) < k]
    if short:
        raise InsufficientCheckpointsError(
            f"timesteps={k} but run {short[0].name!r} has only {len(short[0])} checkpoints"
            + (f" ({len(short) - 1} more runs are too short)" if len(short) > 1 else "")
        )
    return k


def _architecture_groups(
    runs: list[Run], recipe: FeatureRecipe, skip: set[int], strict: bool, fail: Any
) -> list[tuple[ChannelTopology, list[int]]]:
    """The runs' rows grouped by architecture (traced once each; a run that cannot be traced
    fails), checked to give rows of one width."""
    groups: dict[int, list[int]] = {}
    topos: dict[int, ChannelTopology] = {}
    for i, run in enumerate(runs):
        if i in skip:
            continue
        try:
            topo = run.topology.folded if recipe.fold_batchnorm else run.topology
        except READ_ERRORS as exc:
            if strict:
                raise
            fail(i, f"{type(exc).__name__}: {exc}")
            continue
        groups.setdefault(id(topo), []).append(i)
        topos[id(topo)] = topo
    widths = {len(layer_node_groups(t)) for t in topos.values()} if recipe.per_layer else set()
    if len(widths) > 1:
        raise ValueError(
            f"per_layer=True (the default features) needs runs with the same number of layers of >= 3 nodes; "
            f"got {sorted(widths)}: featurize runs of one architecture at a time, or pass features='spec'"
        )
    return [(topos[key], idx) for key, idx in groups.items()]


def _weight_stats(runs: Sequence[Run], k: int, failures: dict, failed_rows: list[int], strict: bool) -> torch.Tensor:
    """Weight statistics of checkpoint `k` for every run (NaN rows for failed runs; a run
    that fails here is added to `failures`)."""
    from dtg_gpu.features.baselines import weight_statistics

    rows: list[Any] = [None] * len(runs)
    for i, run in enumerate(runs):
        if i in failed_rows:
            continue
        try:
            rows[i] = weight_statistics([run], k)[0]
        except READ_ERRORS as exc:
            if strict:
                raise
            failures[unique_name(run, i, failures)] = f"{type(exc).__name__}: {exc}"
            failed_rows.append(i)
    widths = {len(r) for r in rows if r is not None}
    if len(widths) > 1:
        raise ValueError(
            f"weight statistics need runs of one architecture (widths {sorted(widths)}); "
            "pass weight_stats=False or features='spec'"
        )
    width = widths.pop() if widths else 0
    out = torch.full((len(runs), width), float("nan"), dtype=torch.float64)
    for i, r in enumerate(rows):
        if r is not None and i not in failed_rows:
            out[i] = torch.as_tensor(r, dtype=torch.float64)
    return out
