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

import weakref
from collections.abc import Sequence

import numpy as np
import torch

from dtg_gpu.topology.types import ChannelTopology

__all__ = ["BlockOperator", "BipartiteSquare"]


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
