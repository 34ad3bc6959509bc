r"""Checkpoints and runs: where the weights come from, loaded lazily and safely.

A checkpoint is a state dict in memory or a file:

* `.safetensors` (preferred: no code, and only the weight tensors are read);
* `.pt` / `.pth`: a `torch.save`-d state dict, read with `weights_only=True`;
* `.ckpt`: a Lightning checkpoint whose `"state_dict"` holds the model's tensors
  (keys may carry the LightningModule attribute prefix, e.g. `"model."`).

Nothing is unpickled that could execute code: such a file raises
[`UnsafeCheckpointError`][dtg_gpu.exceptions.UnsafeCheckpointError].
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import pickle
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Union

import torch
from torch import nn

from dtg_gpu.core.files import confined_path
from dtg_gpu.core.validation import is_int, is_number
from dtg_gpu.exceptions import CheckpointError, UnsafeCheckpointError
from dtg_gpu.topology.trace import channel_topology
from dtg_gpu.topology.types import ChannelTopology

__all__ = [
    "Run",
    "unwrap_model",
    "load_state_dict",
    "load_weights",
    "checkpoint_shapes",
    "read_manifest",
    "CHECKPOINT_SUFFIXES",
]

CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin")
Checkpoint = Union[Mapping[str, torch.Tensor], str, os.PathLike]


MAX_MANIFEST_BYTES = 64 << 20  # run.json / sweep.json larger than this are refused unread
SMALL_SAFETENSORS = 1 << 20  # bytes: safetensors files up to this size are read whole, not mapped
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module")
#: Files that repeat another checkpoint of the series under a fixed name (timm, Lightning, own
#: scripts): left out when numbered checkpoints are there.
ALIAS_NAMES = ("last.pth.tar", "model_best.pth.tar", "last.pt", "last.pth", "best.pt", "best.pth", "model_best.pth")


def is_checkpoint_name(name: str) -> bool:
    """A checkpoint file by its name: `CHECKPOINT_SUFFIXES`, or timm's `.pth.tar`."""
    low = name.lower()
    return low.endswith(CHECKPOINT_SUFFIXES) or low.endswith(".pth.tar")


def _harmless_globals() -> list:
    """Globals that Lightning and plain training scripts put beside the weights and that
    build nothing but data: `argparse.Namespace` hyper-parameters, NumPy scalars and dtypes."""
    import argparse

    import numpy as np

    out: list = [argparse.Namespace, np.dtype]
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            out.append(__import__(mod, fromlist=["scalar"]).scalar)
            break
        except (ImportError, AttributeError):
            continue
    out += [type(np.dtype(t)) for t in ("float16", "float32", "float64", "int32", "int64", "bool")]
    return out


def _first_line(text: object) -> str:

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text))  # torch colours its hints
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:  # the line that names the refused global, when there is one
        if "Unsupported global" in ln or "GLOBAL" in ln:
            return ln
    return lines[0] if lines else ""


def _read_pickled_state(path: Path) -> Any:
    import torch.serialization as ts

    try:
        with ts.safe_globals(_harmless_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        line = _first_line(exc)
        named = re.search(r"GLOBAL (\S+)", line)
        refs = _pickle_globals(path) or []
        if named or refs:
            what = f"it references {named.group(1) if named else ', '.join(refs[:3])}"
            whole = any(r.startswith("torch.nn.modules") for r in refs)
            hint = " (a whole pickled model? save model.state_dict() instead)" if whole else ""
            raise UnsafeCheckpointError(
                f"{path}: refused to load: unpickling it would run code or build objects other "
                f"than tensors{hint}: {what}"
            ) from None
        raise CheckpointError(f"{path}: not a torch checkpoint (corrupt, or another format)") from None
    except Exception as exc:  # torch.load on a malformed file raises anything (struct.error, AssertionError, ...)
        if _is_torchscript(path):
            raise CheckpointError(
                f"{path}: a TorchScript archive (torch.jit.save): its weights sit inside a compiled program; "
                "load it with torch.jit.load and save model.state_dict() (or pass the state dict itself)"
            ) from None
        raise CheckpointError(
            f"{path}: not a readable torch checkpoint (truncated or corrupt?): {_first_line(exc) or type(exc).__name__}"
        ) from None


def _is_torchscript(path: Path) -> bool:
    """A `torch.jit.save` zip: it holds `constants.pkl` and compiled `code/`."""
    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
        return any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names)
    except (OSError, zipfile.BadZipFile):
        return False


