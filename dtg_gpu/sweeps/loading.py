"""Loading a sweep folder (or a folder of run folders) back as runs: the runs that could be read, and every one that could not, named with the reason."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from dtg_gpu.core.files import confined_path
from dtg_gpu.exceptions import CheckpointError, DTGWarning
from dtg_gpu.io.manifest import read_manifest, run_state
from dtg_gpu.io.run import Run
from dtg_gpu.sweeps.state import _grid_mismatch, sweep_grid

__all__ = ["SweepRuns", "load_sweep"]


class SweepRuns(list):
    """The runs of a sweep (a `list` of [`Run`][dtg_gpu.Run]), in `failed` the run
    folders that could not be read, each with the reason, and in `path` the sweep folder
    (where [`featurize_sweep`][dtg_gpu.workflow.verdicts.featurize_sweep] keeps its feature cache)."""

    def __init__(self, runs=(), failed: dict[str, str] | None = None, path: str | os.PathLike | None = None):
        super().__init__(runs)
        self.failed: dict[str, str] = dict(failed or {})
        self.path: Path | None = Path(path) if path is not None else None


def load_sweep(
    path: str | os.PathLike,
    *,
    strict: bool = False,
    model: "torch.nn.Module | None" = None,
    prefix: str | None = None,
    pattern: str | None = None,
) -> SweepRuns:
    """The complete runs of a sweep folder, in grid order.

    Unfinished runs are skipped with a warning. A complete run whose folder cannot be read
    (corrupt `run.json`, missing or foreign checkpoint files, unknown model) is left out
    and named, with the reason, in the returned list's `failed` and in one
    [`FailedRunsWarning`][dtg_gpu.exceptions.FailedRunsWarning]; one bad run never stops the sweep.

    Parameters
    ----------
    path : path-like
        The sweep folder (`sweep.json` and one folder per run).
    strict : bool, default False
        Raise the first run's error instead.
    model : torch.nn.Module, optional
        The architecture of every run (your own class), instead of the one each `run.json`
        names. With a model, `path` may also be a plain folder of run folders without
        `sweep.json` (Lightning, Hugging Face or numbered checkpoint files, see
        [`from_dir`][dtg_gpu.Run.from_dir]): every sub-folder holding checkpoints is a run, in
        the natural order of the names; a `run.json` beside the checkpoints may give its
        `final_accuracy`.
    prefix : str, optional
        Key prefix of the weights in the checkpoints (as in [`Run`][dtg_gpu.Run]).
    pattern : str, optional
        In folders without `run.json`: which checkpoint files, as a glob (`"ema_*.pt"`;
        see [`from_dir`][dtg_gpu.Run.from_dir]).

    Raises
    ------
    FileNotFoundError
        No `sweep.json` in `path` (and no `model` given).
    CheckpointError
        `sweep.json` is not valid (not JSON, no `runs` list, a run name that leads
        outside the folder); the message names the file and the field.
    """
    from dtg_gpu.core.failures import READ_ERRORS, warn_failures

    path = Path(path)
    manifest = path / "sweep.json"
    if not manifest.is_file() and model is not None and path.is_dir():
        return _load_run_folders(path, model, prefix, strict, pattern)
    if not manifest.is_file():
        raise FileNotFoundError(
            f"{path}: no sweep.json here; is this a sweep folder (dtg sweep --out)? "
            "(a folder of your own run folders needs model=... / --model)"
        )
    meta = read_manifest(manifest)
    if not isinstance(meta, dict) or not isinstance(meta.get("runs"), list):
        raise CheckpointError(f"{manifest}: expected an object with a list 'runs' of run folder names")
    names = meta["runs"]
    for i, n in enumerate(names):  # every run folder inside the sweep folder, by name
        confined_path(path, n, what=f"{manifest}: runs[{i}]")
        if not isinstance(n, str) or "/" in n or "\\" in n or n in (".", ".."):
            raise CheckpointError(f"{manifest}: runs[{i}] must be a folder name inside {path}, got {n!r}")
    states = {n: run_state(path / n) for n in names}
    rebuilt = sweep_grid(meta)
    if rebuilt is not None and len(rebuilt[1]) == len(names):
        for n, point in zip(names, rebuilt[1]):
            if states[n] == "complete" and (why := _grid_mismatch(path / n, rebuilt[0], point)):
                states[n] = why
    done = [n for n in names if states[n] == "complete"]
    unfinished = [n for n in names if states[n] == "unfinished"]
    if unfinished:
        warnings.warn(
            f"{path}: {len(unfinished)} of {len(names)} runs are unfinished "
            "and skipped; rerun the sweep to complete them",
            DTGWarning,
            stacklevel=2,
        )
    runs = SweepRuns(failed={n: why for n, why in states.items() if why not in ("complete", "unfinished")}, path=path)
    if runs.failed and strict:
        raise CheckpointError(next(iter(runs.failed.values())))
    for n in done:
        try:
            runs.append(Run.from_dir(path / n, model=model, prefix=prefix, pattern=pattern))
        except READ_ERRORS as exc:
            if strict:
                raise
            runs.failed[n] = str(exc)
    warn_failures(runs.failed, stacklevel=2)
    return runs


def _load_run_folders(path: Path, model, prefix: str | None, strict: bool, pattern: str | None = None) -> SweepRuns:
    """Every sub-folder of `path` that holds checkpoints, as a run of `model`."""
    from dtg_gpu.core.failures import READ_ERRORS, warn_failures
    from dtg_gpu.io.folders import natural_key, scan_checkpoints

    runs = SweepRuns(path=path)
    for sub in sorted(
        (d for d in path.iterdir() if d.is_dir() and not d.name.startswith(".")), key=lambda d: natural_key(d.name)
    ):
        try:
            if not (sub / "run.json").is_file() and not scan_checkpoints(sub, pattern):
                continue  # not a run folder
            runs.append(Run.from_dir(sub, model=model, prefix=prefix, pattern=pattern))
        except READ_ERRORS as exc:
            if strict:
                raise
            runs.failed[sub.name] = str(exc)
    if not runs and not runs.failed:
        raise CheckpointError(f"{path}: no sweep.json and no run folder with checkpoints in it")
    warn_failures(runs.failed, stacklevel=3)
    return runs
