"""run.json and sweep.json: reading a manifest safely, the fields of run.json the library reads (checked), `RunManifest` (what `dtg sweep` writes), and the state of a run folder judged from it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dtg_gpu.core.files import confined_path
from dtg_gpu.core.validation import is_number
from dtg_gpu.exceptions import CheckpointError

__all__ = [
    "RunManifest",
    "read_manifest",
    "check_run_json",
    "run_state",
    "is_complete",
    "sha256_of",
    "MAX_MANIFEST_BYTES",
]

MAX_MANIFEST_BYTES = 64 << 20  # run.json / sweep.json larger than this are refused unread


def read_manifest(path: Path) -> Any:
    """A JSON manifest (`run.json`, `sweep.json`), size-checked before it is read.

    Raises
    ------
    CheckpointError
        Too large, not UTF-8, not JSON, or nested too deeply; the message names the file.
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if size > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{path}: {size} bytes is too large for a manifest (limit {MAX_MANIFEST_BYTES})")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not valid JSON: nested too deeply") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def check_run_json(meta: Any, manifest: Path) -> dict:
    """Validate the fields of `run.json` that the library reads; errors name file and field."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{manifest}: expected a JSON object, got {type(meta).__name__}")
    if "model" in meta and not (isinstance(meta["model"], str) and meta["model"]):
        raise CheckpointError(f"{manifest}: field 'model' must be a model name, got {meta['model']!r}")
    kw = meta.get("model_kwargs", {})
    if kw is None:
        kw = {}
    if not isinstance(kw, dict):
        raise CheckpointError(f"{manifest}: field 'model_kwargs' must be an object, got {type(kw).__name__}")
    meta["model_kwargs"] = kw
    for field_name in ("final_accuracy", "test_accuracy"):
        v = meta.get(field_name)
        if v is not None and (not is_number(v)):
            raise CheckpointError(f"{manifest}: field {field_name!r} must be a number or null, got {v!r}")
    if "checkpoints" in meta and not isinstance(meta["checkpoints"], list):
        raise CheckpointError(f"{manifest}: field 'checkpoints' must be a list")
    if "name" in meta and not isinstance(meta["name"], str):
        raise CheckpointError(f"{manifest}: field 'name' must be a string, got {meta['name']!r}")
    return meta


def is_complete(folder: Path, verify: bool = False) -> bool:
    """A run folder is complete when its `run.json` says so and every checkpoint it lists
    is there, inside the folder, with the size (and with `verify`, the SHA-256) recorded."""
    return run_state(folder, verify=verify) == "complete"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_state(folder: Path, verify: bool = False) -> str:
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
                digest = sha256_of(f)
            except OSError as exc:
                return f"{f}: cannot be read: {exc.strerror or exc}"
            if digest != c["sha256"]:
                return f"{f}: its SHA-256 is not the one run.json recorded (the file changed since training)"
    return "complete"


@dataclass
class RunManifest:
    """A finished run's `run.json`, as `dtg sweep` writes it (the on-disk format of
    `docs/method.md`): the hyper-parameters, one record per checkpoint (file, bytes,
    SHA-256, epoch/step, validation accuracy), the final accuracy and the status. It is
    written last, atomically: a run folder without it is unfinished
    ([`run_state`][dtg_gpu.io.manifest.run_state] judges a folder from it). Other tools' run.json
    files need only the fields [`check_run_json`][dtg_gpu.io.manifest.check_run_json] reads.
    """

    name: str
    model: str
    model_kwargs: dict[str, Any]
    dataset: str
    lr: float
    dropout: float
    seed: int
    epochs: int
    optimizer: str
    momentum: float
    weight_decay: float
    lr_schedule: str
    batch_size: int
    checkpoint_every: int
    checkpoint_unit: str
    checkpoints: list[dict[str, Any]]
    final_accuracy: float
    test_loss: float | None
    status: str  # "complete" or "diverged"
    complete: bool = True
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, fields in the order above."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class SweepManifest:
    """A sweep folder's `sweep.json`, as `dtg sweep` writes it before the first run: the
    format, the `SweepConfig` (as plain values), the run folders in grid order and the grid.
    A restarted sweep resumes only into a folder whose `sweep.json` has the same config."""

    config: dict[str, Any]
    runs: list[str]
    grid: dict[str, Any]
    format: str = "dtg_gpu.sweep/1"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: format, config, runs, grid."""
        return {"format": self.format, "config": self.config, "runs": self.runs, "grid": self.grid}
