"""The state of a sweep folder on disk: which run folders are complete, unfinished or damaged, and moving a damaged one aside (never deleting what a user may want)."""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

from dtg_gpu.core.failures import failure_list
from dtg_gpu.core.files import atomic_write
from dtg_gpu.exceptions import CheckpointError, DTGWarning, SweepFailedError
from dtg_gpu.io.manifest import read_manifest, run_state
from dtg_gpu.sweeps.config import SweepConfig

__all__ = ["ASIDE_DIRNAME", "raise_failures", "sweep_grid"]


def _write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2))


#: The files `dtg sweep` writes into a run folder before its `run.json`: checkpoints and
#: the temporaries of their atomic writes. An unfinished folder holding only these is cleared.
_OWN_PARTIAL = re.compile(r"ckpt-\d{4,}\.safetensors|\.ckpt-\d{4,}\.safetensors\.[^/]*\.tmp\.safetensors")


ASIDE_DIRNAME = ".dtg-aside"


def _move_aside(out: Path, folder: Path, why: str) -> Path:
    """Rename `folder` (or a file or link in its place) into `out/.dtg-aside/` under a
    fresh name and say so: dtg never deletes what it cannot prove it wrote."""
    aside = out / ASIDE_DIRNAME
    aside.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        target = aside / f"{folder.name}-{stamp}" if n == 0 else aside / f"{folder.name}-{stamp}-{n}"
        if not target.exists() and not target.is_symlink():
            break
    os.rename(folder, target)
    warnings.warn(f"{folder}: {why}; moved aside to {target} and training the run again", DTGWarning, stacklevel=3)
    return target


def _clear_for_training(out: Path, folder: Path) -> None:
    """Make `folder` an empty run folder: an unfinished one that holds only dtg's own
    checkpoints is emptied; anything else (a `run.json`, a user's file, a damaged run, a
    link or file in its place) is moved aside whole."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        _move_aside(out, folder, "not a run folder dtg wrote")
    elif folder.is_dir():
        entries = list(folder.iterdir())
        own = all(e.is_file() and not e.is_symlink() and _OWN_PARTIAL.fullmatch(e.name) for e in entries)
        if own and run_state(folder) == "unfinished":
            for e in entries:
                e.unlink()
        else:
            state = run_state(folder, verify=True)
            _move_aside(out, folder, "unfinished, with files dtg did not write" if state == "unfinished" else state)
    folder.mkdir(exist_ok=True)


def _grid_mismatch(folder: Path, cfg: SweepConfig, point: dict[str, Any]) -> str | None:
    """Why a complete run is not the one the grid puts there (model, data, lr, dropout or
    seed differ), or `None`."""
    try:
        meta = read_manifest(folder / "run.json")
    except CheckpointError as exc:
        return str(exc)
    want = {"model": cfg.model, "dataset": cfg.dataset, **point}
    got = {k: meta.get(k) if isinstance(meta, dict) else None for k in want}
    if got == want:
        return None
    diff = ", ".join(f"{k}={got[k]!r} where the grid has {want[k]!r}" for k in want if got[k] != want[k])
    return f"{folder / 'run.json'}: a run of another sweep ({diff})"


def sweep_grid(meta: Any) -> tuple[SweepConfig, list[dict[str, Any]]] | None:
    """The config and grid a `sweep.json` records, when it is one dtg can rebuild."""
    config = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(config, dict):
        return None
    try:
        cfg = SweepConfig(**config)
        cfg.validate()
        return cfg, cfg.grid()
    except (TypeError, ValueError):
        return None


def raise_failures(out: Path, failures: dict[str, str]) -> None:
    """Raise [`SweepFailedError`][dtg_gpu.exceptions.SweepFailedError] naming the runs of `out` that could not be trained
    (run name → why), if any: what a sweep on Ray or on worker processes does after every
    other batch has finished."""
    if failures:
        raise SweepFailedError(
            f"{len(failures)} run(s) of {out} could not be trained ({failure_list(failures)}); every other "
            "run is complete; rerun the same command to retry them",
            failures,
        )
