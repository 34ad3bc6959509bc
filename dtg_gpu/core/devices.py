"""Which device and dtype the numbers are computed on, validated once for every layer."""

from __future__ import annotations

import torch

__all__ = ["DEVICE_TYPES", "resolve_device", "parse_device", "check_dtype"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` → CUDA when available, else CPU; anything else as given, validated."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = parse_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r} was asked for but MPS (Apple GPU) is not available here; use 'cpu'")
    return dev


#: Devices the solver runs on.
DEVICE_TYPES = ("cpu", "cuda", "mps")


def parse_device(device: str | torch.device) -> torch.device:
    """`device` as a `torch.device`, without asking whether this machine has it (a
    Ray task may run elsewhere). Only devices that hold numbers: `cpu`, `cuda[:N]`, `mps`."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or None, got {device!r}") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(
            f"device={device!r}: the centrality is computed on 'cpu', 'cuda', 'cuda:N' or 'mps' "
            f"(a {dev.type} device {'holds no numbers' if dev.type == 'meta' else 'is not supported'})"
        )
    return dev


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    """`dtype` when the solver computes in it (float32 or float64), else a ValueError naming it."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype
