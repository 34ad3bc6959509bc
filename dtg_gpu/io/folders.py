"""Finding a run's checkpoints in a folder: safetensors and torch files, Hugging Face and Lightning layouts, one series in natural order (optimizer states, EMA copies and aliases left out)."""

from __future__ import annotations

import fnmatch
import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from dtg_gpu.core.validation import is_int
from dtg_gpu.exceptions import CheckpointError
from dtg_gpu.io.checkpoints import _first_line, _harmless_globals, _hf_weights, _read_pickled_state, is_checkpoint_name

__all__ = ["scan_checkpoints", "ALIAS_NAMES"]

#: Files that repeat another checkpoint of the series under a fixed name (timm, Lightning, own
#: scripts): left out when numbered checkpoints are there.
ALIAS_NAMES = ("last.pth.tar", "model_best.pth.tar", "last.pt", "last.pth", "best.pt", "best.pth", "model_best.pth")


def natural_key(name: str) -> tuple:

    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


#: Checkpoint folders, numbered: Hugging Face's `checkpoint-N`, accelerate's `checkpoint_N`,
#: DeepSpeed's `global_stepN`.
CHECKPOINT_DIR = re.compile(r"(?:checkpoint[-_]|global_step)(\d+)")


PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def _lightning_position(path: Path) -> tuple[int, int]:
    """`(epoch, global_step)` recorded inside a Lightning `.ckpt` (read memory-mapped,
    tensors untouched)."""
    import torch.serialization as ts

    try:
        with ts.safe_globals(_harmless_globals()):
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError:
        obj = _read_pickled_state(path)  # raises the precise error
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable Lightning checkpoint: {_first_line(exc)}") from None
    epoch, step = (obj.get("epoch"), obj.get("global_step")) if isinstance(obj, Mapping) else (None, None)
    if not all(is_int(v) for v in (epoch, step)):
        raise CheckpointError(
            f"{path}: a Lightning checkpoint without integer 'epoch' and 'global_step': its time order cannot be told"
        )
    return int(epoch), int(step)  # type: ignore[arg-type]  # checked just above


#: Words that mark a series of files that are not the model's weights (optimizer state, ...).
_NOT_MODEL = ("optim", "sched", "scaler", "rng", "random", "trainer", "grad")


#: Words that mark another copy of the weights (an average), never chosen by default.
_OTHER_COPY = ("ema", "swa", "averaged", "average", "teacher", "shadow")


def _series_of(f: Path) -> str:
    """A file's series: its name with every number replaced by `*` (`model_12.pt` →
    `model_*.pt`, `epoch3_ema.pt` → `epoch*_ema.pt`)."""
    return re.sub(r"\d+", "*", f.name)


def _one_series(path: Path, files: list[Path]) -> list[Path]:
    """The files of one checkpoint series: the only one, or the model's when the others are
    clearly something else (optimizer state) or another copy of the weights (EMA); else an
    error that lists the series and how to choose."""
    if any(not re.search(r"\d", f.stem) for f in files):
        return files  # a name without a number: its time order is unknown (an error of its own)
    series: dict[str, list[Path]] = {}
    for f in files:
        series.setdefault(_series_of(f), []).append(f)
    if len(series) <= 1:
        return files

    def words(pattern: str) -> str:
        return pattern.lower()

    model = [p for p in series if not any(w in words(p) for w in _NOT_MODEL + _OTHER_COPY)]
    if len(model) == 1:
        return series[model[0]]
    listed = ", ".join(f"{p} ({len(fs)} files)" for p, fs in sorted(series.items()))
    raise CheckpointError(
        f"{path}: {len(series)} checkpoint series in one folder ({listed}); choose one with "
        f"pattern='{sorted(series)[0]}' (Run.from_dir / load_sweep, --pattern) or list the files in run.json"
    )


