r"""Checkpoint weights → per-timestep channel graphs (method step 2), batched over timesteps.

A graph is kept as one dense *filter-norm block* per weight layer,

.. math::
    B^{(l)}_{t, i, j} = \lVert W^{(l)}_t[i, j, \dots] \rVert_2 ,
    \qquad B^{(l)} \in \mathbb{R}^{T \times \text{out} \times C/g},

and the adjacency of timestep `t` is the sum over layers of `B` scattered to
(output node, input node) and its transpose, with self-loops (an output node that is also
its own input node) counted once. `BlockOperator` applies that adjacency to `G`
vectors at once with two batched matrix products per layer and never forms `A`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import networkx as nx
import numpy as np
import torch

from dtg_gpu.exceptions import CheckpointError
from dtg_gpu.graph.native import native_row_norms
from dtg_gpu.topology.types import ChannelTopology, WeightLayer

__all__ = [
    "filter_norms",
    "wide_filter_norms",
    "BlockOperator",
    "BipartiteSquare",
    "graph_edges",
    "to_pyg",
    "to_networkx",
]


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


def _as_slice(idx: torch.Tensor) -> slice | None:
    n = idx.numel()
    if n and int(idx[-1]) - int(idx[0]) == n - 1 and bool((idx.diff() == 1).all()):
        return slice(int(idx[0]), int(idx[0]) + n)
    return None


_PLANS: "weakref.WeakKeyDictionary[ChannelTopology, dict]" = weakref.WeakKeyDictionary()


def _cached_plan(topology: ChannelTopology, device: torch.device, kind: str, build):
    """Index plans depend on the topology and device only: built once, not once per chunk
    (measured: 0.16 s of a 1.3 s featurisation of 1,920 LeNet-5 graphs went to rebuilding them)."""
    per_topo = _PLANS.setdefault(topology, {})
    key = (kind, str(device))
    if key not in per_topo:
        per_topo[key] = build(topology, device)
    return per_topo[key]


def _block_plan(topology: ChannelTopology, device: torch.device) -> list:
    return [
        (
            layer.groups,
            _as_slice(layer.out_nodes),
            layer.out_nodes.to(device),
            _as_slice(layer.in_nodes),
            layer.in_nodes.to(device),
        )
        for layer in topology.layers
    ]


def _square_plan(topology: ChannelTopology, device: torch.device):
    colour = topology.bipartition
    assert colour is not None  # called for bipartite topologies only
    side = bool(colour.sum() < colour.size - colour.sum())  # the smaller colour
    p_nodes, q_nodes = np.flatnonzero(colour == side), np.flatnonzero(colour != side)
    pos = np.empty(colour.size, dtype=np.int64)
    pos[p_nodes], pos[q_nodes] = np.arange(p_nodes.size), np.arange(q_nodes.size)
    plan = []
    for i, layer in enumerate(topology.layers):
        in_p = bool(colour[int(layer.in_nodes[0])] == side)
        ip, op_ = torch.as_tensor(pos[layer.in_nodes.numpy()]), torch.as_tensor(pos[layer.out_nodes.numpy()])
        plan.append((i, in_p, _as_slice(ip), ip.to(device), _as_slice(op_), op_.to(device)))
    return torch.as_tensor(p_nodes, device=device), torch.as_tensor(q_nodes, device=device), plan


class BlockOperator:
    r"""The adjacency matrices of `G` channel graphs that share a topology, as an operator.

    .. math::
        (A x)_{g} = \sum_l P_{\text{out}}^{(l)} B^{(l)}_g P_{\text{in}}^{(l)\top} x_g
                   + P_{\text{in}}^{(l)} B^{(l)\top}_g P_{\text{out}}^{(l)\top} x_g
                   - \operatorname{diag}(d_g)\, x_g

    where `d` removes the second count of self-loops.

    Parameters
    ----------
    topology : ChannelTopology
    blocks : sequence of Tensor `[G, out, C/groups]`
        One filter-norm block per layer of `topology` (see `filter_norms`).
    transposed_copy : bool, default False
        Also keep each ungrouped block transposed and contiguous for `B x`. Without it, on
        CPU both products of a layer are still row-vector × matrix: `B x` is taken as
        `xᵀ Bᵀ` on the transposed *view* (BLAS reads `B` with its transpose flag), since
        a batched matrix × *column* vector runs at ~5 GB/s against ~60 GB/s for the
        row-vector form (2 cores). The view's product is 1.2–1.6× slower than the copy's, but
        the copy costs about 20 products (`[10, 512, 512]` float32: 3 ms against 0.15 ms),
        and a Lanczos solve takes 6–15; the copy pays only for hundreds of iterations, and
        doubles the block memory (`benchmarks/results/filter_norms_cpu.md`). On GPU
        the column form is kept (batched GEMV is bandwidth-bound either way).
    scale : Tensor `[G]`, optional
        The graphs' weights are `blocks · scale` (see `dtg_gpu.engine.solve.scaled_blocks`):
        the operator applies `A / scale` and solvers report eigenvalues in the units of
        `A`. Default: ones.

    Examples
    --------
    >>> from torch import nn
    >>> from dtg_gpu import channel_topology
    >>> topo = channel_topology(nn.Sequential(nn.Linear(2, 1, bias=False)))
    >>> op = BlockOperator(topo, [torch.tensor([[[1., 2.]]])])
    >>> op(torch.tensor([[1., 1., 1.]]))  # nodes: 2 inputs, then 1 output
    tensor([[1., 2., 3.]])
    """

    def __init__(
        self,
        topology: ChannelTopology,
        blocks: Sequence[torch.Tensor],
        transposed_copy: bool = False,
        scale: torch.Tensor | None = None,
    ):
        if len(blocks) != len(topology.layers):
            raise ValueError(f"expected {len(topology.layers)} blocks, got {len(blocks)}")
        self.topology = topology
        self.blocks = list(blocks)
        first = self.blocks[0]
        self.num_graphs, self.num_nodes = first.shape[0], topology.num_nodes
        self.dtype, self.device = first.dtype, first.device
        self.scale = (
            torch.ones(self.num_graphs, dtype=torch.float64, device=self.device)
            if scale is None
            else scale.to(device=self.device, dtype=torch.float64)
        )
        self._plan = _cached_plan(topology, self.device, "block", _block_plan)
        diag = None
        for layer, block in zip(topology.layers, self.blocks):
            if tuple(block.shape) != (self.num_graphs,) + layer.block_shape:
                raise ValueError(
                    f"block of {layer.param!r} has shape {list(block.shape)}, "
                    f"expected {[self.num_graphs, *layer.block_shape]}"
                )
            pos, nodes = layer.self_loops
            if pos.numel():
                if diag is None:
                    diag = torch.zeros(self.num_graphs, self.num_nodes, dtype=self.dtype, device=self.device)
                diag.index_add_(1, nodes.to(self.device), block.reshape(self.num_graphs, -1)[:, pos.to(self.device)])
        self._diag = diag
        self._row_form = self.device.type == "cpu"
        self._blocks_t = [
            b.mT.contiguous() if transposed_copy and plan[0] == 1 else None for b, plan in zip(self.blocks, self._plan)
        ]

    def layer_out(self, i: int, xin: torch.Tensor) -> torch.Tensor:
        """Layer `i`'s block applied to its input nodes: `[G, C] → B xin  [G, out]`."""
        block, block_t, groups = self.blocks[i], self._blocks_t[i], self._plan[i][0]
        if block_t is not None:
            return torch.bmm(xin.unsqueeze(1), block_t).squeeze(1)
        if groups == 1:
            if self._row_form:  # xᵀ Bᵀ through the transposed view: no copy (see transposed_copy)
                return torch.bmm(xin.unsqueeze(1), block.mT).squeeze(1)
            return torch.bmm(block, xin.unsqueeze(-1)).squeeze(-1)
        g_count, out, cin = block.shape
        bg = block.view(g_count, groups, out // groups, cin)
        if cin == 1:  # depthwise: elementwise products
            return (bg.squeeze(-1) * xin.view(g_count, groups, 1)).reshape(g_count, out)
        if self._row_form:
            return torch.matmul(xin.view(g_count, groups, 1, cin), bg.mT).reshape(g_count, out)
        return torch.matmul(bg, xin.view(g_count, groups, cin, 1)).reshape(g_count, out)

    def layer_in(self, i: int, xout: torch.Tensor) -> torch.Tensor:
        """Layer `i`'s transposed block applied to its output nodes: `Bᵀ xout  [G, C]`."""
        block, groups = self.blocks[i], self._plan[i][0]
        if groups == 1:
            return torch.bmm(xout.unsqueeze(1), block).squeeze(1)
        g_count, out, cin = block.shape
        bg = block.view(g_count, groups, out // groups, cin)
        if cin == 1:
            return (bg.squeeze(-1) * xout.view(g_count, groups, -1)).sum(-1).reshape(g_count, -1)
        return torch.matmul(xout.view(g_count, groups, 1, -1), bg).reshape(g_count, -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Apply every adjacency: `x [G, N] → A x [G, N]`."""
        y = torch.zeros_like(x)
        for i, (_groups, out_sl, out_idx, in_sl, in_idx) in enumerate(self._plan):
            _add(y, out_sl, out_idx, self.layer_out(i, _take(x, in_sl, in_idx)))
            _add(y, in_sl, in_idx, self.layer_in(i, _take(x, out_sl, out_idx)))
        if self._diag is not None:
            y -= self._diag * x
        return y

    def bipartite_square(self) -> "BipartiteSquare | None":
        """The operator `BipartiteSquare` when the topology is bipartite, else `None`."""
        return BipartiteSquare(self) if self.topology.bipartition is not None else None

    def layers_positively_connected(self) -> torch.Tensor:
        """BoolTensor `[G]`, a sufficient test that zero weights disconnect nothing.

        True when, in every group of every layer, some input unit has positive weights to
        all outputs and no input unit has only zero weights: then each layer's positive
        edges still join all of its nodes, and the graph is as connected as its structure.
        """
        ok = torch.ones(self.num_graphs, dtype=torch.bool, device=self.device)
        for block, (groups, *_rest) in zip(self.blocks, self._plan):
            pos = (block > 0).view(self.num_graphs, groups, -1, block.shape[2])
            full_col = pos.all(2).any(-1)
            no_zero_col = pos.any(2).all(-1)
            ok &= (full_col & no_zero_col).all(-1)
        return ok

    def has_zero_weights(self) -> torch.Tensor:
        """BoolTensor `[G]`: some weight slice of the graph is exactly zero."""
        out = torch.zeros(self.num_graphs, dtype=torch.bool, device=self.device)
        for block in self.blocks:  # norms are >= 0: a zero is the minimum (no [G, E] mask)
            out |= block.reshape(self.num_graphs, -1).amin(1) == 0
        return out


def _add(y: torch.Tensor, sl: slice | None, idx: torch.Tensor, val: torch.Tensor) -> None:
    if sl is not None:
        y[:, sl] += val
    else:
        y.index_add_(1, idx, val)


def _take(x: torch.Tensor, sl: slice | None, idx: torch.Tensor) -> torch.Tensor:
    return x[:, sl] if sl is not None else x.index_select(1, idx)


class BipartiteSquare:
    r"""`C Cᵀ` on one side of a bipartite channel graph: the same Perron vector, half the work.

    When every layer joins one colour of [`ChannelTopology.bipartition`][dtg_gpu.ChannelTopology.bipartition] to the other,
    ordering the nodes by colour gives

    .. math::
        A = \begin{pmatrix} 0 & C \\ C^\top & 0 \end{pmatrix}, \qquad
        A \begin{pmatrix} u \\ v \end{pmatrix} = \lambda \begin{pmatrix} u \\ v \end{pmatrix}
        \iff C C^\top u = \lambda^2 u,\ v = C^\top u / \lambda ,

    and the spectrum of `A` is symmetric, `±λᵢ`. Lanczos on `A` must resolve
    `λ₁` against `λ₂` across the whole interval `[-λ₁, λ₂]`; on `M = C Cᵀ` it resolves
    `λ₁²` against `[0, λ₂²]`, a relative gap about 4× larger, so it needs about half
    as many products, and a product with `M` reads every block twice, as one with `A`
    does. With `u` of unit norm and `λ² = uᵀMu`, `x = (u, Cᵀu/λ)/√2` has unit norm and

    .. math::
        \frac{\lVert A x - \lambda x \rVert}{\lambda}
        = \frac{\lVert M u - \lambda^2 u \rVert}{\sqrt 2\, \lambda^2},

    so a residual on `M` certifies one on `A` exactly. `u` lives on the smaller colour.

    Parameters
    ----------
    op : BlockOperator
        Its topology must have a bipartition.
    """

    def __init__(self, op: BlockOperator):
        colour = op.topology.bipartition
        if colour is None:
            raise ValueError("the channel graph is not bipartite: use the BlockOperator itself")
        self.op = op
        self.dtype, self.device, self.num_graphs = op.dtype, op.device, op.num_graphs
        self.p_nodes, self.q_nodes, self._plan = _cached_plan(op.topology, op.device, "square", _square_plan)
        self.num_nodes = self.p_nodes.numel()  # the size of the vectors this operator acts on

    def _across(self, x: torch.Tensor, from_p: bool) -> torch.Tensor:
        """One block product per layer from one colour to the other (`Cᵀx` or `Cx`)."""
        y = x.new_zeros(x.shape[0], (self.q_nodes if from_p else self.p_nodes).numel())
        for i, in_p, in_sl, in_idx, out_sl, out_idx in self._plan:
            if in_p == from_p:  # x lives on the layer's inputs
                _add(y, out_sl, out_idx, self.op.layer_out(i, _take(x, in_sl, in_idx)))
            else:
                _add(y, in_sl, in_idx, self.op.layer_in(i, _take(x, out_sl, out_idx)))
        return y

    def half(self, u: torch.Tensor) -> torch.Tensor:
        """`Cᵀ u`: `[G, |P|] → [G, |Q|]`, one product per layer."""
        return self._across(u, True)

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        """`C Cᵀ u`: `[G, |P|] → [G, |P|]`, two products per layer like `A x`."""
        return self._across(self._across(u, True), False)

    def lift(self, u: torch.Tensor, eigenvalue: torch.Tensor) -> torch.Tensor:
        """`x = (u, Cᵀu/λ)` in node order, unit norm; uniform `1/√N` where `λ = 0`."""
        g_count = u.shape[0]
        lam = eigenvalue.clamp_min(torch.finfo(u.dtype).tiny)[:, None]
        x = u.new_zeros(g_count, self.op.num_nodes)
        x[:, self.p_nodes] = u
        x[:, self.q_nodes] = self.half(u) / lam
        x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)
        flat = torch.full_like(x, self.op.num_nodes**-0.5)
        return torch.where((eigenvalue > 0)[:, None], x, flat)


def graph_edges(
    topology: ChannelTopology, blocks: Sequence[torch.Tensor], g: int = 0, *, directed_pairs: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Edge list of graph `g` of a batch of blocks, parallel edges summed.

    Parameters
    ----------
    topology : ChannelTopology
    blocks : sequence of Tensor `[G, out, C/groups]`
    g : int
        Which graph of the batch.
    directed_pairs : bool, default True
        `True`: both directions of every edge (PyG's convention for an undirected
        graph), self-loops once. `False`: each undirected edge once, `row <= col`.

    Returns
    -------
    edge_index : LongTensor `[2, E]`
    edge_weight : Tensor `[E]`
    """
    from torch_geometric.utils import coalesce

    rows, cols, ws = [], [], []
    for layer, block in zip(topology.layers, blocks):
        e = layer.edge_index()
        w = block[g].reshape(-1).detach().cpu()
        lo, hi = torch.minimum(e[0], e[1]), torch.maximum(e[0], e[1])
        rows.append(lo)
        cols.append(hi)
        ws.append(w)
    ei = torch.stack([torch.cat(rows), torch.cat(cols)])
    ew = torch.cat(ws)
    ei, ew = coalesce(ei, ew, num_nodes=topology.num_nodes, reduce="sum")
    if directed_pairs:
        off = ei[0] != ei[1]
        ei = torch.cat([ei, ei[:, off].flip(0)], dim=1)
        ew = torch.cat([ew, ew[off]])
        ei, ew = coalesce(ei, ew, num_nodes=topology.num_nodes, reduce="sum")
    return ei, ew


def to_pyg(topology: ChannelTopology, blocks: Sequence[torch.Tensor], g: int = 0):
    """Graph `g` as `torch_geometric.data.Data(edge_index, edge_weight, num_nodes)`."""
    from torch_geometric.data import Data

    ei, ew = graph_edges(topology, blocks, g, directed_pairs=True)
    return Data(edge_index=ei, edge_weight=ew, num_nodes=topology.num_nodes)


def to_networkx(topology: ChannelTopology, blocks: Sequence[torch.Tensor], g: int = 0) -> nx.Graph:
    """Graph `g` as a `networkx.Graph` with nodes `0..N-1` and edge attribute `weight`."""
    ei, ew = graph_edges(topology, blocks, g, directed_pairs=False)
    graph = nx.Graph()
    graph.add_nodes_from(range(topology.num_nodes))
    graph.add_weighted_edges_from(zip(ei[0].tolist(), ei[1].tolist(), np.asarray(ew, dtype=float).tolist()))
    return graph
