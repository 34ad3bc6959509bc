"""Units of work: the settings a solve depends on, one unit of whole runs, solving it and caching its result. What the local and the Ray executor both run, so their results are bit-identical."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dtg_gpu.engine.cache import CachedRun, FeatureCache, cache_architecture_key, run_id, unit_key
from dtg_gpu.engine.options import SolverOptions
from dtg_gpu.engine.plan import Unit, plan_units
from dtg_gpu.engine.solve import GraphBatchResult, concat_results, iter_solve
from dtg_gpu.features.layout import StatisticsLayout
from dtg_gpu.features.statistics import layer_node_groups, layer_statistics, timestep_statistics
from dtg_gpu.io.run import Run
from dtg_gpu.topology.types import ChannelTopology


@dataclass(frozen=True)
class SolveSettings:
    """What the statistics of a graph depend on (beyond its checkpoint and its batch)."""

    k: int
    solver: SolverOptions
    per_layer: bool
    eigenvalue: bool
    fold_batchnorm: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.solver.dtype

    def key(self) -> dict[str, Any]:
        folded = {"fold_batchnorm": True} if self.fold_batchnorm else {}  # absent: keys of older caches hold
        return {
            **folded,
            "dtype": str(self.solver.dtype),
            "tol": float(self.solver.tol),
            "max_iter": int(self.solver.max_iter),
            "method": self.solver.method,
            "per_layer": bool(self.per_layer),
            "eigenvalue": bool(self.eigenvalue),
        }

    def layout(self, topology: ChannelTopology) -> StatisticsLayout:
        return StatisticsLayout.of(topology, self.per_layer, self.eigenvalue)

    def width(self, topology: ChannelTopology) -> int:
        return self.layout(topology).width


@dataclass
class UnitResult:
    """A solved unit: one [`CachedRun`][dtg_gpu.engine.cache.CachedRun] per run, and per run the
    `k` read errors (`None` where the checkpoint was read)."""

    entries: list[CachedRun]
    errors: list[list[str | None]]


@dataclass
class Job:
    """One unit of one architecture's runs, with what it needs to be solved and cached."""

    runs: list[Run]
    rows: list[int]  # the runs' rows in the caller's list
    unit: Unit
    topology: ChannelTopology
    key: str | None = None  # cache key; None: not cacheable
    result: UnitResult | None = field(default=None, repr=False)


def unit_result(out: GraphBatchResult, n: int, topology: ChannelTopology, s: SolveSettings) -> UnitResult:
    """Statistics `[n, k, F]` and flags of `n` runs' `n·k` solved graphs."""
    k = s.k
    per = None
    if s.per_layer:
        groups = [idx for _, idx in layer_node_groups(topology)]
        per = layer_statistics(out.centrality, groups).reshape(n, k, -1)
    stats = s.layout(topology).join(
        timestep_statistics(out.centrality).reshape(n, k, -1).to(s.dtype),
        per,
        out.eigenvalue.to(s.dtype).log().reshape(n, k) if s.eigenvalue else None,
    )
    flags = {f: getattr(out, f).reshape(n, k) for f in ("residual", "finite", "converged", "connected")}
    entries = [
        CachedRun(
            stats=stats[j].clone(),
            residual=flags["residual"][j].double().clone(),
            finite=flags["finite"][j].clone(),
            converged=flags["converged"][j].clone(),
            connected=flags["connected"][j].clone(),
        )
        for j in range(n)
    ]
    return UnitResult(entries, [list(out.error[j * k : (j + 1) * k]) for j in range(n)])


def unit_chunks(runs: Sequence[Run], unit: Unit, k: int) -> list[list[tuple[Run, int]]]:
    items = [(r, t) for r in runs for t in range(k)]
    return [[items[i] for i in rg] for rg in unit.chunks(k)]


def solve_graphs(
    runs: Sequence[Run], k: int, topology: ChannelTopology, device: torch.device, solver: SolverOptions
) -> GraphBatchResult:
    """The first `k` checkpoints of `runs` (one architecture), solved unit by unit as
    `plan_units` says: the one solve path of [`analyze`][dtg_gpu.analyze], a Ray task, and
    (pipelined over many units) the local featurisation. Results on the CPU, rows `run·k + t`."""
    parts: list[GraphBatchResult] = []
    for unit in plan_units(len(runs), k, topology, solver.dtype, solver.chunk_size):
        chunks = unit_chunks(runs[unit.start : unit.stop], unit, k)
        parts.extend(iter_solve(chunks, topology, device=device, solver=solver))
    return concat_results(parts)


def solve_unit(
    runs: Sequence[Run], unit: Unit, s: SolveSettings, device: torch.device, topology: ChannelTopology | None = None
) -> UnitResult:
    """Solve one unit (its runs' first `k` checkpoints) as the plan says: what a Ray task runs."""
    topo = topology or runs[0].topology
    if s.fold_batchnorm:
        topo = topo.folded  # a Ray task traces the architecture again: fold it there too
    parts = list(iter_solve(unit_chunks(runs, unit, s.k), topo, device=device, solver=s.solver))
    return unit_result(concat_results(parts), len(runs), topo, s)


def store(cache: FeatureCache | None, runs: Sequence[Run], key: str | None, result: UnitResult) -> None:
    """Cache every run of a solved unit that read all its checkpoints (a run that could not be
    read is solved again next time: the file may be back)."""
    if cache is None or key is None:
        return
    for run, entry, errors in zip(runs, result.entries, result.errors):
        if all(e is None for e in errors):
            cache.store(run_id(run, cache.root), key, entry)


def plan_jobs(
    groups: Sequence[tuple[ChannelTopology, list[int]]],
    runs: Sequence[Run],
    s: SolveSettings,
    cache: FeatureCache | None,
) -> list[Job]:
    """Units of every architecture group, with their cache keys."""
    jobs = []
    for topo, rows in groups:
        sig = cache_architecture_key(topo, runs[rows[0]].model) if cache is not None else ""
        for unit in plan_units(len(rows), s.k, topo, s.dtype, s.solver.chunk_size):
            mine = rows[unit.start : unit.stop]
            members = [runs[i] for i in mine]
            key = unit_key(members, s.k, unit.chunk, s.key(), sig, cache.root) if cache is not None else None
            jobs.append(Job(members, mine, unit, topo, key))
    return jobs
