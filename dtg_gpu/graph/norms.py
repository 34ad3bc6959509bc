"""Step 2's edge weights: the norm of each kernel slice joining two channels (filter norms, with the compiled row-norm kernel on the CPU), and each graph's blocks scaled by a power of two so that no product over- or underflows."""

from __future__ import annotations

import math

import torch

from dtg_gpu.exceptions import CheckpointError
from dtg_gpu.graph.native import native_row_norms
from dtg_gpu.topology.types import WeightLayer

__all__ = ["filter_norms", "wide_filter_norms", "plain_filter_norms", "row_norms", "norms_in_range"]


def _slices(weight: torch.Tensor, layer: WeightLayer) -> torch.Tensor:
    """`weight [T, *weight_shape]` viewed as `[T, out, C/groups, S]`: one kernel slice per edge."""
    if tuple(weight.shape[1:]) != layer.weight_shape:
        raise CheckpointError(
            f"parameter {layer.param!r}: expected shape {list(layer.weight_shape)} per "
            f"checkpoint, got {list(weight.shape[1:])}"
        )
    out, cin = layer.block_shape
    return weight.reshape(weight.shape[0], out, cin, -1)


def norms_in_range(n: torch.Tensor) -> bool:
    """True when plain sum-of-squares norms `n` cannot have overflowed or lost their
    largest terms to underflow: every norm finite, positive and within `2^(±emax/2 ∓ 4)`."""
    if n.numel() == 0:
        return True
    info = torch.finfo(n.dtype)
    maxexp, minexp = math.frexp(info.max)[1], math.frexp(info.tiny)[1]
    lo, hi = torch.aminmax(n)  # one pass; NaN fails both tests
    return bool(((hi <= 2.0 ** (maxexp // 2 - 4)) & (lo >= 2.0 ** (minexp // 2 + 4))).item())


def filter_norms(weight: torch.Tensor, layer: WeightLayer) -> torch.Tensor:
    r"""Filter norms of one weight layer for `T` checkpoints in one op, without overflow.

    Parameters
    ----------
    weight : Tensor `[T, *layer.weight_shape]`
        The layer's weight stacked over checkpoints, floating point.
    layer : WeightLayer

    Returns
    -------
    Tensor `[T, out, C/groups]`
        `‖W[t, i, j, …]‖₂` for convolutions; `|W[t, i, j]|` for `Linear`; for a
        `Linear` after a flatten of `C` channels × `S` positions, `‖W[t, i, c, :]‖₂`
        with `W` viewed as `[T, out, C, S]`. In `weight`'s dtype.

    Raises
    ------
    CheckpointError
        `weight` does not have the layer's shape.

    Notes
    -----
    A plain `sqrt(Σ w²)` overflows once `|w| > 2^64` in float32 (and loses the slice
    once every `|w| < 2^-75`), although the norm itself is representable. The plain form
    is taken first; only when a norm falls outside `2^(±(emax/2 − 4))` (or is zero) are
    the norms recomputed scaled by each slice's largest `|w|` (in float64 for float32
    weights, whose squares always fit there), so any finite weight gives its exact norm
    unless the norm itself exceeds the dtype.

    Examples
    --------
    >>> from torch import nn
    >>> from dtg_gpu import channel_topology
    >>> conv = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False))
    >>> layer = channel_topology(conv).layers[0]
    >>> filter_norms(torch.tensor([[[[[3.]]], [[[-4.]]]]]), layer)
    tensor([[[3.],
             [4.]]])
    >>> filter_norms(torch.tensor([[[[[3e30]]], [[[-4e30]]]]]), layer)  # w² overflows float32
    tensor([[[3.0000e+30],
             [4.0000e+30]]])
    """
    return wide_filter_norms(weight, layer).to(weight.dtype)


CDIST_MAX_ROW = 25  # row_norms: longest row for which cdist beat vector_norm (k = 4..25: 0.26-1.0x its time)


def row_norms(w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    r"""`‖w[..., :]‖₂` over the last dimension; on CPU near memory bandwidth.

    `torch.linalg.vector_norm(w, dim=-1)` reduces a short inner dimension (the 9 weights
    of a 3×3 kernel slice) at a fraction of memory bandwidth on CPU: every row ends in a
    horizontal sum. On CPU, contiguous float32/float64 rows go to the compiled kernel of
    `dtg_gpu.graph.native` (eight rows summed at once in vector registers: 1.1–1.6× the time
    of a plain read for 3×3 slices, against 2.0–2.8× for `cdist` and 3.6–4.9× for `vector_norm`,
    `benchmarks/bench_filter_norms.py`). Where that kernel is off or cannot be built,
    float32 rows of at most `CDIST_MAX_ROW` (25: 3×3 and 5×5 kernels) elements take
    `torch.cdist` against the origin in its direct mode (no matrix-product expansion, so no
    cancellation); every other case (half precision, strided views, CUDA, longer rows such
    as a `Linear` after a flatten of 7×7 positions, where `cdist` measured 1.2–1.8×
    slower) takes `vector_norm`. All of them square before summing, in `w`'s precision,
    so they agree to rounding: see `norms_in_range` for when that is safe.

    Parameters
    ----------
    w : Tensor `[..., k]`
    out : Tensor `[...]`, optional
        Written in place and returned.

    Returns
    -------
    Tensor `[...]`
        The norms, in `w`'s dtype; NaN or Inf where a row holds one.

    Examples
    --------
    >>> row_norms(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    tensor([5., 0.])
    """
    k = w.shape[-1]
    if (
        w.device.type == "cpu"
        and w.dtype in (torch.float32, torch.float64)
        and w.is_contiguous()
        and k > 1
        and not (w.requires_grad and torch.is_grad_enabled())
    ):
        n = (
            out
            if out is not None and out.dtype == w.dtype and out.is_contiguous() and out.shape == w.shape[:-1]
            else torch.empty(w.shape[:-1], dtype=w.dtype)
        )
        if native_row_norms(w.view(-1, k), n.view(-1)):
            return n if out is None or n is out else out.copy_(n)
    if (
        w.device.type == "cpu"
        and w.dtype == torch.float32
        and w.is_contiguous()
        and 1 < k <= CDIST_MAX_ROW
        and w.numel()
    ):
        m = w.view(-1, k)
        n = torch.cdist(m, m.new_zeros(1, k), compute_mode="donot_use_mm_for_euclid_dist").view(w.shape[:-1])
        return n if out is None else out.copy_(n)
    if out is not None and out.dtype != w.dtype:
        return out.copy_(torch.linalg.vector_norm(w, dim=-1))
    return torch.linalg.vector_norm(w, dim=-1, out=out)


def plain_filter_norms(weight: torch.Tensor, layer: WeightLayer, out: torch.Tensor | None = None) -> torch.Tensor:
    """`sqrt(Σ w²)` per kernel slice with no range check (see `norms_in_range`)."""
    w = _slices(weight, layer)
    if w.shape[-1] == 1:
        return torch.abs(w[..., 0], out=out) if out is not None else w[..., 0].abs()
    return row_norms(w, out=out)


def wide_filter_norms(weight: torch.Tensor, layer: WeightLayer, out: torch.Tensor | None = None) -> torch.Tensor:
    """`filter_norms` before the cast back: float64 where the norms left the range of
    `weight`'s dtype, so that a caller can rescale them before casting (see
    `dtg_gpu.engine.solve.scaled_blocks`). With `out` (`[T, out, C/groups]` of
    `weight`'s dtype) the norms are written there, and `out` is returned unless they
    needed float64."""
    w = _slices(weight, layer)
    n = plain_filter_norms(weight, layer, out=out)
    if w.shape[-1] == 1 or norms_in_range(n):
        return n
    if w.dtype != torch.float64:  # float32/16 squares always fit float64's range
        return torch.linalg.vector_norm(w, dim=-1, dtype=torch.float64)
    a = w.abs().amax(-1, keepdim=True)
    a = torch.where(a > 0, a, torch.ones_like(a))
    return torch.mul(torch.linalg.vector_norm(w / a, dim=-1), a[..., 0], out=out)