_CODE_OPS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"}


def _pickle_globals(path: Path, limit: int = 64 << 20) -> list[str] | None:
    """The globals a pickle stream would import, read with `pickletools` (which parses
    and runs nothing); `None` when the file is no parseable pickle (random bytes, a
    truncated file). A `torch.save` zip is read at its `data.pkl`."""
    import io
    import pickletools

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
                if name is None or z.getinfo(name).file_size > limit:
                    return None
                data = z.read(name)
        else:
            with open(path, "rb") as f:
                data = f.read(limit)
        refs, strings, code = [], [], False
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(arg))
            elif op.name == "GLOBAL":
                refs.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                refs.append(f"{strings[-2]}.{strings[-1]}")
            code |= op.name in _CODE_OPS
        return (refs or ["objects it would build"]) if code else None
    except Exception:  # not a pickle we can parse: the caller reports a corrupt file
        return None


def _is_state(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def _tensors_of(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    """The state dict inside a loaded checkpoint: the top level, or under one of
    `STATE_DICT_KEYS` (`{"model": sd, "optimizer": ..., "epoch": 3}`; DeepSpeed's
    `module`). Other top-level mappings of tensors (an EMA copy: timm's `state_dict_ema`,
    `model_ema`) are there too, their keys prefixed with the mapping's name: `prefix=
    "state_dict_ema."` (`--prefix`) analyses them."""
    if isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor) for v in inner.values()):
                out = {k: v for k, v in inner.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
                for other, sub in obj.items():
                    if other != key and isinstance(other, str) and isinstance(sub, Mapping):
                        out.update(
                            {
                                f"{other}.{k}": v
                                for k, v in sub.items()
                                if isinstance(k, str) and isinstance(v, torch.Tensor)
                            }
                        )
                return out
        tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
        if tensors:
            return tensors
    raise CheckpointError(
        f"{path}: does not hold a state dict (a mapping of names to tensors, "
        f"at the top level or under {', '.join(map(repr, STATE_DICT_KEYS))})"
    )


def _hash_mismatch(path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path}: its SHA-256 is not the one run.json recorded (the file changed since training; "
        "rerun dtg sweep to train the run again)"
    )


def _check_sha256(path: Path, sha256: str | None, data: bytes | None = None) -> None:
    """Raise unless the file (or `data`, its bytes already read) has the recorded hash."""
    if sha256 is None:
        return
    if data is not None:
        digest = hashlib.sha256(data).hexdigest()
    else:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        digest = h.hexdigest()
    if digest != sha256:
        raise _hash_mismatch(path)


def load_state_dict(
    path: str | os.PathLike, keys: Iterable[str] | None = None, *, sha256: str | None = None
) -> dict[str, torch.Tensor]:
    r"""Read the tensors of one checkpoint file, safely.

    Parameters
    ----------
    path : path-like
        `.safetensors`, `.pt`/`.pth`/`.bin` or `.ckpt`.
    keys : iterable of str, optional
        Read only these tensors where the format allows it (safetensors).
    sha256 : str, optional
        The file's recorded SHA-256 (`run.json`): checked before anything is used (a
        small safetensors file is hashed from the bytes read, no second read).

    Returns
    -------
    dict of str to Tensor (on the CPU)

    Raises
    ------
    CheckpointError
        Missing, truncated or corrupt file, or no state dict inside. The message names it.
    UnsafeCheckpointError
        The file would execute code when unpickled (the message keeps torch's line that
        names the refused global).
    """
    path = Path(path)
    if sha256 is not None and (path.is_dir() or path.name.endswith(".index.json")):
        sha256 = None  # a folder or shard index has no one hash
    if path.is_dir():  # a Hugging Face Trainer checkpoint-N folder
        weights = _hf_weights(path)
        if weights is None:
            raise CheckpointError(f"{path}: a folder without {' or '.join(HF_WEIGHTS)}")
        return load_state_dict(weights, keys)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    if path.name.endswith(".index.json"):
        return _load_sharded(path, keys)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import safe_open

        try:
            size = path.stat().st_size
            if size <= SMALL_SAFETENSORS:  # one read: ~3x faster than mapping a LeNet-5 file
                with open(path, "rb") as fh:  # exactly `size` bytes (a 1 MiB buffer costs 3x the read)
                    data, grew = fh.read(size), fh.read(1)
                if not grew:  # else it changed since stat: mapped below
                    from safetensors.torch import load as load_bytes

                    _check_sha256(path, sha256, data)
                    sha256 = None
                    tensors = load_bytes(data)
                    return tensors if keys is None else {k: tensors[k] for k in keys if k in tensors}
            _check_sha256(path, sha256)
            with safe_open(str(path), framework="pt") as f:
                present = set(f.keys())
                names = list(present) if keys is None else [k for k in keys if k in present]
                return {k: f.get_tensor(k) for k in names}
        except CheckpointError:
            raise
        except Exception as exc:  # SafetensorError, OSError, ... on a malformed file
            raise CheckpointError(
                f"{path}: not a readable safetensors file (truncated or corrupt?): {_first_line(exc)}"
            ) from None
    if suffix not in CHECKPOINT_SUFFIXES and not is_checkpoint_name(path.name):
        raise CheckpointError(
            f"{path}: unknown checkpoint format {suffix!r} (expected one of {', '.join(CHECKPOINT_SUFFIXES)})"
        )
    _check_sha256(path, sha256)
    return _tensors_of(_read_pickled_state(path), path)


def _load_sharded(index: Path, keys: Iterable[str] | None) -> dict[str, torch.Tensor]:
    """A sharded checkpoint: `weight_map` names the shard (inside the folder) of each tensor."""
    meta = read_manifest(index)
    wmap = meta.get("weight_map") if isinstance(meta, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(k, str) for k in wmap):
        raise CheckpointError(f"{index}: expected an object with a 'weight_map' of tensor names to shard files")
    wanted = list(wmap) if keys is None else [k for k in keys if k in wmap]
    shards: dict[Path, list[str]] = {}
    for k in wanted:
        shard = confined_path(index.parent, wmap[k], what=f"{index}: weight_map[{k!r}]")
        shards.setdefault(shard, []).append(k)
    out: dict[str, torch.Tensor] = {}
    for shard, names in shards.items():
        got = load_state_dict(shard, names)
        out.update({k: got[k] for k in names if k in got})
    return out


def checkpoint_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors of a checkpoint file, read from its header where
    the format has one (safetensors; zip `torch.save` files are memory-mapped), so that a
    model can be checked against the file before anything is allocated for it."""
    path = Path(path)
    hf = _hf_weights(path) if path.is_dir() else None
    if hf is not None:
        path = hf
    if path.name.endswith(".index.json"):  # every shard's header
        meta = read_manifest(path)
        wmap = meta.get("weight_map") if isinstance(meta, dict) else None
        if not isinstance(wmap, dict):
            raise CheckpointError(f"{path}: expected an object with a 'weight_map' of tensor names to shard files")
        out: dict[str, tuple[int, ...]] = {}
        for shard in dict.fromkeys(wmap.values()):
            out.update(checkpoint_shapes(confined_path(path.parent, shard, what=f"{path}: weight_map")))
        return out
    if path.suffix.lower() == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except CheckpointError:
            raise
        except Exception as exc:  # SafetensorError, OSError, ... on a malformed file
            raise CheckpointError(
                f"{path}: not a readable safetensors file (truncated or corrupt?): {_first_line(exc)}"
            ) from None
    return {k: tuple(v.shape) for k, v in load_state_dict(path).items()}


def _key(state: Mapping[str, Any], pre: str, p: str, aliases: Mapping[str, Sequence[str]]) -> str | None:
    """The key of parameter `p` under prefix `pre`: its own, else one of its tied names
    (a checkpoint that `safetensors.torch.save_model` de-duplicated keeps one of them)."""
    if pre + p in state:
        return pre + p
    return next((pre + a for a in aliases.get(p, ()) if pre + a in state), None)


def _with_prefix(
    state: Mapping[str, Any],
    params: Sequence[str],
    prefix: str | None,
    label: str,
    aliases: Mapping[str, Sequence[str]] = {},
) -> str:
    """The one key prefix under which `state` holds every parameter of `params`.

    `""` when the keys match exactly; otherwise the prefix (`model.`, `module.`,
    `_orig_mod.`, a LightningModule attribute, ...) shared by all of them. Keys are never
    matched one by one, so a missing weight is never filled from another copy (`ema.`).
    """
    if prefix is not None:
        missing = [p for p in params if _key(state, prefix, p, aliases) is None]
        if missing:
            raise CheckpointError(f"{label}: parameter {prefix + missing[0]!r} is missing (prefix={prefix!r})")
        return prefix
    if all(_key(state, "", p, aliases) is not None for p in params):
        return ""
    first = params[0]
    names = (first, *aliases.get(first, ()))
    cands = sorted({k[: len(k) - len(n)] for k in state for n in names if k.endswith("." + n)})
    full = [c for c in cands if all(_key(state, c, p, aliases) is not None for p in params)]
    if len(full) == 1:
        return full[0]
    if len(full) > 1:
        raise CheckpointError(
            f"{label}: the model's weights are there under several prefixes "
            f"({', '.join(repr(c) for c in full)}), e.g. an EMA copy beside the model; "
            f"choose one with Run(..., prefix=...) (or --prefix)"
        )
    absent = next(p for p in params if _key(state, "", p, aliases) is None)
    hint = f" (found it under {cands[0]!r} but not the other weights)" if cands else ""
    raise CheckpointError(f"{label}: parameter {absent!r} is missing{hint}")


def load_weights(
    checkpoint: Checkpoint,
    params: Sequence[str],
    shapes: Mapping[str, tuple],
    *,
    label: str,
    prefix: str | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
    sha256: str | None = None,
) -> dict[str, torch.Tensor]:
    """The weights `params` of one checkpoint, validated against `shapes` (and, for a
    file, against its recorded `sha256` when given).

    `aliases` maps a parameter to the other names of the same tensor in the model (tied
    weights): a checkpoint that stores it once, under any of them, is complete.

    Raises
    ------
    CheckpointError
        A weight is missing, ambiguous (several prefixes), not a floating-point tensor, or
        has the wrong shape; the message names `label` (the file or checkpoint index) and
        the parameter.
    """
    if isinstance(checkpoint, Mapping):
        state = checkpoint
    else:
        keys = list(params) if not prefix else [prefix + p for p in params]
        state = load_state_dict(checkpoint, keys=keys, sha256=sha256)
        if any(k not in state for k in keys):  # e.g. a Lightning prefix: read everything
            state = load_state_dict(checkpoint)
    aliases = aliases or {}
    pre = _with_prefix(state, list(params), prefix, label, aliases)
    out = {}
    for p in params:
        key = _key(state, pre, p, aliases)
        assert key is not None  # _with_prefix found every parameter under pre
        t = state[key]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{label}: parameter {p!r} is not a tensor")
        if t.is_meta:
            raise CheckpointError(
                f"{label}: parameter {p!r} is a meta tensor (shape only, no numbers: saved from a model "
                "on the meta device)"
            )
        if not t.is_floating_point():
            raise CheckpointError(
                f"{label}: parameter {p!r} has dtype {t.dtype}; weights must be "
                "floating point (int, bool and complex tensors are not weights)"
            )
        if tuple(t.shape) != tuple(shapes[p]):
            raise CheckpointError(
                f"{label}: parameter {p!r} has shape {list(t.shape)}, the model expects {list(shapes[p])}"
            )
        out[p] = t
    return out


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


def _natural_key(name: str) -> tuple:

    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "mp_rank_00_model_states.pt",  # DeepSpeed's global_stepN/ (weights under "module")
)
#: Checkpoint folders, numbered: Hugging Face's `checkpoint-N`, accelerate's `checkpoint_N`,
#: DeepSpeed's `global_stepN`.
CHECKPOINT_DIR = re.compile(r"(?:checkpoint[-_]|global_step)(\d+)")
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def _hf_weights(folder: Path) -> Path | None:
    """The weights file of a Hugging Face Trainer `checkpoint-N` folder, if any."""
    return next((folder / n for n in HF_WEIGHTS if (folder / n).is_file()), None)


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
        key=lambda d: _natural_key(d.name),
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


def _scan_checkpoints(path: Path, pattern: str | None = None) -> list[Path]:
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
            return _scan_checkpoints(nested, pattern)
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
    keys = [_natural_key(f.stem) for f in files]
    if len(set(keys)) < len(keys):
        raise CheckpointError(f"{path}: two checkpoint files carry the same number; list them in run.json")
    return [f for _, f in sorted(zip(keys, files))]


def _check_meta(meta: Any, manifest: Path) -> dict:
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


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module a wrapper holds: `torch.compile`'s `OptimizedModule` (`_orig_mod`),
    `DataParallel` / `DistributedDataParallel` (`module`), and a container without a
    `forward` of its own (a LightningModule that only holds `self.model`) whose parameters
    all sit in one child. Checkpoints saved from the wrapper keep working: their key prefix
    (`_orig_mod.`, `module.`, `model.`) is found and stripped when the weights are read.

    Examples
    --------
    >>> net = nn.Sequential(nn.Linear(2, 2))
    >>> unwrap_model(nn.DataParallel(net)) is net
    True
    """
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
            continue
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
            continue
        forward = getattr(type(model), "forward", None)
        own = (
            forward is not None
            and forward is not nn.Module.forward
            and not getattr(forward, "__qualname__", "").startswith(("LightningModule.", "_DeviceDtypeModuleMixin."))
        )
        if not own:
            holders = [c for c in model.children() if any(True for _ in c.parameters())]
            if len(holders) == 1 and sum(p.numel() for p in holders[0].parameters()) == sum(
                p.numel() for p in model.parameters()
            ):
                model = holders[0]
                continue
        break
    return model


@dataclass
class Run:
    r"""One training run: a model and its checkpoints θ₁ … θ_T, in time order.

    Parameters
    ----------
    model : torch.nn.Module
        The architecture (its own weights are not used; it may live on the `meta` device).
    checkpoints : sequence of state dict or path
        In memory or on disk (loaded lazily, one at a time), in time order.
    name : str, optional
    meta : dict, optional
        Anything known about the run (`final_accuracy`, `lr`, ...). `run.json`
        for runs read with [`from_dir`][dtg_gpu.Run.from_dir].
    prefix : str, optional
        Key prefix of the model's weights inside the checkpoints (`"ema."` to analyse an
        EMA copy). Default: found per checkpoint: exact keys, else the one prefix
        (`model.`, `module.`, `_orig_mod.`, a Lightning attribute) under which every
        weight is; several complete copies are an error that names them.
    fallback : bool, default False
        For a model that cannot be traced: chain its layers in registration order instead of
        refusing it (see [`channel_topology`][dtg_gpu.channel_topology]).

    Examples
    --------
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> run = Run(model=net, checkpoints=[net.state_dict(), net.state_dict()])
    >>> len(run), run.topology.num_nodes
    (2, 9)
    """

    model: nn.Module
    checkpoints: Sequence[Checkpoint]
    name: str | None = None
    meta: dict = field(default_factory=dict)
    prefix: str | None = None
    fallback: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(self.model).__name__}")
        self.model = unwrap_model(self.model)
        if isinstance(self.checkpoints, (str, os.PathLike, Mapping)):
            raise TypeError(
                "checkpoints must be a sequence of state dicts or paths, not a single one: wrap it in a list"
            )
        self.checkpoints = list(self.checkpoints)
        if self.name is None:
            self.name = self.meta.get("name") or type(self.model).__name__

    def __len__(self) -> int:
        return len(self.checkpoints)

    @cached_property
    def topology(self) -> ChannelTopology:
        """The model's channel topology (traced once per architecture, looked up once per run)."""
        return channel_topology(self.model, fallback=self.fallback)

    @cached_property
    def tied(self) -> dict[str, list[str]]:
        """Tied weights: each parameter name to the model's other names of the same tensor."""
        groups: dict[int, list[str]] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(name)
        return {n: [m for m in g if m != n] for g in groups.values() if len(g) > 1 for n in g}

    @property
    def final_accuracy(self) -> float | None:
        """`final_accuracy` (or `test_accuracy`) of `meta`; None when absent.

        Raises
        ------
        CheckpointError
            The value is not a number (names the run and the field).
        """
        acc = self.meta.get("final_accuracy", self.meta.get("test_accuracy"))
        if acc is None:
            return None
        if not is_number(acc):
            raise CheckpointError(f"run {self.name!r}: final_accuracy must be a number, got {acc!r}")
        return float(acc)

    def label(self, t: int) -> str:
        """How checkpoint `t` is named in messages: its file, or its index."""
        c = self.checkpoints[t]
        return str(c) if not isinstance(c, Mapping) else f"run {self.name!r} checkpoint {t}"

    def recorded_sha256(self, t: int) -> str | None:
        """The SHA-256 `run.json` records for checkpoint `t` (`dtg sweep` writes one per
        file), or `None`: a file whose bytes differ is refused when it is read."""
        listed = self.meta.get("checkpoints")
        c = self.checkpoints[t]
        if not isinstance(listed, list) or len(listed) != len(self.checkpoints) or isinstance(c, Mapping):
            return None
        rec = listed[t]
        if not isinstance(rec, Mapping) or rec.get("file") != Path(c).name:
            return None
        sha = rec.get("sha256")
        return sha if isinstance(sha, str) else None

    def weights(self, t: int, topology: ChannelTopology | None = None) -> dict[str, torch.Tensor]:
        """The graph's weight tensors of checkpoint `t`, validated against the model.

        Keyed by each layer's `param`; a weight computed in the forward pass (weight
        standardisation, LoRA's `W + B·A`, batch norm folded in) is the *effective* weight,
        computed from the checkpoint's tensors by the traced computation. `topology`:
        another layout of this run's model ([`ChannelTopology.fold_batchnorm`][dtg_gpu.ChannelTopology.fold_batchnorm]); default
        [`topology`][dtg_gpu.Run.topology]."""
        topo = self.topology if topology is None else topology
        shapes = topo.source_params
        label = self.label(t)
        w = load_weights(
            self.checkpoints[t],
            list(shapes),
            shapes,
            label=label,
            prefix=self.prefix,
            aliases=self.tied,
            sha256=self.recorded_sha256(t),
        )
        for layer in topo.layers:
            if layer.effective is not None:
                try:
                    w[layer.param] = layer.effective_weight(w)
                except Exception as exc:  # the user's weight computation, on untrusted numbers
                    raise CheckpointError(
                        f"{label}: computing the effective weight of layer {layer.name!r} failed: {exc}"
                    ) from None
        return w

    @classmethod
    def from_dir(
        cls,
        path: str | os.PathLike,
        model: nn.Module | None = None,
        prefix: str | None = None,
        *,
        pattern: str | None = None,
    ) -> "Run":
        r"""Read a run folder.

        With `run.json` (the sweep format, see docs/method.md): it names the model (`model` and
        `model_kwargs`, built with [`dtg_gpu.sweeps.models.build_model`][dtg_gpu.sweeps.models.build_model] on the `meta`
        device, so no memory is spent before the checkpoint's shapes are checked) and its
        `checkpoints` in time order. Every listed file must lie inside the folder
        (absolute paths, `..` and symlinks out of it are refused). Without `run.json`,
        pass `model`; the folder's checkpoint files (`ckpt-*` if there are such) are
        taken in the natural order of the numbers in their names (`ckpt-2` before
        `ckpt-10`). Two series of files in one folder (`model_N.pt` and `ema_N.pt`)
        are never merged: `pattern` (a glob, `"ema_*.pt"`) chooses one, else the model's
        is taken where it is unambiguous.

        Raises
        ------
        CheckpointError
            No such folder; an unreadable or malformed `run.json` (the message names the
            field); a listed file missing or outside the folder; no checkpoints; names whose
            time order cannot be told; a model that does not match the first checkpoint.
        """
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: run folder not found")
        meta: dict[str, Any] = {}
        manifest = path / "run.json"
        if manifest.is_file():
            meta = _check_meta(read_manifest(manifest), manifest)
        if model is None:
            if "model" not in meta:
                raise CheckpointError(f"{path}: no run.json naming the model; pass model=...")
            from dtg_gpu.sweeps.models import build_model

            try:
                with torch.device("meta"):
                    model = build_model(meta["model"], **meta["model_kwargs"])
            except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
                raise CheckpointError(
                    f"{manifest}: cannot build model {meta['model']!r} with "
                    f"model_kwargs {meta['model_kwargs']!r}: {exc}"
                ) from None
        if "checkpoints" in meta:
            files = []
            for i, c in enumerate(meta["checkpoints"]):
                name = c.get("file") if isinstance(c, Mapping) else c
                files.append(confined_path(path, name, what=f"{manifest}: checkpoints[{i}].file"))
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(
                    f"{path}: checkpoint files listed in run.json are missing: " + ", ".join(missing[:5])
                )
        else:
            files = [
                confined_path(path, f.relative_to(path).as_posix(), what=f"{path}: checkpoint")
                for f in _scan_checkpoints(path, pattern)
            ]
        if not files:
            raise CheckpointError(f"{path}: the run has no checkpoint files")
        _check_against(model, files[0], prefix)
        meta.setdefault("name", path.name)
        return cls(model=model, checkpoints=files, name=meta["name"], meta=meta, prefix=prefix)


def _check_against(model: nn.Module, first: Path, prefix: str | None) -> None:
    """The model's conv/linear weight shapes against the first checkpoint's header, before
    the topology (whose size follows the model's) is built."""
    shapes = checkpoint_shapes(first)
    want = {n: tuple(p.shape) for n, p in model.state_dict().items() if n.endswith("weight") and len(p.shape) >= 2}
    if not want:
        return
    params = list(want)
    pre = _with_prefix(shapes, params, prefix, str(first))
    for n, shape in want.items():
        if shapes[pre + n] != shape:
            raise CheckpointError(
                f"{first}: parameter {n!r} has shape {list(shapes[pre + n])}, the model expects {list(shape)}"
            )
