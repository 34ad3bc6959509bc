"""The channel graph's types: a weight layer (which channels it joins, how its kernel is sliced) and the topology of a model (its layers, node order, coverage, batch norm folding)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


_PARAM_OK = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.PReLU,
    nn.LocalResponseNorm,
)


@dataclass(frozen=True, eq=False)
class WeightLayer:
    r"""One weight layer and the nodes it joins.

    Attributes
    ----------
    name : str
        Qualified module name (`"features.0"`).
    param : str
        State-dict key of its weight (`"features.0.weight"`).
    kind : {"conv", "linear"}
    weight_shape : tuple of int
        Shape of the weight, `[out, in/groups, k...]` or `[out, in]`.
    out_nodes : LongTensor `[out]`
        Node of each output channel / feature.
    in_nodes : LongTensor `[C]`
        Node of each input channel. For a `Linear` after a flatten, `C = in / spatial`.
    groups : int
        Convolution groups: output `i` of group `g` joins inputs
        `in_nodes[g·C/groups : (g+1)·C/groups]`.
    spatial : int
        Positions per channel `S` of a flattened map consumed by a `Linear`.
    sources, source_shapes : tuple
        For a weight computed in the forward pass (a `Conv`/`Linear` subclass with its
        own `forward`, `F.conv2d(x, f(self.weight))`, LoRA's `W + B·A`): the
        state-dict entries it is computed from and their shapes; empty for a plain weight.
    effective : callable, optional
        That computation, traced from the forward pass (it depends on no input).
    batchnorm : tuple, optional
        The batch norm that directly follows the layer (its output's only consumer), as
        `(module name, eps, state-dict sources, their shapes)`, the sources being its
        `running_var` and, when affine, its `weight` (γ). Used by
        [`ChannelTopology.fold_batchnorm`][dtg_gpu.ChannelTopology.fold_batchnorm]; `None` otherwise.
    """

    name: str
    param: str
    kind: Literal["conv", "linear"]
    weight_shape: tuple[int, ...]
    out_nodes: torch.Tensor
    in_nodes: torch.Tensor
    groups: int = 1
    spatial: int = 1
    sources: tuple[str, ...] = ()
    source_shapes: tuple[tuple[int, ...], ...] = ()
    effective: Any = None
    batchnorm: tuple | None = None

    def effective_weight(self, state: dict) -> torch.Tensor:
        """The weight the forward pass uses: `state[param]`, or for a computed weight
        (weight standardisation, `W + B·A`, ...) the traced computation applied to the
        checkpoint's `sources` (in float32, or float64 when a source is)."""
        if self.effective is None:
            return state[self.param]
        args = [state[k] for k in self.sources]
        wide = torch.float64 if any(a.dtype == torch.float64 for a in args) else torch.float32
        with torch.no_grad():
            return self.effective(*[a.to(wide) for a in args])

    @property
    def out_channels(self) -> int:
        return int(self.out_nodes.numel())

    @property
    def in_channels(self) -> int:
        return int(self.in_nodes.numel())

    @property
    def block_shape(self) -> tuple[int, int]:
        """Shape `(out, C/groups)` of the filter-norm block of one checkpoint."""
        return (self.out_channels, self.in_channels // self.groups)

    @property
    def num_edges(self) -> int:
        return self.out_channels * (self.in_channels // self.groups)

    def edge_index(self) -> torch.Tensor:
        """Structural edges `[2, out·C/groups]` (row: output node, col: input node).

        Ordered like `block.reshape(-1)` of the layer's filter-norm block.
        """
        out, cin = self.block_shape
        i = torch.arange(out).repeat_interleave(cin)
        j = torch.arange(cin).repeat(out)
        group = i // (out // self.groups)
        return torch.stack([self.out_nodes[i], self.in_nodes[group * cin + j]])

    @cached_property
    def self_loops(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat block positions, and their nodes, where an output unit is its own input unit
        (`x + conv(x)`); empty unless the layer's input and output spaces share nodes."""
        if np.intersect1d(self.out_nodes.numpy(), self.in_nodes.numpy()).size == 0:
            none = torch.zeros(0, dtype=torch.long)
            return none, none
        edges = self.edge_index()
        hit = (edges[0] == edges[1]).nonzero().flatten()
        return hit, edges[0, hit]


@dataclass(frozen=True, eq=False)
class ChannelTopology:
    """The node layout of a model's channel graph (method step 2), independent of weights.

    Attributes
    ----------
    layers : tuple of WeightLayer
        In forward order.
    num_nodes : int
    node_owner : tuple of str
        For each node, the name of the layer whose output first created it (`"input"`
        for the input channels of the first weight layer).
    traced : bool
        `False` when torch.fx failed and module registration order was used.
    assumed_ops : tuple of str
        Operations of the forward pass that are in no table of [`dtg_gpu.topology.fx_pass`][dtg_gpu.Run.topology]
        (neither known to keep the channels, like activations, pooling and normalisation, nor
        to map them, like slicing and concatenation) and were assumed to keep their input's
        channels, each as `op 'name' (node ...) in module ...`. A weight layer that then finds
        the wrong number of channels names the op in its error.
    """

    layers: tuple[WeightLayer, ...]
    num_nodes: int
    node_owner: tuple[str, ...]
    traced: bool = True
    coverage_rows: tuple = ()
    assumed_ops: tuple[str, ...] = ()

    @property
    def source_params(self) -> dict[str, tuple[int, ...]]:
        """Every state-dict entry the graph's weights are read or computed from, with its
        shape (plain weights and the sources of computed ones)."""
        out: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            if layer.effective is None:
                out.setdefault(layer.param, layer.weight_shape)
            else:
                out.update(zip(layer.sources, layer.source_shapes))
        return out

    def coverage(self):
        """Every parameter of the model and what became of it (pandas `DataFrame`).

        Columns `parameter`, `shape`, `role` (`graphed`, `bias`,
        `normalisation`, `embedding`, `unsupported`) and `reason`. A conv/linear
        weight that is not graphed is `unsupported` with the reason: never silent.
        """
        import pandas as pd

        return pd.DataFrame(list(self.coverage_rows), columns=["parameter", "shape", "role", "reason"])

    @property
    def num_edges(self) -> int:
        """Number of (layer, output, input) weight slices, parallel edges counted apart."""
        return sum(layer.num_edges for layer in self.layers)

    @property
    def params(self) -> list[str]:
        """State-dict keys of the weights the graph is made from (no duplicates)."""
        return list(dict.fromkeys(layer.param for layer in self.layers))

    @cached_property
    def folded(self) -> "ChannelTopology":
        """[`fold_batchnorm`][dtg_gpu.ChannelTopology.fold_batchnorm], made once per topology (so runs that share a topology
        share the folded one, and its index plans)."""
        if not any(layer.batchnorm for layer in self.layers):
            return self
        layers = []
        for layer in self.layers:
            if layer.batchnorm is None:
                layers.append(layer)
                continue
            bn, eps, bn_sources, bn_shapes = layer.batchnorm
            own = layer.sources or (layer.param,)
            own_shapes = layer.source_shapes or (layer.weight_shape,)
            layers.append(
                replace(
                    layer,
                    sources=tuple(own) + tuple(bn_sources),
                    source_shapes=tuple(own_shapes) + tuple(bn_shapes),
                    effective=_FoldedBatchNorm(layer.effective, len(own), float(eps), len(bn_sources) == 2),
                    batchnorm=None,
                )
            )
        folded = replace(self, layers=tuple(layers))
        folded.__dict__["folded"] = folded  # folding twice is folding once
        return folded

    def fold_batchnorm(self) -> "ChannelTopology":
        r"""This topology with batch norm folded into the layers it follows (option beyond
        the method: `fold_batchnorm=True` of analyze and featurize).

        A conv or linear whose output goes only into a `BatchNorm1d/2d/3d` that keeps
        running statistics gets the weight that network computes with at inference,

        .. math::
            W'_{o} = \frac{\gamma_o}{\sqrt{\sigma^2_o + \varepsilon}}\, W_{o}

        per output channel `o` ($\gamma = 1$ without affine parameters). The edges are
        the norms of $W'$. Batch norm makes the scale of $W$ irrelevant to what the
        network computes; $W'$ carries the scale that matters. Other layers are
        unchanged; nodes and edges are the same. Folding needs the forward pass traced by
        torch.fx (a model traced another way is returned as it is).

        Returns
        -------
        ChannelTopology
            `self` when no layer is followed by batch norm.
        """
        return self.folded

    def signature(self) -> tuple:
        """A hashable key: two models with equal signatures share every graph index."""
        return (self.num_nodes,) + tuple(
            (l.param, l.weight_shape, l.groups, l.spatial, tuple(l.out_nodes.tolist()), tuple(l.in_nodes.tolist()))
            for l in self.layers
        )

    @cached_property
    def num_structural_components(self) -> int:
        """Connected components of the graph when every weight slice is non-zero.

        Each group of a layer joins its output nodes and its input nodes: a star from the
        group's first output node to the others is enough for connectivity
        (`scipy.sparse.csgraph.connected_components`)."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        rows, cols = [], []
        for layer in self.layers:
            out, cin = layer.block_shape
            opg = out // layer.groups
            for g in range(layer.groups):
                members = torch.cat([layer.out_nodes[g * opg : (g + 1) * opg], layer.in_nodes[g * cin : (g + 1) * cin]])
                rows.append(np.full(len(members), int(members[0])))
                cols.append(members.numpy())
        n = self.num_nodes
        r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        graph = coo_matrix((np.ones(len(r)), (r, c)), shape=(n, n))
        return int(connected_components(graph, directed=False)[0])

    def structurally_connected(self) -> bool:
        """Whether the graph is connected when every weight slice is non-zero."""
        return self.num_structural_components == 1

    @cached_property
    def bipartition(self) -> np.ndarray | None:
        r"""A two-colouring in which every layer joins its input side to its output side.

        Returns a bool array `[num_nodes]` (`True`: the second colour) such that, in
        every weight layer, all input nodes share one colour and all output nodes the
        other; `None` when there is none (a self-loop, a residual connection that joins
        nodes two layers apart, an odd cycle). Plain chains such as LeNet-5 and VGG have
        one (even layers against odd layers); ResNets do not. Every edge of such a graph
        joins the two colours, so its adjacency is $\begin{pmatrix}0 & C\\ C^\top & 0
        \end{pmatrix}$ and its spectrum is symmetric (see `BipartiteSquare`).

        Computed once per architecture from the layers alone: a node `v` gets the
        copies `(v, 0)`, `(v, 1)`; "same colour" joins `(a, k)` to `(b, k)`,
        "other colour" joins `(a, k)` to `(b, 1-k)`. The constraints are satisfiable
        exactly when no `(v, 0)` is connected to its own `(v, 1)`.
        """
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        n = self.num_nodes
        a_list, b_list, flip = [], [], []
        for layer in self.layers:
            ins, outs = layer.in_nodes.numpy(), layer.out_nodes.numpy()
            ref = ins[:1]
            a_list += [np.repeat(ref, ins.size), np.repeat(ref, outs.size)]
            b_list += [ins, outs]
            flip += [np.zeros(ins.size, dtype=np.int64), np.ones(outs.size, dtype=np.int64)]
        if not a_list:
            return None
        a, b, f = np.concatenate(a_list), np.concatenate(b_list), np.concatenate(flip)
        rows = np.concatenate([a, a + n])
        cols = np.concatenate([b + f * n, b + (1 - f) * n])
        graph = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(2 * n, 2 * n))
        _, label = connected_components(graph, directed=False)
        if bool((label[:n] == label[n:]).any()):
            return None
        return label[:n] > label[n:]


class _FoldedBatchNorm:
    """The effective weight of a layer followed by batch norm: its own effective weight
    (`base` on its first `n` sources, or the plain weight) times
    `γ/√(σ² + ε)` per output channel."""

    def __init__(self, base: Any, n: int, eps: float, affine: bool):
        self.base, self.n, self.eps, self.affine = base, n, eps, affine

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        own, bn = tensors[: self.n], tensors[self.n :]
        w = self.base(*own) if self.base is not None else own[0]
        scale = torch.rsqrt(bn[0] + self.eps)
        if self.affine:
            scale = bn[1] * scale
        return w * scale.reshape((-1,) + (1,) * (w.dim() - 1))

    def __repr__(self) -> str:
        return f"FoldedBatchNorm(eps={self.eps}, affine={self.affine})"


def weight_layout(topology) -> list:
    """`[[param, [weight shape]], ...]` of a channel topology's weight layers, in forward
    order: what a saved predictor records about the runs it was trained on."""
    return [[layer.param, list(layer.weight_shape)] for layer in topology.layers]
