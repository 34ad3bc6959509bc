r"""Where a sweep's graphs are solved: units of whole runs, the cache, local or Ray.

`featurize_runs` is the work behind [`featurize`][dtg_gpu.featurize] and
[`featurize_sweep`][dtg_gpu.workflow.featurize_sweep]. Runs are grouped by architecture; each group is
split into units of whole runs (`plan_units`); a unit whose runs all
have a cache entry is read back ([`feature_cache`][dtg_gpu.feature_cache]), the others are solved here
(`executor="local"`: one pipelined pass, the next chunk read while this one solves) or as
Ray tasks (`executor="ray"`: `dtg_gpu.integrations.ray_cluster`). Both paths solve
the same batches with the same code, so their statistics are bit-identical for the same
dtype and device type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import torch

from dtg_gpu._engine import GraphBatchResult, Unit, concat_results, iter_solve, plan_units, warn_results
from dtg_gpu.centrality import Method
from dtg_gpu.checkpoints import Run
from dtg_gpu.feature_cache import CachedRun, FeatureCache, architecture_signature, run_id, unit_key
from dtg_gpu.layout import StatisticsLayout
from dtg_gpu.statistics import layer_node_groups, layer_statistics, timestep_statistics
from dtg_gpu.topology import ChannelTopology

__all__ = ["Executor", "SolveSettings", "Job", "UnitResult", "solve_unit", "featurize_runs"]

Executor = Literal["local", "ray"]


@dataclass(frozen=True)
class SolveSettings:
    """What the statistics of a graph depend on (beyond its checkpoint and its batch)."""

    k: int
    dtype: torch.dtype
    tol: float
    max_iter: int
    method: Method
    per_layer: bool
    eigenvalue: bool
    fold_batchnorm: bool = False

    def key(self) -> dict[str, Any]:
        folded = {"fold_batchnorm": True} if self.fold_batchnorm else {}  # absent: keys of older caches hold
        return {
            **folded,
            "dtype": str(self.dtype),
            "tol": float(self.tol),
            "max_iter": int(self.max_iter),
            "method": self.method,
            "per_layer": bool(self.per_layer),
            "eigenvalue": bool(self.eigenvalue),
        }

    def layout(self, topology: ChannelTopology) -> StatisticsLayout:
        return StatisticsLayout.of(topology, self.per_layer, self.eigenvalue)

    def width(self, topology: ChannelTopology) -> int:
        return self.layout(topology).width


@dataclass
class UnitResult:
    """A solved unit: one [`CachedRun`][dtg_gpu.feature_cache.CachedRun] per run, and per run the
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


def _unit_chunks(runs: Sequence[Run], unit: Unit, k: int) -> list[list[tuple[Run, int]]]:
    items = [(r, t) for r in runs for t in range(k)]
    return [[items[i] for i in rg] for rg in unit.chunks(k)]


def solve_unit(
    runs: Sequence[Run], unit: Unit, s: SolveSettings, device: torch.device, topology: ChannelTopology | None = None
) -> UnitResult:
    """Solve one unit (its runs' first `k` checkpoints) as the plan says: what a Ray task runs."""
    topo = topology or runs[0].topology
    if s.fold_batchnorm:
        topo = topo.folded  # a Ray task traces the architecture again: fold it there too
    parts = list(
        iter_solve(
            _unit_chunks(runs, unit, s.k),
            topo,
            device=device,
            dtype=s.dtype,
            tol=s.tol,
            max_iter=s.max_iter,
            method=s.method,
        )
    )
    return unit_result(concat_results(parts), len(runs), topo, s)


def store(cache: FeatureCache | None, runs: Sequence[Run], key: str | None, result: UnitResult) -> None:
    """Cache every run of a solved unit that read all its checkpoints (a run that could not be
    read is solved again next time: the file may be back)."""
    if cache is None or key is None:
        return
    for run, entry, errors in zip(runs, result.entries, result.errors):
        if all(e is None for e in errors):
            cache.store(run_id(run, cache.root), key, entry)


def _solve_local(
    jobs: list[Job],
    s: SolveSettings,
    device: torch.device,
    cache: FeatureCache | None,
    on_done: Callable[[Job], None],
    progress,
) -> None:
    """Every job's chunks in one pipelined pass per architecture; each unit is cached and
    handed on as soon as its last chunk is solved."""
    by_topo: dict[int, list[Job]] = {}
    for job in jobs:
        by_topo.setdefault(id(job.topology), []).append(job)
    for group in by_topo.values():
        chunks, owner = [], []
        for j, job in enumerate(group):
            for c in _unit_chunks(job.runs, job.unit, s.k):
                chunks.append(c)
                owner.append(j)
        parts: list[GraphBatchResult] = []
        solved = iter_solve(
            chunks, group[0].topology, device=device, dtype=s.dtype, tol=s.tol, max_iter=s.max_iter, method=s.method
        )
        for i, part in enumerate(solved):
            parts.append(part)
            if progress is not None:
                progress.update(len(part.error))
            if i + 1 == len(chunks) or owner[i + 1] != owner[i]:
                job = group[owner[i]]
                job.result = unit_result(concat_results(parts), len(job.runs), job.topology, s)
                parts = []
                store(cache, job.runs, job.key, job.result)
                on_done(job)


