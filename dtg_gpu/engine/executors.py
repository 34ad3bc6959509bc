r"""Where a sweep's graphs are solved: units of whole runs, the cache, local or Ray.

`featurize_runs` is the work behind [`featurize`][dtg_gpu.featurize] and
[`featurize_sweep`][dtg_gpu.workflow.verdicts.featurize_sweep]. Runs are grouped by architecture; each group is
split into units of whole runs (`plan_units`); a unit whose runs all
have a cache entry is read back ([`feature_cache`][dtg_gpu.engine.cache]), the others are solved here
(`executor="local"`: one pipelined pass, the next chunk read while this one solves) or as
Ray tasks (`executor="ray"`: `dtg_gpu.engine.ray_executor`). Both paths solve
the same batches with the same code, so their statistics are bit-identical for the same
dtype and device type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from dtg_gpu.engine.cache import FeatureCache, run_id
from dtg_gpu.engine.solve import GraphBatchResult, SolveFlags, concat_results, iter_solve, warn_results
from dtg_gpu.engine.units import Job, SolveSettings, UnitResult, plan_jobs, store, unit_chunks, unit_result
from dtg_gpu.io.run import Run
from dtg_gpu.topology.types import ChannelTopology

__all__ = ["Executor", "featurize_runs", "default_cache"]

Executor = Literal["local", "ray"]


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
            for c in unit_chunks(job.runs, job.unit, s.k):
                chunks.append(c)
                owner.append(j)
        parts: list[GraphBatchResult] = []
        solved = iter_solve(chunks, group[0].topology, device=device, solver=s.solver)
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


def featurize_runs(
    runs: Sequence[Run],
    groups: Sequence[tuple[ChannelTopology, list[int]]],
    s: SolveSettings,
    device: torch.device | None,
    *,
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
    jobs = plan_jobs(groups, runs, s, cache)
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
            from dtg_gpu.engine.ray_executor import solve_jobs

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
        out = SolveFlags(
            error=[e for _, res in group for errs in res.errors for e in errs],
            **{
                f: torch.cat([getattr(e, f) for e in entries]) for f in ("residual", "finite", "converged", "connected")
            },
        )
        warn_results(items, out, stacklevel=6)


def default_cache(runs: Any, cache: Any) -> FeatureCache | None:
    """`cache`: `None` → the sweep folder's `.dtg-cache` when `runs` came from
    [`load_sweep`][dtg_gpu.sweeps.runner.load_sweep] (else none); `False` → none; a path → that folder."""
    from dtg_gpu.engine.cache import CACHE_DIRNAME

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
