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

import hashlib
import os
import pickle
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch

from dtg_gpu.core.files import confined_path
from dtg_gpu.exceptions import CheckpointError, UnsafeCheckpointError
from dtg_gpu.io.manifest import read_manifest

__all__ = [
    "load_state_dict",
    "load_weights",
    "checkpoint_shapes",
    "read_manifest",
    "CHECKPOINT_SUFFIXES",
]

CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin")
Checkpoint = Union[Mapping[str, torch.Tensor], str, os.PathLike]


SMALL_SAFETENSORS = 1 << 20  # bytes: safetensors files up to this size are read whole, not mapped
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module")


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


HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "mp_rank_00_model_states.pt",  # DeepSpeed's global_stepN/ (weights under "module")
)


def _hf_weights(folder: Path) -> Path | None:
    """The weights file of a Hugging Face Trainer `checkpoint-N` folder, if any."""
    return next((folder / n for n in HF_WEIGHTS if (folder / n).is_file()), None)