def _lightning_nested(path: Path) -> Path | None:
    """Where a Lightning run's checkpoints are when `path` is its `version_N/` (inside
    `checkpoints/`) or a `lightning_logs/` with one version; several versions are an
    error that lists them."""
    inner = path / "checkpoints"
    if inner.is_dir():
        return inner
    versions = sorted(
        (d for d in path.iterdir() if d.is_dir() and re.fullmatch(r"version_\d+", d.name)),
        key=lambda d: natural_key(d.name),
    )
    versions = [d for d in versions if (d / "checkpoints").is_dir()]
    if len(versions) == 1:
        return versions[0] / "checkpoints"
    if len(versions) > 1:
        raise CheckpointError(
            f"{path}: {len(versions)} Lightning runs ({', '.join(d.name for d in versions[:5])}); "
            "pass one version_N folder (each is a run)"
        )
    return None


def scan_checkpoints(path: Path, pattern: str | None = None) -> list[Path]:
    """Checkpoints of a folder without `run.json`, in time order, never lexicographic:

    * Hugging Face Trainer folders `checkpoint-N/` (`model.safetensors`, a sharded
      `model.safetensors.index.json`, or `pytorch_model.bin`), by `N`;
    * Lightning `*.ckpt` files, by the `(epoch, global_step)` each file records
      (`last.ckpt` is dropped when it repeats another);
    * else `ckpt-*` files, or every checkpoint file, by the numbers in their names
      (natural order: 2 before 10). Names without a number are an error.

    Files of several series (`model_N.pt` beside `ema_N.pt` or `optimizer_N.pt`,
    `epochN.pt` beside `epochN_ema.pt`) are never merged: the model's series is taken
    when the others are optimizer state or another copy of the weights (EMA, SWA), else an
    error lists them. `pattern` (a glob such as `"ema_*.pt"`) chooses the files.
    """

    subdirs = [d for d in path.iterdir() if d.is_dir() and CHECKPOINT_DIR.fullmatch(d.name)]
    hf = [(int(CHECKPOINT_DIR.fullmatch(d.name).group(1)), d) for d in subdirs if _hf_weights(d) is not None]  # type: ignore[union-attr]
    if hf:
        return [d for _, d in sorted(hf)]
    if any((d / f).is_file() for d in [path, *subdirs] for f in PEFT_FILES):
        raise CheckpointError(
            f"{path}: a PEFT adapter (adapter_config.json / adapter_model.*): it holds only the adapter's "
            "weights, not the network's; merge it (peft's merge_and_unload()) and save the model's state_dict"
        )
    files = [f for f in path.iterdir() if is_checkpoint_name(f.name) and f.is_file() and not f.name.startswith(".")]
    if not files:  # Lightning: a version_N/ (checkpoints/ inside) or lightning_logs/ given one level up
        nested = _lightning_nested(path)
        if nested is not None:
            return scan_checkpoints(nested, pattern)
    if pattern is not None:
        files = [f for f in files if fnmatch.fnmatchcase(f.name, pattern)]
        if not files:
            raise CheckpointError(f"{path}: no checkpoint file matches pattern {pattern!r}")
    ckpts = [f for f in files if f.suffix.lower() == ".ckpt"]
    if ckpts and len(ckpts) == len(files):
        keyed: dict[tuple[int, int], Path] = {}
        for f in sorted(ckpts, key=lambda f: f.name == "last.ckpt"):  # named ones first
            keyed.setdefault(_lightning_position(f), f)
        return [f for _, f in sorted(keyed.items())]
    ckpt = [f for f in files if f.name.startswith("ckpt-")]
    files = ckpt or files
    if any(re.search(r"\d", f.stem) for f in files):  # last.pth.tar, model_best.pth.tar: repeats
        files = [f for f in files if f.name.lower() not in ALIAS_NAMES]
    if pattern is None:
        files = _one_series(path, files)
    unnumbered = [f.name for f in files if not re.search(r"\d", f.stem)]
    if unnumbered and len(files) > 1:
        raise CheckpointError(
            f"{path}: cannot tell the time order of {', '.join(sorted(unnumbered)[:5])}: "
            "checkpoint names must carry their step or epoch, or list them in run.json"
        )
    keys = [natural_key(f.stem) for f in files]
    if len(set(keys)) < len(keys):
        raise CheckpointError(f"{path}: two checkpoint files carry the same number; list them in run.json")
    return [f for _, f in sorted(zip(keys, files))]