def plan_jobs(
    groups: Sequence[tuple[ChannelTopology, list[int]]],
    runs: Sequence[Run],
    s: SolveSettings,
    chunk_size: int | None,
    cache: FeatureCache | None,
) -> list[Job]:
    """Units of every architecture group, with their cache keys."""
    jobs = []
    for topo, rows in groups:
        sig = architecture_signature(topo, runs[rows[0]].model) if cache is not None else ""
        for unit in plan_units(len(rows), s.k, topo, s.dtype, chunk_size):
            mine = rows[unit.start : unit.stop]
            members = [runs[i] for i in mine]
            key = unit_key(members, s.k, unit.chunk, s.key(), sig, cache.root) if cache is not None else None
            jobs.append(Job(members, mine, unit, topo, key))
    return jobs


def featurize_runs(
    runs: Sequence[Run],
    groups: Sequence[tuple[ChannelTopology, list[int]]],
    s: SolveSettings,
    device: torch.device | None,
    *,
    chunk_size: int | None = None,
    cache: FeatureCache | None = None,
    executor: Executor = "local",
    address: str | None = None,
    progress: bool = False,
    strict: bool = False,
) -> tuple[torch.Tensor, dict[int, str]]:
    """Raw statistics `[len(runs), k, F]` of the grouped runs (other rows NaN) and, per row,
    why a run failed (a checkpoint could not be read, or its task failed).

    `device=None` lets each Ray task choose its own (CUDA where its node has it); the local
    path resolves it before."""
    widths = {s.width(topo) for topo, _ in groups}
    width = widths.pop() if len(widths) == 1 else 5 + int(s.eigenvalue)
    stats = torch.full((len(runs), s.k, width), float("nan"), dtype=s.dtype)
    failed: dict[int, str] = {}
    jobs = plan_jobs(groups, runs, s, chunk_size, cache)
    todo = []
    for job in jobs:
        if job.key is not None and cache is not None:
            hits = [cache.load(run_id(r, cache.root), job.key, s.k, s.width(job.topology), s.dtype) for r in job.runs]
            found = [h for h in hits if h is not None]
            if len(found) == len(hits):
                job.result = UnitResult(found, [[None] * s.k for _ in found])
                continue
        todo.append(job)

    def on_done(job: Job) -> None:
        assert job.result is not None
        for row, entry, errors in zip(job.rows, job.result.entries, job.result.errors):
            stats[row] = entry.stats
            why = next((e for e in errors if e is not None), None)
            if why is not None:
                if strict:
                    from dtg_gpu.exceptions import CheckpointError

                    raise CheckpointError(why)
                failed[row] = why

    for job in jobs:
        if job.result is not None:
            on_done(job)
    if todo:
        graphs = sum(len(j.runs) for j in todo) * s.k
        if executor == "ray":
            from dtg_gpu.integrations.ray_cluster import solve_jobs

            solve_jobs(
                todo, s, device, cache, on_done, progress=progress, address=address, strict=strict, failed=failed
            )
        else:
            bar = None
            if progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=graphs, desc="centrality", unit="graph")
            try:
                assert device is not None  # resolved by the caller for the local path
                _solve_local(todo, s, device, cache, on_done, bar)
            finally:
                if bar is not None:
                    bar.close()
    _warn_jobs(jobs, s.k)
    for row in failed:
        stats[row] = float("nan")
    return stats, failed


def _warn_jobs(jobs: Sequence[Job], k: int) -> None:
    """The usual warnings (non-finite, not converged, disconnected), once per architecture."""
    by_topo: dict[int, list[tuple[Job, UnitResult]]] = {}
    for job in jobs:
        if job.result is not None:
            by_topo.setdefault(id(job.topology), []).append((job, job.result))
    for group in by_topo.values():
        items = [(r, t) for job, _ in group for r in job.runs for t in range(k)]
        entries = [e for _, res in group for e in res.entries]
        out = SimpleNamespace(
            error=[e for _, res in group for errs in res.errors for e in errs],
            **{
                f: torch.cat([getattr(e, f) for e in entries]) for f in ("residual", "finite", "converged", "connected")
            },
        )
        warn_results(items, out, stacklevel=5)  # type: ignore[arg-type]  # the fields it reads


def default_cache(runs: Any, cache: Any) -> FeatureCache | None:
    """`cache`: `None` → the sweep folder's `.dtg-cache` when `runs` came from
    [`load_sweep`][dtg_gpu.sweeps.load_sweep] (else none); `False` → none; a path → that folder."""
    from dtg_gpu.feature_cache import CACHE_DIRNAME

    if cache is False:
        return None
    if isinstance(cache, FeatureCache):
        return cache
    if cache is None or cache is True:
        root = getattr(runs, "path", None)
        if root is None:
            if cache is True:
                raise ValueError("cache=True needs runs from load_sweep (a sweep folder); pass a folder")
            return None
        return FeatureCache(Path(root) / CACHE_DIRNAME, root=root, confine=True)
    return FeatureCache(cache)
