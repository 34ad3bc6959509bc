"""[`Run`][dtg_gpu.Run]: one training run (a model and its checkpoints, in memory or in a folder), and unwrapping a model from DataParallel, DDP, torch.compile or Lightning."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dtg_gpu.core.files import confined_path
from dtg_gpu.core.validation import is_number
from dtg_gpu.exceptions import CheckpointError
from dtg_gpu.io.checkpoints import Checkpoint, _with_prefix, checkpoint_shapes, load_weights
from dtg_gpu.io.folders import scan_checkpoints
from dtg_gpu.io.manifest import check_run_json, read_manifest
from dtg_gpu.topology.trace import channel_topology
from dtg_gpu.topology.types import ChannelTopology

__all__ = ["Run", "unwrap_model"]


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
        `model_kwargs`, built with [`dtg_gpu.models.build_model`][dtg_gpu.models.build_model] on the `meta`
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
            meta = check_run_json(read_manifest(manifest), manifest)
        if model is None:
            if "model" not in meta:
                raise CheckpointError(f"{path}: no run.json naming the model; pass model=...")
            from dtg_gpu.models import build_model

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
                for f in scan_checkpoints(path, pattern)
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
