r"""Seed-model sweeps (method step 1): one architecture, one dataset, a grid of learning
rates × dropout rates × seeds, written in the on-disk format of docs/method.md.

Crash safety: every file is written to a hidden temporary beside it
(`.NAME.XXXXXXXX.tmp.SUFFIX`, see `atomic_write`) and renamed into place, and a run's
`run.json` is written last, so a folder without a complete `run.json` is unfinished.
A restarted sweep skips complete runs and redoes unfinished ones from scratch; killing it
at any moment loses no completed run.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from dtg_gpu.core.devices import resolve_device
from dtg_gpu.core.validation import is_int
from dtg_gpu.exceptions import DTGWarning, SweepLockedError
from dtg_gpu.io.manifest import SweepManifest, is_complete, read_manifest
from dtg_gpu.models import build_model
from dtg_gpu.sweeps.config import SweepConfig
from dtg_gpu.sweeps.data import Dataset, load_dataset
from dtg_gpu.sweeps.state import _grid_mismatch, _write_json, raise_failures
from dtg_gpu.sweeps.training import _batches, train_batch, tune_cpu_malloc

__all__ = ["run_sweep"]


def run_sweep(
    cfg: SweepConfig,
    out: str | os.PathLike,
    *,
    data_root: str | None = None,
    download: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
    dataset: Dataset | None = None,
    group_size: int = 32,
    executor: str = "local",
    address: str | None = None,
    workers: int = 1,
) -> Path:
    r"""Train every run of the grid into `out` (resumable).

    Parameters
    ----------
    cfg : SweepConfig
    out : path
        Sweep folder: `sweep.json` and `run-0000/`, `run-0001/`, ...
    data_root, download
        Where torchvision datasets live, and whether they may be downloaded.
    device : optional
        `None`: CUDA when available.
    progress : bool, default True
        tqdm bars over runs and epochs.
    group_size : int, default 32
        Up to this many runs of one seed are trained at once as one grouped network (plain
        SGD, sequential CNNs such as LeNet-5 and VGG without batch norm; see
        `dtg_gpu.sweeps.grouped`); `1` trains one run at a time.
    executor : {"local", "ray"}, default "local"
        `"ray"`: each batch of runs is one Ray task (`num_gpus=1` when the cluster has
        GPUs), which loads the dataset on its node (`data_root` must be readable there),
        trains and writes its run folders into `out` (storage every node sees). A batch
        whose task fails is named in a [`SweepFailedError`][dtg_gpu.exceptions.SweepFailedError] after
        the others finish; rerunning trains only what is not complete. Needs
        `pip install 'dtg_gpu[ray]'`.
    address : str, optional
        The Ray cluster (as in [`featurize_sweep`][dtg_gpu.workflow.verdicts.featurize_sweep]); default: the one
        this process is connected to, else a local instance for this call.
    workers : int, default 1
        Local executor: train this many batches at once, each in its own process with an
        equal share of this process's torch threads (`dtg_gpu.sweeps.parallel`). Networks
        that train one run at a time (batch norm, residual, depthwise, Adam/AdamW) keep
        several CPU cores busier this way: two single-threaded ResNet-20 runs side by side
        trained 1.2× faster than one on two threads (2 cores). A batch whose worker fails
        is named in a `SweepFailedError` after the others finish.

    Returns
    -------
    Path of the sweep folder.

    Raises
    ------
    ValueError
        A bad config, or `out` holds a different sweep.
    SweepFailedError
        `executor="ray"` or `workers > 1`: some runs could not be trained (every other run was).
    DatasetNotFoundError
        The dataset is not under `data_root`.
    """
    out, names, grid, manifest = _prepare(cfg, out, executor, group_size, workers)
    path = out / "sweep.json"
    if path.is_file() and all(is_complete(out / name, verify=True) for name in names):
        _warn_foreign(out, cfg, names, grid)
        return out
    ds = dataset or load_dataset(cfg.dataset, data_root, download)
    _check_trainable(cfg, ds)
    dev = resolve_device(device) if executor == "local" else torch.device("cpu")
    out.mkdir(parents=True, exist_ok=True)
    with _sweep_lock(out):
        if path.is_file():  # another process may have written it since
            _check_same_sweep(out, path, manifest)
        else:
            _check_empty(out)
            _write_json(path, manifest)
        # under the lock: what is complete (the recorded SHA-256 of every checkpoint checked)
        # is final; other folders are cleared or moved aside and trained again
        todo = [(name, point) for name, point in zip(names, grid) if not is_complete(out / name, verify=True)]
        _warn_foreign(out, cfg, names, grid)
        if todo and executor == "ray":
            from dtg_gpu.sweeps.ray_training import train_batches

            train_batches(
                cfg,
                _batches(cfg, ds, todo, group_size),
                out,
                device=device,
                data_root=data_root,
                download=download,
                dataset=dataset,
                progress=progress,
                address=address,
                done=len(grid) - len(todo),
                total=len(grid),
            )
        elif todo:
            _train_todo(cfg, ds, todo, grid, out, dev, progress, group_size, workers)
    return out


def _prepare(
    cfg: SweepConfig, out: str | os.PathLike, executor: str, group_size: Any, workers: Any = 1
) -> tuple[Path, list[str], list, dict]:
    """The arguments checked, and `out` checked to hold nothing or this sweep:
    `(out, run names, grid, manifest)`."""
    cfg.validate()
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    if not is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if not is_int(workers) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if workers > 1 and executor != "local":
        raise ValueError(
            f"workers={workers} is for the local executor; with executor={executor!r} Ray places the tasks"
        )
    out = Path(out)
    grid = cfg.grid()
    names = [f"run-{i:04d}" for i in range(len(grid))]
    manifest = sweep_manifest(cfg, names)
    path = out / "sweep.json"
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    if path.is_file():
        _check_same_sweep(out, path, manifest)
    elif out.is_dir():
        _check_empty(out)
    return out, names, grid, manifest


def sweep_manifest(cfg: SweepConfig, names: list[str]) -> dict[str, Any]:
    """`sweep.json`'s content ([`SweepManifest`][dtg_gpu.io.manifest.SweepManifest]) for `cfg`."""
    config = {**asdict(cfg), "lrs": list(map(float, cfg.lrs)), "dropouts": list(map(float, cfg.dropouts))}
    grid = {"lr": list(map(float, cfg.lrs)), "dropout": list(map(float, cfg.dropouts)), "seeds": int(cfg.seeds)}
    return SweepManifest(config=config, runs=names, grid=grid).to_dict()


