"""The state of a sweep folder on disk: which run folders are complete, unfinished or damaged, and moving a damaged one aside (never deleting what a user may want)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

from dtg_gpu.core.files import atomic_write, confined_path
from dtg_gpu.exceptions import CheckpointError, DTGWarning
from dtg_gpu.io.checkpoints import read_manifest
from dtg_gpu.sweeps.config import SweepConfig

__all__ = ["ASIDE_DIRNAME"]


def _write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2))


def _is_complete(folder: Path, verify: bool = False) -> bool:
    """A run folder is complete when its `run.json` says so and every checkpoint it lists
    is there, inside the folder, with the size (and with `verify`, the SHA-256) recorded."""
    return _state_of(folder, verify=verify) == "complete"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _state_of(folder: Path, verify: bool = False) -> str:
    """`"complete"`, `"unfinished"` (no `run.json` yet: training stopped before the end),
    or why a run is damaged: a `run.json` that cannot be read or does not say complete, a
    file missing, outside the folder, not of the size recorded, or (`verify`) not of the
    SHA-256 recorded."""
    manifest = folder / "run.json"
    if not manifest.exists() and not manifest.is_symlink():
        return "unfinished"
    try:
        meta = read_manifest(manifest)
    except CheckpointError as exc:
        return f"{exc} (damaged; dtg sweep moves it aside and trains the run again)"
    if not isinstance(meta, dict) or meta.get("complete") is not True:
        return f"{manifest}: does not say the run is complete (not a run dtg sweep finished)"
    cps = meta.get("checkpoints")
    if not isinstance(cps, list) or not cps:
        return f"{manifest}: complete but lists no checkpoints"
    for i, c in enumerate(cps):
        if not isinstance(c, dict):
            return f"{manifest}: checkpoints[{i}] is not an object"
        try:
            f = confined_path(folder, c.get("file"), what=f"{manifest}: checkpoints[{i}].file")
        except CheckpointError as exc:
            return str(exc)
        try:
            size = f.stat().st_size if f.is_file() else None
        except OSError:
            size = None
        if size is None:
            return f"{f}: checkpoint file missing"
        if "bytes" in c and c["bytes"] != size:
            return (
                f"{f}: {size} bytes, run.json recorded {c['bytes']} (damaged or truncated; "
                "rerun the sweep to retrain the run)"
            )
        if verify and isinstance(c.get("sha256"), str):
            try:
                digest = _sha256_of(f)
            except OSError as exc:
                return f"{f}: cannot be read: {exc.strerror or exc}"
            if digest != c["sha256"]:
                return f"{f}: its SHA-256 is not the one run.json recorded (the file changed since training)"
    return "complete"


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
        if own and _state_of(folder) == "unfinished":
            for e in entries:
                e.unlink()
        else:
            state = _state_of(folder, verify=True)
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


def _sweep_grid(meta: Any) -> tuple[SweepConfig, list[dict[str, Any]]] | None:
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
