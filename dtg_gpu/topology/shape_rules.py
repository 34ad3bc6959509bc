"""The shape pass's tables and helpers: ops that only rearrange elements, packed attention functions, the example inputs a model is run on, and channel ids carried as tensors (-1: no channel)."""

from __future__ import annotations

import operator

import numpy as np
import torch
from torch import nn

from dtg_gpu.topology.types import _CONV

# applied to the id tensor exactly as to the value
_LAYOUT_METHODS = {
    "view",
    "reshape",
    "permute",
    "transpose",
    "flatten",
    "unflatten",
    "contiguous",
    "expand",
    "expand_as",
    "repeat",
    "narrow",
    "select",
    "chunk",
    "split",
    "unbind",
    "squeeze",
    "unsqueeze",
    "roll",
    "flip",
    "t",
    "movedim",
    "swapaxes",
    "view_as",
    "reshape_as",
    "__getitem__",
}


_LAYOUT_FNS = {
    torch.flatten,
    torch.reshape,
    torch.permute,
    torch.transpose,
    torch.cat,
    torch.concat,
    torch.stack,
    torch.chunk,
    torch.split,
    torch.unbind,
    torch.squeeze,
    torch.unsqueeze,
    torch.roll,
    torch.flip,
    operator.getitem,
    torch.narrow,
    torch.movedim,
    torch.swapaxes,
    torch.unflatten,
    nn.functional.pixel_shuffle,
    nn.functional.pixel_unshuffle,
    torch.channel_shuffle,
    nn.functional.channel_shuffle,
}


def _packed_attention_functions() -> dict:
    import inspect

    out: dict = {}
    try:
        from torchvision.models import swin_transformer as swin
    except ImportError:  # pragma: no cover - torchvision is a dependency
        return out
    for name in ("shifted_window_attention", "shifted_window_attention_v2"):
        fn = getattr(swin, name, None)
        if fn is not None:
            out[fn] = inspect.signature(fn)
    return out


_PACKED_ATTENTION = _packed_attention_functions()


_REDUCE = {"mean", "sum", "amax", "amin", "max", "min", "std", "var", "logsumexp", "norm", "prod"}


_SIZES = (224, 32, 28, 64, 96, 128, 256, 299, 384, 16, 8)


_TOKENS = (8, 16, 32, 49, 50, 64, 128, 196, 197, 256, 1, 2, 3, 4, 5, 6, 7, 9, 10, 12)


def _none(shape) -> torch.Tensor:
    return torch.full(tuple(shape), -1, dtype=torch.long)


def _has(ids) -> bool:
    return isinstance(ids, torch.Tensor) and bool((ids >= 0).any())


def _broadcast(nodes: np.ndarray, shape, dim: int) -> torch.Tensor:
    """Node ids `nodes` along `dim` of a tensor of `shape`."""
    dim = dim % len(shape)
    view = [1] * len(shape)
    view[dim] = len(nodes)
    return torch.as_tensor(nodes, dtype=torch.long).view(view).expand(tuple(shape))


def _per_feature(ids: torch.Tensor, dim: int) -> list[np.ndarray]:
    """For each index along `dim`: the distinct channel nodes (`>= 0`) found there."""
    cols = ids.movedim(dim, -1).reshape(-1, ids.shape[dim]).T.numpy()
    same = (cols == cols[:, :1]).all(1)
    return [
        np.array([c[0]]) if ok and c[0] >= 0 else (np.empty(0, np.int64) if ok else np.unique(c[c >= 0]))
        for c, ok in zip(cols, same)
    ]


def _first_layer(model: nn.Module):
    for m in model.modules():
        if isinstance(m, (_CONV, nn.Linear)):
            return m
    return None


def _example_inputs(model: nn.Module, device) -> list[torch.Tensor]:
    """Inputs to try, most likely first: the model's own configured size, then common ones."""
    first = _first_layer(model)
    out = []
    if isinstance(first, _CONV):
        c, d = first.in_channels, first.weight.dim() - 2
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
        sizes = [
            s
            for s in (
                getattr(model, "image_size", None),
                getattr(getattr(model, "patch_embed", None), "img_size", None),
            )
            if s is not None
        ]
        shapes = []
        if isinstance(cfg, dict) and len(cfg.get("input_size", ())) == d + 1:
            shapes.append(tuple(cfg["input_size"]))
        for s in sizes:
            shapes.append((c,) + (tuple(s) if isinstance(s, (tuple, list)) else (s,) * d))
        shapes += [(c,) + (s,) * d for s in _SIZES]
        out = [torch.zeros((1,) + s, device=device) for s in dict.fromkeys(shapes)]
    elif isinstance(first, nn.Linear):
        out = [torch.zeros(1, first.in_features, device=device)] + [
            torch.zeros(1, t, first.in_features, device=device) for t in _TOKENS
        ]
    return out
