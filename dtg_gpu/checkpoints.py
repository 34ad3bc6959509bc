r"""Checkpoints and runs: where the weights come from, loaded lazily and safely.

A checkpoint is a state dict in memory or a file:

* ``.safetensors`` (preferred: no code, and only the weight tensors are read);
* ``.pt`` / ``.pth``: a ``torch.save``-d state dict, read with ``weights_only=True``;
* ``.ckpt``: a Lightning checkpoint whose ``"state_dict"`` holds the model's tensors
  (keys may carry the LightningModule attribute prefix, e.g. ``"model."``).

Nothing is unpickled that could execute code: such a file raises
:class:`~dtg_gpu.exceptions.UnsafeCheckpointError`.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import torch
from torch import nn

from .exceptions import CheckpointError, UnsafeCheckpointError
from .topology import ChannelTopology, channel_topology

__all__ = ["Run", "load_state_dict", "load_weights", "CHECKPOINT_SUFFIXES"]

CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt")
Checkpoint = Union[Mapping[str, torch.Tensor], str, os.PathLike]


def _read_pickled_state(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{path}: refused to load: unpickling it would run code or build objects other "
            f"than tensors (weights_only=True): {str(exc).splitlines()[0]}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable torch checkpoint "
                              f"(truncated or corrupt?): {exc}") from None


def load_state_dict(path: str | os.PathLike, keys: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    r"""Read the tensors of one checkpoint file, safely.

    Parameters
    ----------
    path : path-like
        ``.safetensors``, ``.pt``/``.pth`` or ``.ckpt``.
    keys : iterable of str, optional
        Read only these tensors where the format allows it (safetensors).

    Returns
    -------
    dict of str to Tensor (on the CPU)

    Raises
    ------
    CheckpointError
        Missing, truncated or corrupt file, or no state dict inside. The message names it.
    UnsafeCheckpointError
        The file would execute code when unpickled.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys()) if keys is None else [k for k in keys if k in f.keys()]
                return {k: f.get_tensor(k) for k in names}
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file "
                                  f"(truncated or corrupt?): {exc}") from None
    if suffix not in CHECKPOINT_SUFFIXES:
        raise CheckpointError(f"{path}: unknown checkpoint format {suffix!r} "
                              f"(expected one of {', '.join(CHECKPOINT_SUFFIXES)})")
    obj = _read_pickled_state(path)
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: does not hold a state dict (a mapping of names to tensors)")
    return dict(obj)


def _resolve_key(state: Mapping[str, torch.Tensor], key: str) -> str | None:
    if key in state:
        return key
    hits = [k for k in state if k.endswith("." + key)]
    return hits[0] if len(hits) == 1 else None


def load_weights(checkpoint: Checkpoint, params: Sequence[str], shapes: Mapping[str, tuple],
                 *, label: str) -> dict[str, torch.Tensor]:
    """The weights ``params`` of one checkpoint, validated against ``shapes``.

    Raises
    ------
    CheckpointError
        A weight is missing or has the wrong shape; the message names ``label`` (the file
        or checkpoint index) and the parameter.
    """
    if isinstance(checkpoint, Mapping):
        state = checkpoint
    else:
        state = load_state_dict(checkpoint, keys=params)
        if any(p not in state for p in params):  # e.g. a Lightning prefix: read everything
            state = load_state_dict(checkpoint)
    out = {}
    for p in params:
        k = _resolve_key(state, p)
        if k is None:
            raise CheckpointError(f"{label}: parameter {p!r} is missing")
        t = state[k]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{label}: parameter {p!r} is not a tensor")
        if tuple(t.shape) != tuple(shapes[p]):
            raise CheckpointError(f"{label}: parameter {p!r} has shape {list(t.shape)}, "
                                  f"the model expects {list(shapes[p])}")
        out[p] = t
    return out


@dataclass
class Run:
    r"""One training run: a model and its checkpoints θ₁ … θ_T, in time order.

    Parameters
    ----------
    model : torch.nn.Module
        The architecture (its own weights are not used).
    checkpoints : sequence of state dict or path
        In memory or on disk (loaded lazily, one at a time).
    name : str, optional
    meta : dict, optional
        Anything known about the run (``final_accuracy``, ``lr``, ...). ``run.json``
        for runs read with :meth:`from_dir`.

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

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(self.model).__name__}")
        if isinstance(self.checkpoints, (str, os.PathLike, Mapping)):
            raise TypeError("checkpoints must be a sequence of state dicts or paths, "
                            "not a single one: wrap it in a list")
        self.checkpoints = list(self.checkpoints)
        if self.name is None:
            self.name = self.meta.get("name") or type(self.model).__name__

    def __len__(self) -> int:
        return len(self.checkpoints)

    @cached_property
    def topology(self) -> ChannelTopology:
        """The model's channel topology (traced once per architecture, looked up once per run)."""
        return channel_topology(self.model)

    @property
    def final_accuracy(self) -> float | None:
        acc = self.meta.get("final_accuracy", self.meta.get("test_accuracy"))
        return None if acc is None else float(acc)

    def label(self, t: int) -> str:
        """How checkpoint ``t`` is named in messages: its file, or its index."""
        c = self.checkpoints[t]
        return str(c) if not isinstance(c, Mapping) else f"run {self.name!r} checkpoint {t}"

    def weights(self, t: int) -> dict[str, torch.Tensor]:
        """The graph's weight tensors of checkpoint ``t``, validated against the model."""
        topo = self.topology
        shapes = {l.param: l.weight_shape for l in topo.layers}
        return load_weights(self.checkpoints[t], topo.params, shapes, label=self.label(t))

    @classmethod
    def from_dir(cls, path: str | os.PathLike, model: nn.Module | None = None) -> "Run":
        r"""Read a run folder of the on-disk sweep format (see SPEC).

        ``run.json`` names the model (``model`` and ``model_kwargs``, built with
        :func:`dtg_gpu.models.build_model`) and its ``checkpoints`` in time order; without
        ``run.json``, pass ``model`` and every ``ckpt-*`` file is used in name order.

        Raises
        ------
        CheckpointError
            No such folder, an unreadable ``run.json``, no checkpoints, or a listed
            checkpoint file that is missing.
        """
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: run folder not found")
        meta: dict[str, Any] = {}
        manifest = path / "run.json"
        if manifest.is_file():
            try:
                meta = json.loads(manifest.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{manifest}: not valid JSON: {exc}") from None
        if model is None:
            if "model" not in meta:
                raise CheckpointError(f"{path}: no run.json naming the model; pass model=...")
            from .models import build_model

            model = build_model(meta["model"], **meta.get("model_kwargs", {}))
        if "checkpoints" in meta:
            files = [path / c["file"] if isinstance(c, Mapping) else path / c for c in meta["checkpoints"]]
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{path}: checkpoint files listed in run.json are missing: "
                                      + ", ".join(missing[:5]))
        else:
            files = sorted(f for f in path.iterdir()
                           if f.name.startswith("ckpt-") and f.suffix in CHECKPOINT_SUFFIXES)
        if not files:
            raise CheckpointError(f"{path}: the run has no checkpoint files")
        meta.setdefault("name", path.name)
        return cls(model=model, checkpoints=files, name=meta["name"], meta=meta)
