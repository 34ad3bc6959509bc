"""The sweeps' Ray executor: each batch of runs (a grouped network, or one run) trained as
one Ray task and written into its run folders exactly as a local sweep does (`--ray` of
`dtg sweep`, `executor="ray"` of [`run_sweep`][dtg_gpu.sweeps.runner.run_sweep])."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dtg_gpu.core.devices import resolve_device
from dtg_gpu.core.ray import MAX_RETRIES, cause, drain, progress_bar, ray, ray_session, task_resources
from dtg_gpu.sweeps.state import raise_failures

__all__ = ["train_batches"]


def _train_task(
    cfg, batch: list, out: str, device: str | None, data_root: str | None, download: bool, dataset
) -> list[str]:
    from dtg_gpu.sweeps.data import load_dataset
    from dtg_gpu.sweeps.training import train_batch, tune_cpu_malloc

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
                    failures[name] = cause(error)
            return len(batch), len(batch)

        drain(
            pending, handle, progress_bar(progress, total or done + sum(map(len, batches)), "sweep (ray)", "run", done)
        )
    raise_failures(out, failures)
