"""Per-graph scaling: a batch of checkpoints' weights turned into each layer's block of edge weights, divided by a power of two per graph (exact; the centrality is scale-free), with which graphs were finite."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dtg_gpu.graph.norms import norms_in_range, plain_filter_norms, wide_filter_norms
from dtg_gpu.topology.types import ChannelTopology

__all__ = ["GraphBlocks", "scaled_blocks", "load_blocks", "SMALL_LAYER"]

SMALL_LAYER = 1 << 16  # weights: layers up to this size are stacked before taking norms


class GraphBlocks(NamedTuple):
    """Filter-norm blocks of `G` graphs, each divided by its own power-of-two scale.

    Attributes
    ----------
    blocks : list of Tensor `[G, out, C/groups]`
        Per layer, in the compute dtype; graph `g`'s largest edge weight lies in
        `[0.5, 1)` (zero for an all-zero graph and for non-finite checkpoints).
    finite : BoolTensor `[G]`
        Every weight of the checkpoint was finite.
    scale : Tensor `[G]` (float64)
        `2^e`: graph `g`'s edge weights are `blocks[l][g] · scale[g]` exactly.
    """

    blocks: list
    finite: torch.Tensor
    scale: torch.Tensor


def _widen(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Weights on `device` in float32, or float64 when either they or `dtype` are: norms
    of float16/bfloat16 are never taken in their own narrow range, and float64 weights are
    not squeezed into float32 before they are scaled. Detached: parameters that require
    grad (`dict(model.named_parameters())` as a checkpoint) give plain results."""
    wide = torch.float64 if torch.float64 in (t.dtype, dtype) else torch.float32
    return t.detach().to(device=device, non_blocking=True).to(wide)


def scaled_blocks(
    topology: ChannelTopology, weights: Sequence[dict[str, torch.Tensor]], device: torch.device, dtype: torch.dtype
) -> GraphBlocks:
    r"""Filter-norm blocks of `G` checkpoints, scaled per graph so no product can overflow.

    Eigenvector centrality does not depend on the scale of the weights: `cA` has the
    eigenvectors of `A`. Each graph is divided by `2^e`, the power of two just above its
    largest edge weight (exact: only the exponent changes), so that a float32 solve sees
    entries in `[0, 1)` whatever the checkpoint holds, from diverged runs (`|w| ≈ 1e17`
    and beyond) to vanishing ones (`1e-20`). The norms themselves are taken without
    overflow or underflow (`wide_filter_norms`) and in float64 where
    they leave the compute dtype's range, then scaled, then cast.

    Blocks of a checkpoint with any NaN/Inf weight are zeroed so that they cannot leak into
    the other graphs of the batch.

    `iter_solve` calls this in a background thread for the next chunk. The norms
    are taken checkpoint by checkpoint as the weights arrive (they come from
    separate files anyway) and only the blocks are stacked: stacking the raw weights first
    costs a copy of every weight (and as much memory again). Layers of
    at most `SMALL_LAYER` weights are stacked first instead: for them the cost is per
    operation, not per byte (LeNet-5: 1,920 checkpoints × 5 layers of tiny norms).
    """
    g_count = len(weights)
    blocks: list[torch.Tensor] = []
    for layer in topology.layers:
        b: torch.Tensor | None
        if int(np.prod(layer.weight_shape)) <= SMALL_LAYER:  # few big ops beat many tiny ones
            b = wide_filter_norms(torch.stack([_widen(ws[layer.param], device, dtype) for ws in weights]), layer)
        else:  # norms written in place, checkpoint by checkpoint: no stacked copy of weights or blocks
            b = None
            for g, ws in enumerate(weights):  # plain norms; one range check (one sync) per layer
                w = _widen(ws[layer.param], device, dtype)  # one checkpoint widened at a time
                if b is None:
                    b = torch.empty((g_count,) + layer.block_shape, dtype=w.dtype, device=device)
                plain_filter_norms(w[None], layer, out=b[g : g + 1])
            assert b is not None  # weights holds at least one checkpoint
            if not norms_in_range(b):  # rare: overflow/underflow hazard, redo the layer safely
                b = torch.cat(
                    [
                        wide_filter_norms(_widen(ws[layer.param], device, dtype)[None], layer).to(torch.float64)
                        for ws in weights
                    ]
                )
        blocks.append(b)
    peak = torch.stack([b.reshape(g_count, -1).amax(1).to(torch.float64) for b in blocks]).amax(0)
    finite = torch.isfinite(peak)  # amax propagates NaN and Inf
    exponent = torch.frexp(torch.where(finite, peak, torch.zeros_like(peak))).exponent
    scale = torch.ldexp(torch.ones_like(peak), exponent)
    inv = torch.ldexp(torch.ones_like(peak), -exponent)
    extreme = bool((exponent.abs() > 100).any())  # 2^-e leaves float32's normal range
    all_finite = bool(finite.all())
    out = []
    for b in blocks:
        if extreme and b.dtype != torch.float64:
            b = b.double()
        b = b.mul_(inv.to(b.dtype)[:, None, None]).to(dtype)  # fresh blocks: scaled in place
        if not all_finite:
            b[~finite] = 0.0
        out.append(b)
    return GraphBlocks(out, finite, scale)


def load_blocks(
    topology: ChannelTopology, weights: Sequence[dict[str, torch.Tensor]], device: torch.device, dtype: torch.dtype
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Filter-norm blocks `[G, out, C/g]` per layer of `G` checkpoints in the weights' own
    units (for edge lists: [`AnalysisResult.graph`][dtg_gpu.AnalysisResult.graph]), and their finiteness.

    The solver uses `scaled_blocks`; an edge weight beyond `dtype`'s range is `inf`
    here. Blocks of a checkpoint with any NaN/Inf weight are zero.
    """
    gb = scaled_blocks(topology, weights, device, dtype)
    return [b * gb.scale.to(dtype)[:, None, None] for b in gb.blocks], gb.finite