def _check_same_sweep(out: Path, path: Path, manifest: dict) -> None:
    """`out` may hold this sweep (resume) or nothing trained yet; never a different one."""
    old = read_manifest(path)
    # fields added since: a sweep written before them resumes
    defaults = {"weight_decay": 0.0, "lr_schedule": "constant"}
    if (
        isinstance(old, dict)
        and isinstance(old.get("config"), dict)
        and {**defaults, **old["config"]} == manifest["config"]
    ):
        return
    started = any(
        (out / n).exists()
        for n in (old.get("runs", []) if isinstance(old, dict) else [])
        if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")
    )
    if started:
        raise ValueError(f"{out} already holds a different sweep (sweep.json differs); choose another --out folder")


def _warn_foreign(out: Path, cfg: SweepConfig, names: list[str], grid: list[dict[str, Any]]) -> None:
    """Complete runs that are not the grid's are kept as they are (never trained over) and
    named; [`load_sweep`][dtg_gpu.sweeps.runner.load_sweep] leaves them out as failed."""
    foreign = [why for n, p in zip(names, grid) if is_complete(out / n) and (why := _grid_mismatch(out / n, cfg, p))]
    if foreign:
        warnings.warn(
            f"{out}: {len(foreign)} complete run(s) are not this sweep's and are left as they are "
            f"(load_sweep leaves them out): {foreign[0]}",
            DTGWarning,
            stacklevel=3,
        )


def _check_empty(out: Path) -> None:
    """A folder without `sweep.json` must be empty (a crashed start may leave the lock file):
    dtg never adopts, or deletes, what it did not write."""
    others = sorted(e.name for e in out.iterdir() if e.name != ".dtg-sweep.lock")
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise ValueError(
            f"{out}: not empty and has no sweep.json of dtg ({shown}); dtg sweep trains into a new or "
            "empty folder, or resumes its own: choose another --out"
        )


def _check_trainable(cfg: SweepConfig, ds: Dataset) -> None:
    """What needs the dataset: the model builds with these kwargs, and a run saves a checkpoint."""
    try:
        with torch.device("meta"):
            build_model(
                cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels, dropout=0.0, **cfg.model_kwargs
            )
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"cannot build {cfg.model!r} with model_kwargs {cfg.model_kwargs}: {exc}") from None
    steps = cfg.epochs * -(-len(ds.train[0]) // cfg.batch_size)
    total = steps if cfg.checkpoint_unit == "step" else cfg.epochs
    if cfg.checkpoint_every > total:
        raise ValueError(
            f"checkpoint_every={cfg.checkpoint_every} {cfg.checkpoint_unit}s is longer than "
            f"the run ({total} {cfg.checkpoint_unit}s): no checkpoint would be saved"
        )


@contextmanager
def _sweep_lock(out: Path):
    """An exclusive OS lock on the sweep folder for the whole training: it dies with the
    process (a killed sweep never blocks its restart), and a second `dtg sweep` on the
    same folder is refused instead of deleting the first one's runs."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    lock = out / ".dtg-sweep.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepLockedError(
                f"{out}: another process is training this sweep (it holds {lock.name}); "
                "wait for it to finish, or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)


def _train_todo(cfg, ds, todo, grid, out, dev, progress, group_size, workers=1) -> None:
    batches = _batches(cfg, ds, todo, group_size)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(grid), initial=len(grid) - len(todo), desc="sweep", unit="run")
    try:
        if workers > 1 and len(batches) > 1:
            from dtg_gpu.sweeps.parallel import train_in_processes

            raise_failures(out, train_in_processes(cfg, ds, batches, out, dev, workers, bar=bar))
            return
        if dev.type == "cpu":
            tune_cpu_malloc()
        for batch in batches:
            train_batch(cfg, ds, batch, out, dev, progress)
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
