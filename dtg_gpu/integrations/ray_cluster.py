r"""Sweeps on a Ray cluster: featurisation units and training batches as Ray tasks.

Used through `executor="ray"` of [`featurize_sweep`][dtg_gpu.workflow.featurize_sweep] and
[`run_sweep`][dtg_gpu.sweeps.run_sweep], and `--ray [--address ADDR]` of `dtg featurize`,
`evaluate`, `train` and `sweep`. Ray does the scheduling, retries and data movement;
this module only says what a task is:

- **featurising**: one unit of `plan_units` (whole runs of one
  architecture, solved as one batch). The task gets the runs' checkpoint *paths* and the
  architecture on the `meta` device (no weights), solves on its node (`num_gpus=1` when
  the cluster has GPUs, else one CPU), writes each run's cache entry into the sweep folder
  and returns the statistics (a few KB). The driver never reads a checkpoint.
- **training**: one batch of runs (a grouped network, or one run), trained and written into
  its run folders exactly as a local sweep does.

A task whose worker dies is retried by Ray (`max_retries`); since a task's output is a
pure function of its inputs and every file is written atomically, a retry gives the same
rows, never a duplicated or missing one. A task that raises is named and the rest go on.

The sweep folder must be on storage every node sees at the same path (NFS, Lustre, a
mounted bucket) and `dtg_gpu` installed on every node.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:
    import ray
except ImportError:  # pragma: no cover - the extra is installed by make test
    raise ImportError("executor='ray' (--ray) needs Ray: pip install 'dtg_gpu[ray]'") from None

from dtg_gpu._engine import Unit, resolve_device
from dtg_gpu._executors import Job, SolveSettings, UnitResult, solve_unit, store
from dtg_gpu.feature_cache import FeatureCache

__all__ = ["ray_session", "solve_jobs", "train_batches", "task_resources"]

MAX_RETRIES = 3


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[bool]:
    """Connected to Ray for the block: the instance this process already has; else the
    cluster at `address` (or `$RAY_ADDRESS`); else a fresh local instance, shut down
    at the end. Yields whether this call started the connection."""
    if ray.is_initialized():
        yield False
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address)
        ray.init(address=address, configure_logging=False)
    else:  # workers import dtg_gpu from where this process does (also from a source tree)
        here = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    try:
        yield True
    finally:
        ray.shutdown()


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail within `timeout` seconds, naming `address`, when nothing listens there (Ray's
    own client retries a dead address for ever). `"auto"`, `"local"` and addresses
    without a port are left to Ray.

    Raises
    ------
    ConnectionError
        Nothing accepts a connection at the address's host and port.
    """
    import socket

    text = address.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise ConnectionError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one there "
            "(ray start --head) or pass the address it printed"
        ) from None


def task_resources(device: torch.device | None) -> dict[str, float]:
    """One GPU per task when the cluster has GPUs and `device` allows it, else one CPU.

    Raises
    ------
    ValueError
        `device` is CUDA and the cluster has no GPU.
    """
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if device is not None and device.type == "cuda" and gpus < 1:
        raise ValueError(f"device={str(device)!r} was asked for but the Ray cluster has no GPU")
    if gpus >= 1 and (device is None or device.type == "cuda"):
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": 1}


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


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


def _drain(
    pending: dict, handle: Callable[[Any, Any, BaseException | None], tuple[int, int]], bar=None, k: int = 0
) -> None:
    """Wait for every task of `pending` (`ref -> item`), calling `handle(item, value,
    error)` as each ends (`error`: what `ray.get` raised, after Ray's retries); it
    returns `(runs, bar steps)`. The bar shows runs (and graphs, `k` per run) per second.
    Tasks still pending when the driver stops (an error, Ctrl-C) are cancelled."""
    start, runs = time.perf_counter(), 0
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                item = pending.pop(ref)
                try:
                    value, error = ray.get(ref), None
                except (ray.exceptions.RayError, ray.exceptions.RayTaskError) as exc:
                    value, error = None, exc
                done, steps = handle(item, value, error)
                runs += done
                if bar is not None:
                    rate = runs / max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix_str(f"{rate:.2f} runs/s" + (f", {rate * k:.1f} graphs/s" if k else ""))
                    bar.update(steps)
    finally:
        if bar is not None:
            bar.close()
        for ref in pending:
            ray.cancel(ref, force=True)


def _bar(progress: bool, total: int, desc: str, unit: str, initial: int = 0):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit)


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
                    failed[row] = f"its Ray task failed: {_cause(error)}"
            else:
                job.result = value
                on_done(job)
            return len(job.runs), 1

        _drain(pending, handle, _bar(progress, len(pending), "centrality (ray)", "task"), settings.k)


def _train_task(
    cfg, batch: list, out: str, device: str | None, data_root: str | None, download: bool, dataset
) -> list[str]:
    from dtg_gpu.data import load_dataset
    from dtg_gpu.sweeps import train_batch, tune_cpu_malloc

    dev = resolve_device(device)
    if dev.type == "cpu":
        tune_cpu_malloc()
    ds = dataset if dataset is not None else load_dataset(cfg.dataset, data_root, download)
    return train_batch(cfg, ds, batch, Path(out), dev, progress=False)


def train_batches(
    cfg,
    batches: Sequence[list],
    out: Path,
    *,
    device: Any = None,
    data_root: str | None = None,
    download: bool = False,
    dataset=None,
    progress: bool = True,
    address: str | None = None,
    done: int = 0,
    total: int | None = None,
) -> None:
    """Train each batch of `(name, point)` runs as one Ray task into `out`.

    Raises
    ------
    SweepFailedError
        After every other batch finished: the runs whose tasks failed, with the causes.
    """
    from dtg_gpu.exceptions import SweepFailedError

    dev = None if device is None else torch.device(device)
    failures: dict[str, str] = {}
    with ray_session(address):
        options: dict[str, Any] = {"max_retries": MAX_RETRIES, **task_resources(dev)}
        remote = ray.remote(**options)(_train_task)
        ds_ref = ray.put(dataset) if dataset is not None else None
        pending = {
            remote.remote(
                cfg,
                batch,
                str(Path(out).resolve()),
                None if dev is None else str(dev),
                None if data_root is None else str(Path(data_root).resolve()),
                download,
                ds_ref,
            ): batch
            for batch in batches
        }

        def handle(batch: list, value: Any, error: BaseException | None) -> tuple[int, int]:
            if error is not None:
                for name, _ in batch:
                    failures[name] = _cause(error)
            return len(batch), len(batch)

        _drain(pending, handle, _bar(progress, total or done + sum(map(len, batches)), "sweep (ray)", "run", done))
    if failures:
        lines = "; ".join(f"{n}: {why}" for n, why in list(failures.items())[:8])
        raise SweepFailedError(
            f"{len(failures)} run(s) of {out} could not be trained ({lines}); every other "
            "run is complete; rerun the same command to retry them",
            failures,
        )
