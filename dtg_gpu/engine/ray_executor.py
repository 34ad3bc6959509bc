r"""The engine's Ray executor: featurisation units as Ray tasks (`executor="ray"` of
[`featurize_sweep`][dtg_gpu.workflow.verdicts.featurize_sweep], `--ray [--address ADDR]` of
`dtg featurize`, `evaluate` and `train`).

A task is one unit of `plan_units` (whole runs of one architecture, solved as one batch).
It gets the runs' checkpoint *paths* and the architecture on the `meta` device (no
weights), solves on its node (`num_gpus=1` when the cluster has GPUs, else one CPU), writes
each run's cache entry into the sweep folder and returns the statistics (a few KB). The
driver never reads a checkpoint. A task that raises is named and the rest go on.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dtg_gpu.core.devices import resolve_device
from dtg_gpu.core.ray import MAX_RETRIES, cause, drain, progress_bar, ray, ray_session, task_resources
from dtg_gpu.engine.cache import FeatureCache
from dtg_gpu.engine.plan import Unit
from dtg_gpu.engine.units import Job, SolveSettings, UnitResult, solve_unit, store

__all__ = ["solve_jobs"]


def _meta_copy(model: nn.Module) -> nn.Module:
    """The architecture without its weights: parameters and buffers on the `meta` device
    (tied weights stay tied), so a task carries a few KB, not the model's weights."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) not in memo:
            m = torch.empty_like(t, device="meta")
            memo[id(t)] = nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else m
    try:
        return copy.deepcopy(model, memo)
    except Exception:  # a module that cannot be copied travels as it is
        return model


def _portable(runs: Sequence, model: nn.Module) -> list:
    """The runs as a task gets them: checkpoint paths and the weightless architecture."""
    out = []
    for run in runs:
        held = [c for c in run.checkpoints if not isinstance(c, (str, os.PathLike))]
        if held:
            raise ValueError(
                f"run {run.name!r} holds its checkpoints in memory; executor='ray' sends "
                "checkpoint paths to the cluster: save them to files (or use executor='local')"
            )
        r = copy.copy(run)
        r.__dict__.pop("topology", None)  # traced again on the worker, from the architecture
        r.model = model
        r.checkpoints = [os.path.abspath(c) for c in run.checkpoints]  # workers' cwd is not ours
        out.append(r)
    return out


def _featurize_task(
    runs: list,
    unit: Unit,
    settings: SolveSettings,
    device: str | None,
    cache_folder: str | None,
    cache_root: str | None,
    key: str | None,
) -> UnitResult:
    result = solve_unit(runs, unit, settings, resolve_device(device))
    if cache_folder is not None:
        store(FeatureCache(cache_folder, cache_root), runs, key, result)
    return result


def solve_jobs(
    jobs: Sequence[Job],
    settings: SolveSettings,
    device: torch.device | None,
    cache: FeatureCache | None,
    on_done: Callable[[Job], None],
    *,
    progress: bool = False,
    address: str | None = None,
    strict: bool = False,
    failed: dict[int, str],
) -> None:
    """Solve `jobs` as Ray tasks; `on_done(job)` as each returns (in completion order).

    A task that raises (after Ray's retries for lost workers) marks its runs in `failed`
    with the cause, or is raised with `strict`."""
    with ray_session(address):
        options: dict[str, Any] = {"max_retries": MAX_RETRIES, **task_resources(device)}
        remote = ray.remote(**options)(_featurize_task)
        models: dict[int, nn.Module] = {}
        pending: dict[Any, Job] = {}
        for job in jobs:
            key = id(job.topology)
            if key not in models:
                models[key] = _meta_copy(job.runs[0].model)
            ref = remote.remote(
                _portable(job.runs, models[key]),
                job.unit,
                settings,
                None if device is None else str(device),
                None if cache is None or not cache.usable() else str(cache.folder.resolve()),
                None if cache is None else str(cache.root),
                job.key,
            )
            pending[ref] = job

        def handle(job: Job, value: UnitResult | None, error: BaseException | None) -> tuple[int, int]:
            if error is not None:
                if strict:
                    raise error
                for row in job.rows:
                    failed[row] = f"its Ray task failed: {cause(error)}"
            else:
                job.result = value
                on_done(job)
            return len(job.runs), 1

        drain(pending, handle, progress_bar(progress, len(pending), "centrality (ray)", "task"), settings.k)
