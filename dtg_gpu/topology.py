r"""The channel topology of a model: which channel spaces every weight layer joins (method step 2).

A model's *weight layers* are its `Conv1d/2d/3d` and `Linear` modules, in the order
the forward pass runs them. Its *nodes* are channel spaces: the input channels of the
first weight layer and the output channels / features of every weight layer. This module
derives, once per architecture, for every weight layer the node index of each output
unit and each input unit. Weights never enter here: the same topology serves every
checkpoint of every run of that architecture.

The forward pass is read with `torch.fx`. Each traced value carries the node ids of
its channel dimension; these rules move them along:

* a weight layer allocates new ids for its outputs;
* `a + b`, `a - b`, `a * b`, `a / b`, `maximum`/`minimum` of two tensors with the
  same channel count unify their ids (residual streams are one set of nodes; an SE gate and
  the features it scales too), whatever the operand order;
* `torch.cat(..., dim=1)` concatenates ids; channel slicing is not modelled;
* `flatten` / `view(B, -1)` keeps the ids and marks the value flat, so a `Linear`
  with `in = C·S` sees `C` channels of `S` positions each;
* every other op (activations, pooling, normalisation, dropout, ...) keeps its first
  tensor argument's ids.

Nodes are numbered in order of first appearance: a unified class takes the place of its
earliest member.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from dtg_gpu.exceptions import TopologyError, TracingFallbackWarning, UncoveredWeightsWarning

__all__ = ["WeightLayer", "ChannelTopology", "channel_topology"]

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
        Operations of the forward pass that are in no table of [`dtg_gpu.topology`][dtg_gpu.Run.topology]
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


# ----------------------------------------------------------------------------- tracing
class _Cell:
    """A channel space whose node ids may be fixed later (the model input)."""

    __slots__ = ("ids",)

    def __init__(self, ids: np.ndarray | None = None):
        self.ids = ids


@dataclass
class _Val:
    cell: _Cell
    flat: bool = False
    split: tuple | None = None  # the channel dim viewed as several dims (channel shuffle)
    via: str | None = None  # a layout op passed on the way whose channel mapping is assumed


class _Pieces(list):
    """The channel slices of `chunk`/`split` along dim 1 (a tuple of values)."""


class _SizeOf:
    """`x.size()` of a channel-carrying value: `[1]` is its channel count."""

    def __init__(self, val: _Val):
        self.val = val


class _EvalParametrization:
    """The weight a `torch.nn.utils.parametrize` list computes from the checkpoint's
    tensors (its `original*` parameters and its parametrizations' buffers, e.g. spectral
    norm's `_u`/`_v`), evaluated in eval mode: no power-iteration step, no buffer
    written, the same weight at every call (what the network computes at inference)."""

    def __init__(self, plist: nn.Module, names: tuple[str, ...]):
        self.plist, self.names = plist, names

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        modes = [(m, m.training) for m in self.plist.modules()]
        try:
            for m, _ in modes:
                m.training = False
            with torch.no_grad():
                return torch.func.functional_call(self.plist, dict(zip(self.names, tensors)), ())
        finally:
            for m, mode in modes:
                m.training = mode


def _legacy_hook(module: nn.Module, kinds: tuple[type, ...]) -> Any:
    """The forward pre-hook of one of `kinds` that computes `module.weight`, if any."""
    for hook in getattr(module, "_forward_pre_hooks", {}).values():
        if isinstance(hook, kinds) and getattr(hook, "name", getattr(hook, "_tensor_name", None)) == "weight":
            return hook
    return None


def _reparametrized(name: str, module: nn.Module) -> tuple[tuple, tuple, Any]:
    """A module whose `weight` is computed from other tensors. Returns the state-dict
    sources, their shapes and the computation (eval-mode semantics, exactly as torch computes
    it); empty for a plain weight.

    * `torch.nn.utils.parametrize` (`parametrizations.weight.original*`): weight norm,
      spectral norm (with the checkpoint's `_u`/`_v`, no power-iteration step),
      orthogonal, user parametrizations;
    * legacy `torch.nn.utils.weight_norm` (`weight_g`, `weight_v`) at the `dim` the
      hook recorded (`None`: one norm over the whole tensor);
    * legacy `torch.nn.utils.spectral_norm` (`weight_orig`, `weight_u`, `weight_v`):
      `weight_orig / σ` with `σ = uᵀ W v` from the checkpoint's `u` and `v`;
    * `torch.nn.utils.prune` (`weight_orig` × `weight_mask`).
    """
    from torch.nn.utils.prune import BasePruningMethod
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    prefix = f"{name}." if name else ""
    plist = getattr(getattr(module, "parametrizations", None), "weight", None)
    if plist is not None:
        originals = sorted(k for k, _ in plist.named_parameters(recurse=False) if k.startswith("original"))
        buffers = sorted(k for k, _ in plist.named_buffers())
        names = tuple(originals + buffers)
        sources = tuple(f"{prefix}parametrizations.weight.{k}" for k in names)
        shapes = tuple(
            tuple(plist.get_parameter(k).shape if k in originals else plist.get_buffer(k).shape) for k in names
        )
        return sources, shapes, _EvalParametrization(plist, names)
    hook = _legacy_hook(module, (WeightNorm,))
    g, v = getattr(module, "weight_g", None), getattr(module, "weight_v", None)
    if hook is not None and isinstance(g, torch.Tensor) and isinstance(v, torch.Tensor):
        dim = -1 if hook.dim is None else int(hook.dim)

        def legacy(weight_g, weight_v, _dim=dim):  # what WeightNorm.compute_weight does
            return torch._weight_norm(weight_v, weight_g, _dim)

        return (f"{prefix}weight_g", f"{prefix}weight_v"), (tuple(g.shape), tuple(v.shape)), legacy
    hook = _legacy_hook(module, (SpectralNorm,))
    if hook is not None:
        orig, u, v = (getattr(module, f"weight_{k}") for k in ("orig", "u", "v"))

        def spectral(weight_orig, weight_u, weight_v, _hook=hook):  # SpectralNorm.compute_weight, eval mode
            mat = _hook.reshape_weight_to_matrix(weight_orig)
            sigma = torch.dot(weight_u, torch.mv(mat, weight_v))
            return weight_orig / sigma

        names = tuple(f"{prefix}weight_{k}" for k in ("orig", "u", "v"))
        return names, (tuple(orig.shape), tuple(u.shape), tuple(v.shape)), spectral
    hook = _legacy_hook(module, (BasePruningMethod,))
    if hook is not None:
        orig, mask = module.weight_orig, module.weight_mask

        def pruned(weight_orig, weight_mask):  # BasePruningMethod.apply_mask
            return weight_orig * weight_mask.to(weight_orig.dtype)

        return (f"{prefix}weight_orig", f"{prefix}weight_mask"), (tuple(orig.shape), tuple(mask.shape)), pruned
    return (), (), None


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


class _Builder:
    """Provisional node ids with union-find; final numbering by first appearance."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.owner: list[str] = []
        self.layers: list[dict[str, Any]] = []

    def alloc(self, n: int, owner: str) -> np.ndarray:
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        self.owner.extend([owner] * n)
        return np.arange(start, start + n)

    def find(self, a: int) -> int:
        p = self.parent
        while p[a] != a:
            p[a] = p[p[a]]
            a = p[a]
        return a

    def union(self, a: np.ndarray, b: np.ndarray) -> None:
        for x, y in zip(a.tolist(), b.tolist()):
            rx, ry = self.find(x), self.find(y)
            if rx != ry:  # keep the earlier id as root: root == min of its class
                self.parent[max(rx, ry)] = min(rx, ry)

    def add_layer(self, name: str, module: nn.Module, val: _Val, kind: str) -> _Val:
        w = module.weight
        param = f"{name}.weight" if name else "weight"
        sources, shapes, effective = _reparametrized(name, module)
        if sources:
            param = sources[0]
        if kind == "conv":
            return self.add(
                name,
                param,
                kind,
                tuple(w.shape),
                module.in_channels,
                module.out_channels,
                module.groups,
                val,
                sources,
                shapes,
                effective,
            )
        return self.add(
            name,
            param,
            kind,
            tuple(w.shape),
            module.in_features,
            module.out_features,
            1,
            val,
            sources,
            shapes,
            effective,
        )

    def add(
        self,
        name: str,
        param: str,
        kind: str,
        weight_shape: tuple,
        cin: int,
        out: int,
        groups: int,
        val: _Val,
        sources: tuple = (),
        source_shapes: tuple = (),
        effective: Any = None,
    ) -> _Val:
        spatial = 1
        if val.cell.ids is None:  # the model input: its size is fixed by its first consumer
            val.cell.ids = self.alloc(cin, "input")
        ids = val.cell.ids
        if kind == "linear" and len(ids) != cin and val.flat and cin % len(ids) == 0:
            spatial, cin = cin // len(ids), len(ids)
        if len(ids) != cin:
            what = (
                f"layer {name!r} (Linear, in_features={cin})"
                if kind == "linear"
                else f"layer {name!r} (in_channels={cin})"
            )
            if val.via is not None:
                raise TopologyError(
                    f"{what} consumes a value that came through {val.via}: dtg_gpu cannot follow the "
                    "channels through that operation (unsupported; see docs/concepts.md)"
                )
            raise TopologyError(
                f"{what} expects {cin} input channels but its input carries {len(ids)}"
                + ("; in_features is not a multiple of it" if kind == "linear" else "")
            )
        self.layers.append(
            dict(
                name=name,
                param=param,
                kind=kind,
                weight_shape=tuple(weight_shape),
                out=None,
                in_=ids,
                groups=groups,
                spatial=spatial,
                sources=tuple(sources),
                source_shapes=tuple(source_shapes),
                effective=effective,
            )
        )
        out_ids = self.alloc(out, name)
        self.layers[-1]["out"] = out_ids
        return _Val(_Cell(out_ids), flat=(kind == "linear"))

    def finish(self, traced: bool, coverage: tuple = (), assumed: Sequence[str] = ()) -> ChannelTopology:
        if not self.layers:
            raise TopologyError("the model has no Conv1d/2d/3d or Linear layer: its graph is empty")
        roots = np.array([self.find(a) for a in range(len(self.parent))])
        used = np.zeros(len(self.parent), dtype=bool)
        for layer in self.layers:
            used[roots[layer["in_"]]] = True
            used[roots[layer["out"]]] = True
        # roots are the minimum of their class, so sorting roots = order of first appearance
        order = np.flatnonzero(used)
        rank = np.full(len(self.parent), -1)
        rank[order] = np.arange(len(order))
        node_of = rank[roots]
        layers = tuple(
            WeightLayer(
                name=l["name"],
                param=l["param"],
                kind=l["kind"],
                weight_shape=l["weight_shape"],
                out_nodes=torch.as_tensor(node_of[l["out"]], dtype=torch.long),
                in_nodes=torch.as_tensor(node_of[l["in_"]], dtype=torch.long),
                groups=l["groups"],
                spatial=l["spatial"],
                sources=l.get("sources", ()),
                source_shapes=l.get("source_shapes", ()),
                effective=l.get("effective"),
                batchnorm=l.get("batchnorm"),
            )
            for l in self.layers
        )
        owner = tuple(self.owner[r] for r in order)
        return ChannelTopology(
            layers=layers,
            num_nodes=len(order),
            node_owner=owner,
            traced=traced,
            coverage_rows=coverage,
            assumed_ops=tuple(assumed),
        )


# binary elementwise ops: two operands that carry channel spaces of the same width are the same
# nodes (residual addition, x * gate in squeeze-and-excitation, maximum); never operand order
_ADD = {
    operator.add,
    operator.iadd,
    operator.sub,
    operator.isub,
    torch.add,
    torch.sub,
    operator.mul,
    operator.imul,
    torch.mul,
    operator.truediv,
    operator.itruediv,
    torch.div,
    torch.maximum,
    torch.minimum,
    torch.fmax,
    torch.fmin,
}
_ADD_METHODS = {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "maximum", "minimum"}
_FLATTEN_FN = {torch.flatten}
_RESHAPE_METHODS = {"view", "reshape", "flatten"}
_NO_CHANNEL_METHODS = {"size", "dim", "numel", "type", "__len__"}
_SDPA = nn.functional.scaled_dot_product_attention
_MATMUL = {torch.matmul, operator.matmul, torch.bmm, torch.mm}
_MATMUL_METHODS = {"matmul", "bmm", "mm", "__matmul__"}
_LAYOUT_METHODS = {
    "transpose",
    "permute",
    "view",
    "reshape",
    "movedim",
    "swapaxes",
    "unflatten",
    "mT",
    "t",
    "unbind",
    "flip",
    "roll",
}
_LAYOUT_FNS = {
    torch.transpose,
    torch.permute,
    torch.reshape,
    torch.movedim,
    torch.swapaxes,
    torch.unflatten,
    torch.einsum,
    torch.unbind,
    torch.roll,
    torch.flip,
    torch.t,
}
_CARRY_ATTR = {"expand", "expand_as", "repeat", "to", "type_as", "contiguous", "float", "half", "clone"}


def _tensor_vals(args: Sequence[Any], vals: dict) -> list[_Val]:
    out = []
    for a in args:
        if isinstance(a, torch.fx.Node) and isinstance(vals.get(a), _Val):
            out.append(vals[a])
        elif isinstance(a, (list, tuple)):
            out.extend(_tensor_vals(a, vals))
    return out


def _merge(builder: _Builder, vs: list[_Val]) -> _Val | None:
    if not vs:
        return None
    if len(vs) == 1:
        return vs[0]
    a, b = vs[0], vs[1]
    if a.cell.ids is None or b.cell.ids is None:
        if a.cell.ids is None and b.cell.ids is not None:
            a.cell.ids = b.cell.ids
        elif b.cell.ids is None and a.cell.ids is not None:
            b.cell.ids = a.cell.ids
        return a
    if len(a.cell.ids) == len(b.cell.ids):
        builder.union(a.cell.ids, b.cell.ids)
        return a
    return a if len(a.cell.ids) > len(b.cell.ids) else b  # broadcast of a size-1 channel


def _is_flatten(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and node.target in _FLATTEN_FN:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        return start == 1
    if node.op == "call_method" and node.target == "flatten":
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        return start == 1
    if node.op in ("call_method", "call_function") and (
        node.target in ("view", "reshape") or node.target is torch.reshape
    ):
        shape = node.args[1:]
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return len(shape) == 2
    return False


_F = nn.functional
# ops known to keep their first operand's channels: elementwise functions, dropout, pooling,
# normalisation, padding and resizing, casts and copies
_KEEP_FNS = {
    _F.relu, _F.relu_, _F.relu6, _F.gelu, _F.silu, _F.elu, _F.selu, _F.celu, _F.leaky_relu, _F.hardswish,
    _F.hardsigmoid, _F.hardtanh, _F.mish, _F.softplus, _F.sigmoid, _F.tanh, _F.logsigmoid, _F.softsign,
    _F.dropout, _F.dropout1d, _F.dropout2d, _F.dropout3d, _F.alpha_dropout, _F.feature_alpha_dropout,
    _F.max_pool1d, _F.max_pool2d, _F.max_pool3d, _F.avg_pool1d, _F.avg_pool2d, _F.avg_pool3d,
    _F.adaptive_avg_pool1d, _F.adaptive_avg_pool2d, _F.adaptive_avg_pool3d, _F.adaptive_max_pool1d,
    _F.adaptive_max_pool2d, _F.adaptive_max_pool3d, _F.lp_pool1d, _F.lp_pool2d,
    _F.batch_norm, _F.layer_norm, _F.group_norm, _F.instance_norm, _F.local_response_norm, _F.normalize,
    _F.rms_norm, _F.pad, _F.interpolate, _F.upsample, _F.softmax, _F.log_softmax,
    torch.relu, torch.relu_, torch.sigmoid, torch.tanh, torch.exp, torch.abs, torch.neg, torch.sqrt,
    torch.rsqrt, torch.square, torch.clamp, torch.clip, torch.pow, torch.erf, torch.sin, torch.cos,
    torch.softmax, torch.dropout, torch.max_pool2d, torch.avg_pool1d, torch.layer_norm, torch.batch_norm,
    torch.nn.functional.hardshrink, torch.nn.functional.tanhshrink,
    operator.neg, operator.pos, operator.pow, operator.abs, operator.invert,
}  # fmt: skip
_KEEP_METHODS = {
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "exp_", "abs", "abs_", "neg", "neg_",
    "sqrt", "sqrt_", "rsqrt", "pow", "pow_", "square", "clamp", "clamp_", "clip", "clip_", "softmax",
    "log_softmax", "erf", "sin", "cos", "float", "half", "double", "bfloat16", "to", "type", "type_as",
    "contiguous", "clone", "detach", "requires_grad_", "masked_fill", "masked_fill_", "fill_", "zero_",
}  # fmt: skip
_COMPARE = {operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, torch.eq, torch.ne}
_META_ATTRS = {"dtype", "device", "ndim", "is_cuda", "requires_grad", "layout"}
# by name: functions of libraries not imported here (torchvision.ops, timm)
_KEEP_NAMES = {"stochastic_depth", "drop_path", "drop_block_2d", "drop_block_fast_2d"}
# reductions keep the channels when they reduce other dimensions only (`x.mean((2, 3))`)
_REDUCE = {"mean", "sum", "amax", "amin", "std", "var", "logsumexp", "nansum", "nanmean"}


def _keeps_channels(node: torch.fx.Node) -> bool:
    """`node` is an op known to keep its first operand's channels."""
    target = node.target
    if node.op == "call_method" and target in _KEEP_METHODS:
        return True
    if node.op == "call_function" and (target in _KEEP_FNS or getattr(target, "__name__", None) in _KEEP_NAMES):
        return True
    if node.op == "call_function" and target in _COMPARE:
        return True  # elementwise: a mask of the same channels
    if node.op == "call_function" and target is getattr and len(node.args) > 1 and node.args[1] in _META_ATTRS:
        return True  # x.dtype, x.device: nothing downstream consumes them as channels
    name = target if node.op == "call_method" else getattr(target, "__name__", None)
    if name in ("_assert", "_assert_async", "isinstance"):
        return True
    if name in _REDUCE and node.op in ("call_method", "call_function"):
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        return dim is not None and all(isinstance(d, int) and d not in (1, -3) for d in dims)
    return False


_CONV_FNS = {torch.conv1d, torch.conv2d, torch.conv3d, nn.functional.conv1d, nn.functional.conv2d, nn.functional.conv3d}
_LINEAR_FNS = {nn.functional.linear, torch._C._nn.linear}


def _weight_program(gm: torch.fx.GraphModule, weight: torch.fx.Node, state: dict):
    """What a conv/linear call's weight argument is made of: `(sources, program)`.

    `sources` are the state-dict entries it derives from; `program` is `None` when
    the argument is a parameter itself, else a traced `GraphModule` computing it from the
    sources (the part of the forward pass that depends on no input). `None` overall when
    the weight depends on the input (not a weight layer)."""
    seen, stack = set(), [weight]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return None
        stack.extend(n.all_input_nodes)
    if weight.op == "get_attr":
        return ((weight.target,), None) if weight.target in state else None
    graph, env = torch.fx.Graph(), {}
    sources: list[str] = []
    for n in gm.graph.nodes:
        if n not in seen:
            continue
        if n.op == "get_attr" and n.target in state:
            env[n] = graph.placeholder(f"source_{len(sources)}")
            sources.append(n.target)
        else:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[weight])
    return tuple(sources), torch.fx.GraphModule(gm, graph)


def _add_call(builder: "_Builder", gm, node: torch.fx.Node, val: "_Val", state: dict) -> "_Val | None":
    """A `F.conv*`/`F.linear` call whose weight derives from the model's parameters."""
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    if not isinstance(weight, torch.fx.Node):
        return None
    found = _weight_program(gm, weight, state)
    if found is None:
        return None
    sources, program = found
    shapes = tuple(tuple(state[k].shape) for k in sources)
    if program is None:
        shape, param = shapes[0], sources[0]
    else:
        with torch.no_grad():
            shape = tuple(program(*[state[k] for k in sources]).shape)
        param = next((k for k, sh in zip(sources, shapes) if sh == shape), f"{node.name}.weight")
    name = param.rsplit(".", 1)[0] if "." in param else node.name
    if node.target in _LINEAR_FNS:
        if len(shape) != 2:
            return None
        return builder.add(name, param, "linear", shape, shape[1], shape[0], 1, val, sources, shapes, program)
    groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
    if not isinstance(groups, int) or len(shape) < 3:
        return None
    return builder.add(name, param, "conv", shape, shape[1] * groups, shape[0], groups, val, sources, shapes, program)


class _Rows:
    """The effective weight `W[start:stop]`: one of the q, k, v blocks of a packed
    `in_proj_weight`."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        return w[self.start : self.stop]

    def __repr__(self) -> str:
        return f"rows[{self.start}:{self.stop}]"


def _attention(
    builder: "_Builder", name: str, mod: nn.MultiheadAttention, node: torch.fx.Node, vals: dict
) -> "_Pieces":
    r"""`nn.MultiheadAttention` as the method says: its in-projection (the q, k and v blocks of
    `in_proj_weight`, or `q/k/v_proj_weight`) and `out_proj`.

    The query and key projections are weight layers whose outputs feed nothing further
    ($q k^\top$ carries no channels); the attention output carries the value
    projection's nodes, head by head in order, and `out_proj` maps them to its own. The
    module's output is `(attn_output, attn_weights)`; the weights carry no channels.
    """

    def arg(i: int, key: str) -> _Val:
        a = node.args[i] if len(node.args) > i else node.kwargs.get(key)
        v = vals.get(a) if isinstance(a, torch.fx.Node) else None
        if not isinstance(v, _Val):
            raise TopologyError(f"attention {name!r}: its {key} carries no channels that dtg_gpu can follow")
        return v

    return _Pieces([_attention_of(builder, name, mod, arg(0, "query"), arg(1, "key"), arg(2, "value")), None])


def packed_qkv(builder: "_Builder", base: str, src: str, shape: tuple, inputs: Sequence["_Val"]) -> list["_Val"]:
    """The q, k and v blocks (rows `[0:d]`, `[d:2d]`, `[2d:3d]`) of a packed `[3d, d]`
    weight `src` as three weight layers `base.q`/`.k`/`.v` reading `inputs`."""
    d = shape[1]
    return [
        builder.add(
            f"{base}.{part}",
            f"{src}[{part}]",
            "linear",
            (d, d),
            d,
            d,
            1,
            v,
            (src,),
            (shape,),
            _Rows(j * d, (j + 1) * d),
        )
        for j, (part, v) in enumerate(zip("qkv", inputs))
    ]


def encoder_layers(builder: "_Builder", name: str, mod: nn.Module, x: "_Val") -> "_Val":
    """`nn.TransformerEncoder` / `nn.TransformerEncoderLayer` on the residual stream
    `x`: per layer, self-attention (`_attention_of`) and the feed-forward `linear1`
    → `linear2`, each added to the stream (the same nodes, as the method's residual
    addition); norms keep the channels. Returns the stream."""
    prefix = f"{name}." if name else ""
    layers = list(mod.layers) if isinstance(mod, nn.TransformerEncoder) else [mod]
    names = [f"{prefix}layers.{i}" for i in range(len(layers))] if isinstance(mod, nn.TransformerEncoder) else [name]
    for layer, lname in zip(layers, names):
        p = f"{lname}." if lname else ""
        attn = _attention_of(builder, f"{p}self_attn", layer.self_attn, x, x, x)
        x = _merge(builder, [x, attn])
        hidden = builder.add_layer(f"{p}linear1", layer.linear1, x, "linear")
        x = _merge(builder, [x, builder.add_layer(f"{p}linear2", layer.linear2, hidden, "linear")])
    return x


def _attention_of(
    builder: "_Builder", name: str, mod: nn.MultiheadAttention, query: "_Val", key: "_Val", value: "_Val"
) -> "_Val":
    """The layers of one `nn.MultiheadAttention` (see `_attention`); its output value."""
    prefix = f"{name}." if name else ""
    if mod.in_proj_weight is not None:
        blocks = packed_qkv(
            builder, f"{prefix}in_proj", f"{prefix}in_proj_weight", tuple(mod.in_proj_weight.shape), (query, key, value)
        )
    else:
        blocks = [
            builder.add(
                f"{prefix}{part}_proj",
                f"{prefix}{part}_proj_weight",
                "linear",
                tuple(w.shape),
                w.shape[1],
                w.shape[0],
                1,
                v,
            )
            for part, w, v in (
                ("q", mod.q_proj_weight, query),
                ("k", mod.k_proj_weight, key),
                ("v", mod.v_proj_weight, value),
            )
        ]
    return builder.add_layer(f"{prefix}out_proj", mod.out_proj, _Val(blocks[2].cell), "linear")


def _encoder(builder: "_Builder", name: str, mod: nn.Module, node: torch.fx.Node, vals: dict) -> "_Val":
    """`encoder_layers` on the module's input value."""
    a = node.args[0] if node.args else node.kwargs.get("src")
    x = vals.get(a) if isinstance(a, torch.fx.Node) else None
    if not isinstance(x, _Val):
        raise TopologyError(f"{type(mod).__name__} {name!r}: its input carries no channels that dtg_gpu can follow")
    return encoder_layers(builder, name, mod, x)


def _coverage(model: nn.Module, layers: list[dict], joined: set | frozenset = frozenset()) -> tuple:
    """One row per parameter: `(name, shape, role, reason)`; `joined`: parameters the
    forward pass adds to or concatenates with the activations (a position embedding, a class
    token)."""
    plain = {l["param"] for l in layers if l.get("effective") is None}
    computed: dict[str, list[str]] = {}
    for l in layers:
        if l.get("effective") is not None:
            for k in l["sources"]:
                computed.setdefault(k, []).append(l["name"])
    rows = []
    for name, p in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        if name in plain:
            row = ("graphed", "an edge weight of the channel graph")
        elif name in computed:
            row = (
                "graphed",
                "enters the effective weight of layer"
                + ("s " if len(computed[name]) > 1 else " ")
                + ", ".join(repr(n) for n in computed[name]),
            )
        elif name in joined and p.dim() >= 2:
            row = (
                "embedding",
                "added to or joined with the activations or the attention scores (a position "
                "embedding, a class token, a relative position bias): not an edge",
            )
        elif p.dim() <= 1 and "bias" in name.rsplit(".", 1)[-1]:
            row = ("bias", "biases are not edges")
        elif isinstance(owner, _PARAM_OK) or sum(d > 1 for d in p.shape) <= 1:
            row = ("normalisation", "per-channel scale or shift (norm, layer scale), not an edge")
        elif isinstance(owner, (nn.Embedding, nn.EmbeddingBag)):
            row = ("embedding", "a lookup table, not a channel map")
        else:
            row = ("unsupported", "a matrix that no traced conv/linear call uses as its weight")
        rows.append((name, tuple(p.shape), *row))
    return tuple(rows)


_ARITH = {
    operator.floordiv: operator.floordiv,
    operator.mul: operator.mul,
    operator.add: operator.add,
    operator.sub: operator.sub,
}


def _const(a: Any, consts: dict) -> Any:
    if isinstance(a, torch.fx.Node):
        return consts.get(a)
    return a if isinstance(a, int) and not isinstance(a, bool) else None


def _dim1(node: torch.fx.Node, pos: int) -> bool:
    dim = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", 0)
    return dim == 1


def _channel_op(node: torch.fx.Node, args: list, vals: dict, consts: dict) -> bool:
    """Channel-exact slicing, sizes and shuffles; `True` when `node` was handled.

    `chunk`/`split`/`narrow`/`x[:, a:b]` along dim 1 give each piece the matching
    slice of channel nodes; `x.size()` / `x.size(1)` / `x.shape` give the channel count
    so that shapes computed from it are known; a `view` that splits the channel dim into
    `(g, C/g)`, a `transpose` of those dims and the `view` that merges them back permute
    the channel nodes (ShuffleNet's channel shuffle). A reshape of a split channel dim that is
    not understood is an error that names it, never a silent identity.
    """
    target, op = node.target, node.op
    raw = node.args[0] if node.args else None
    src = vals.get(raw) if isinstance(raw, torch.fx.Node) else None
    # sizes and integer arithmetic on them
    if op == "call_method" and target == "size" and isinstance(src, _Val):
        if len(node.args) > 1 or "dim" in node.kwargs:
            dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
            consts[node] = len(src.cell.ids) if dim == 1 and src.cell.ids is not None and src.split is None else None
        else:
            consts[node] = _SizeOf(src)
        vals[node] = None
        return True
    if (
        op == "call_function"
        and target is getattr
        and len(node.args) > 1
        and node.args[1] == "shape"
        and isinstance(src, _Val)
    ):
        consts[node], vals[node] = _SizeOf(src), None
        return True
    if op == "call_function" and target is operator.getitem and isinstance(consts.get(raw), _SizeOf):
        v = consts[raw].val
        consts[node] = len(v.cell.ids) if node.args[1] == 1 and v.cell.ids is not None and v.split is None else None
        vals[node] = None
        return True
    if (
        op == "call_function"
        and target in _ARITH
        and any(isinstance(a, torch.fx.Node) and a in consts for a in node.args)
    ):
        xs = [_const(a, consts) for a in node.args[:2]]
        consts[node] = (
            _ARITH[target](*xs) if None not in xs and not (target is operator.floordiv and xs[1] == 0) else None
        )
        vals[node] = None
        return True
    if not isinstance(src, _Val) or src.cell.ids is None:
        return False
    ids = src.cell.ids
    # slicing along the channel dim
    if (
        src.split is None
        and (
            (op == "call_method" and target in ("chunk", "split"))
            or (op == "call_function" and target in (torch.chunk, torch.split))
        )
        and _dim1(node, 2)
    ):
        n = len(ids)
        spec = (
            node.args[1] if len(node.args) > 1 else node.kwargs.get("chunks", node.kwargs.get("split_size_or_sections"))
        )
        if target in ("chunk", torch.chunk):
            size = -(-n // spec)
            sizes = [min(size, n - i) for i in range(0, n, size)]
        elif isinstance(spec, int):
            sizes = [min(spec, n - i) for i in range(0, n, spec)]
        else:
            sizes = list(spec)
        bounds = np.cumsum([0] + sizes)
        vals[node] = _Pieces(_Val(_Cell(ids[a:b])) for a, b in zip(bounds[:-1], bounds[1:]))
        return True
    if op == "call_method" and target == "narrow" and src.split is None and node.args[1] == 1:
        start, length = _const(node.args[2], consts), _const(node.args[3], consts)
        if start is not None and length is not None:
            vals[node] = _Val(_Cell(ids[start : start + length]))
            return True
    if op == "call_function" and target is operator.getitem:
        index = node.args[1]
        if isinstance(index, tuple) and len(index) > 1 and isinstance(index[1], slice) and src.split is None:
            sl = index[1]
            if sl != slice(None):
                parts = [_const(x, consts) if x is not None else None for x in (sl.start, sl.stop, sl.step)]
                vals[node] = _Val(_Cell(ids[slice(*parts)]))
                return True
    # channel shuffle: view into (g, C/g), transpose, view back
    if (op == "call_method" and target in ("view", "reshape")) or (op == "call_function" and target is torch.reshape):
        shape = list(node.args[1:]) if op == "call_method" else list(node.args[1])
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = list(shape[0])
        dims = [_const(d, consts) for d in shape[1:]]
        if src.split is not None:
            if dims and (dims[0] == -1 or dims[0] == len(ids)):  # the split dims merged back
                vals[node] = _Val(_Cell(ids))
                return True
            raise TopologyError(
                f"{_describe(node)}: a reshape of a split channel dimension "
                "that dtg_gpu cannot follow; its channel mapping is unknown"
            )
        if (
            len(dims) >= 3
            and dims[0] is not None
            and dims[1] is not None
            and dims[0] > 1
            and dims[0] * dims[1] == len(ids)
        ):
            vals[node] = _Val(_Cell(ids), split=(dims[0], dims[1]))
            return True
        return False
    if src.split is not None and (
        (op == "call_function" and target is torch.transpose)
        or (op == "call_method" and target in ("transpose", "permute"))
    ):
        k = len(src.split)
        if target == "permute":
            perm = list(node.args[1:]) if not isinstance(node.args[1], (tuple, list)) else list(node.args[1])
            chan = [p - 1 for p in perm[1 : k + 1]]
            if perm[0] != 0 or sorted(chan) != list(range(k)):
                raise TopologyError(
                    f"{_describe(node)}: a permute that moves the channel dimension; its channel mapping is unknown"
                )
        else:
            a, b = node.args[1], node.args[2]
            if not (1 <= a <= k and 1 <= b <= k):
                raise TopologyError(
                    f"{_describe(node)}: a transpose of a split channel dimension with "
                    "a spatial one; its channel mapping is unknown"
                )
            chan = list(range(k))
            chan[a - 1], chan[b - 1] = chan[b - 1], chan[a - 1]
        grid = ids.reshape(src.split).transpose(chan)
        vals[node] = _Val(_Cell(grid.reshape(-1)), split=tuple(grid.shape))
        return True
    return False


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer; `MultiheadAttention` and `TransformerEncoder(Layer)` stay
    leaves (their forward branches on the input, so it cannot be traced) and are handled as
    units (`_attention`, `_encoder`)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, _UNITS) or super().is_leaf_module(m, qualname)


_UNITS = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _trace(model: nn.Module) -> ChannelTopology:
    gm = torch.fx.GraphModule(model, _Tracer().trace(model))
    state = dict(gm.state_dict(keep_vars=True))
    modules = dict(gm.named_modules())
    builder = _Builder()
    vals: dict[torch.fx.Node, _Val | None] = {}
    consts: dict[torch.fx.Node, Any] = {}
    first_input = True
    attr_of: dict[torch.fx.Node, str] = {}  # a parameter, maybe expanded or cast
    joined: set[str] = set()  # parameters added to / joined with activations
    assumed: list[str] = []  # ops in no table: assumed to keep the channels, named
    layer_of: dict[torch.fx.Node, int] = {}  # node → index of the weight layer it is the output of
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            vals[node] = _Val(_Cell()) if first_input else None
            first_input = False
            continue
        if node.op in ("get_attr", "output"):
            vals[node] = None
            if node.op == "get_attr" and node.target in state:
                attr_of[node] = node.target
            continue
        operands = [
            a
            for a in list(node.args) + list(node.kwargs.values())
            for a in (a if isinstance(a, (list, tuple)) else (a,))
        ]
        if node.op == "call_method" and node.target in _CARRY_ATTR and node.args and node.args[0] in attr_of:
            attr_of[node] = attr_of[node.args[0]]
        elif (node.op == "call_function" and (node.target in _ADD or node.target in (torch.cat, torch.concat))) or (
            node.op == "call_method" and node.target in _ADD_METHODS
        ):
            joined.update(attr_of[a] for a in operands if isinstance(a, torch.fx.Node) and a in attr_of)
        args = _tensor_vals(list(node.args) + list(node.kwargs.values()), vals)
        if node.op == "call_module":
            mod = modules[node.target]
            if isinstance(mod, (_CONV, nn.Linear)) and not args:
                raise TopologyError(
                    f"layer {node.target!r} is applied to a value that carries no channels (one "
                    "computed from constants?)"
                )
            if isinstance(mod, _CONV):
                vals[node] = builder.add_layer(node.target, mod, args[0], "conv")
                layer_of[node] = len(builder.layers) - 1
            elif isinstance(mod, nn.Linear):
                vals[node] = builder.add_layer(node.target, mod, args[0], "linear")
                layer_of[node] = len(builder.layers) - 1
            elif isinstance(mod, nn.modules.batchnorm._BatchNorm):
                _attach_batchnorm(builder, node, mod, layer_of)
                vals[node] = args[0] if args else None
            elif isinstance(mod, nn.MultiheadAttention):
                vals[node] = _attention(builder, node.target, mod, node, vals)
            elif isinstance(mod, (nn.TransformerEncoder, nn.TransformerEncoderLayer)):
                vals[node] = _encoder(builder, node.target, mod, node, vals)
            elif isinstance(mod, nn.Flatten):
                vals[node] = (
                    _Val(args[0].cell, flat=True) if args and mod.start_dim == 1 else (args[0] if args else None)
                )
            elif any(True for _ in mod.parameters(recurse=False)) and not isinstance(mod, _PARAM_OK):
                raise TopologyError(unknown_module_message(str(node.target), mod))
            else:
                vals[node] = args[0] if args else None
            continue
        target = node.target
        if node.op == "call_function" and (target in _CONV_FNS or target in _LINEAR_FNS) and args:
            layer = _add_call(builder, gm, node, args[0], state)
            if layer is not None:
                vals[node] = layer
                layer_of[node] = len(builder.layers) - 1
                continue
        if _channel_op(node, args, vals, consts):
            continue
        if node.op == "call_method" and target in _NO_CHANNEL_METHODS:
            vals[node] = None
        elif node.op == "call_function" and target is _SDPA:
            value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
            vals[node] = vals.get(value) if isinstance(value, torch.fx.Node) else None  # carries v's channels
        elif (node.op == "call_function" and target in _MATMUL) or (
            node.op == "call_method" and target in _MATMUL_METHODS
        ):
            # q·kᵀ (two channel-carrying operands) carries no channels (the method); scores·v carries v's
            vals[node] = args[0] if len(args) == 1 else None
        elif (node.op == "call_function" and target in _ADD) or (node.op == "call_method" and target in _ADD_METHODS):
            vals[node] = _merge(builder, args)
        elif node.op == "call_function" and target in (torch.cat, torch.concat):
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if dim == 1 and all(v.cell.ids is not None for v in args):
                vals[node] = _Val(_Cell(np.concatenate([v.cell.ids for v in args])), flat=all(v.flat for v in args))
            else:
                merged = args[0] if args else None
                for v in args[1:]:
                    merged = _merge(builder, [merged, v])
                vals[node] = merged
        elif _is_flatten(node):
            vals[node] = _Val(args[0].cell, flat=True) if args else None
        elif node.op == "call_function" and target is operator.getitem and isinstance(vals.get(node.args[0]), _Pieces):
            vals[node] = vals[node.args[0]][node.args[1]]
        elif node.op == "call_function" and target is operator.getitem:
            vals[node] = args[0] if args and node.args[1] is not None else None
        elif args and (
            (node.op == "call_method" and target in _LAYOUT_METHODS)
            or (node.op == "call_function" and target in _LAYOUT_FNS)
        ):
            a = args[0]  # assumed to keep the channels; named if a layer then finds them wrong
            vals[node] = _Val(a.cell, flat=a.flat, split=a.split, via=_describe(node))
        elif not args or _keeps_channels(node):
            vals[node] = args[0] if args else None
        else:  # in no table: assumed to keep the channels, listed, and named if a layer finds them wrong
            a = args[0]
            assumed.append(_describe(node))
            vals[node] = _Val(a.cell, flat=a.flat, split=a.split, via=a.via or _describe(node))
    return builder.finish(traced=True, coverage=_coverage(model, builder.layers, joined), assumed=assumed)


def _attach_batchnorm(builder: _Builder, node: torch.fx.Node, mod: nn.Module, layer_of: dict) -> None:
    """Record a batch norm that directly follows a weight layer (for `fold_batchnorm`):
    its input is the layer's output and nothing else reads that output."""
    src = node.args[0] if node.args else None
    if not isinstance(src, torch.fx.Node) or src not in layer_of or len(src.users) != 1:
        return
    running_var = getattr(mod, "running_var", None)
    if not (mod.track_running_stats and isinstance(running_var, torch.Tensor)):
        return  # batch statistics at inference too: nothing to fold
    layer = builder.layers[layer_of[src]]
    if layer.get("batchnorm") is not None or running_var.shape[0] != layer["out"].shape[0]:
        return
    names = [f"{node.target}.running_var"]
    shapes = [tuple(running_var.shape)]
    if mod.affine and isinstance(getattr(mod, "weight", None), torch.Tensor):
        names.append(f"{node.target}.weight")
        shapes.append(tuple(mod.weight.shape))
    layer["batchnorm"] = (str(node.target), float(mod.eps), tuple(names), tuple(shapes))


def unknown_module_message(name: str, mod: nn.Module) -> str:
    """Why a module with weights of its own is refused (docs/concepts.md, "Layers that are not
    in the graph"): embeddings and recurrent layers by what they are, others in general."""
    kind = type(mod).__name__
    if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
        return (
            f"module {name!r} ({kind}) maps token ids, not channels, to its output: a lookup table has no "
            "input channels to join, so dtg_gpu does not put it in the channel graph and refuses the model "
            "rather than guess; analyse the part after it (a model whose forward starts from the embeddings)"
        )
    if isinstance(mod, (nn.RNNBase, nn.RNNCellBase)):
        return (
            f"module {name!r} ({kind}) maps input channels and its own hidden state to gates through "
            "time: dtg_gpu has no channel map for recurrent layers and refuses the model rather than guess"
        )
    return (
        f"module {name!r} ({kind}) has parameters but is neither a Conv1d/2d/3d nor a Linear layer; "
        "its channel mapping is unknown"
    )


def _describe(node: torch.fx.Node) -> str:
    """`op 'transpose' (node transpose_1) in module 'blocks.0.mlp_tokens' (MixerBlock)`."""
    op = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    stack = node.meta.get("nn_module_stack") or {}
    where = ""
    if stack:
        path, cls = list(stack.values())[-1]
        where = f" in module {path!r} ({getattr(cls, '__name__', cls)})"
    return f"op {op!r} (node {node.name}){where}"


def _module_order(model: nn.Module) -> ChannelTopology:
    builder = _Builder()
    val = _Val(_Cell())
    for name, mod in model.named_modules():
        if isinstance(mod, _CONV):
            val = builder.add_layer(name, mod, val, "conv")
        elif isinstance(mod, nn.Linear):
            val = builder.add_layer(name, mod, _Val(val.cell, flat=True), "linear")
    return builder.finish(traced=False, coverage=_coverage(model, builder.layers))


_CACHE: dict[tuple, ChannelTopology] = {}


_PLAIN = (bool, int, float, str, type(None), torch.Size)


def _plain(value: Any) -> Any:
    """A module attribute that can decide the data flow (a flag, a size, a mode, a function
    it calls), as something hashable; `NotImplemented` for anything else (tensors, modules,
    hooks: the state dict and the module tree cover those)."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value):
        return value
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, nn.Module):
        return ("callable", getattr(value, "__module__", None), value.__qualname__)
    return NotImplemented


def _settings(mod: nn.Module) -> tuple:
    """The attributes of one module that may decide the flow. torch's own layers: their
    integer and boolean settings (`groups`, `stride`, `in_channels`), not their rates
    (dropout's `p`, batch norm's `eps`/`momentum`) or train/eval mode, which never
    change which channel feeds which; user modules: every plain attribute, `training`
    included (a forward may branch on it)."""
    builtin = type(mod).__module__.startswith("torch.nn.")
    out = []
    for k, v in vars(mod).items():
        value = _plain(v)
        if value is NotImplemented or (builtin and (k == "training" or isinstance(value, float))):
            continue
        out.append((k, value))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def _cache_key(model: nn.Module) -> tuple:
    """What decides a model's channel graph: every module's class *object* (a class redefined
    in a notebook is another key), its settings (`_settings`: constructor flags such as
    `residual=True`, a user module's `training`, sizes, the functions it calls) and every
    tensor's name and shape. Two models with one key run the same forward code on the same
    settings; runs that differ only in dropout rate share one."""
    modules = tuple((name, type(mod), _settings(mod)) for name, mod in model.named_modules())
    return modules + tuple((n, tuple(p.shape)) for n, p in model.state_dict().items())


def channel_topology(model: nn.Module, *, strict: bool = False, fallback: bool = False) -> ChannelTopology:
    r"""Derive the channel graph layout of `model` from its forward pass.

    Parameters
    ----------
    model : torch.nn.Module
        Any module whose weight layers are `Conv1d/2d/3d` and `Linear`.
    strict : bool, default False
        If `True`, weight matrices left out of the graph (an unsupported layer) raise
        instead of warning.
    fallback : bool, default False
        A model that neither torch.fx nor the shape tracer can follow (data-dependent
        control flow, untraceable code) is refused by default: its layers' connections are
        unknown. `True` chains its conv/linear layers in *registration order* instead, which
        is right only for plain chains (with a [`TracingFallbackWarning`][dtg_gpu.exceptions.TracingFallbackWarning]).

    Returns
    -------
    ChannelTopology
        `num_nodes`, and for each weight layer in forward order its output and input
        node ids. Cached per architecture: every module's class, its plain attributes (flags
        such as `residual=True`, `training`) and the tensors' shapes.

    Raises
    ------
    TopologyError
        No weight layer; a structure whose channel mapping is unknown; a model that cannot
        be traced (without `fallback`: the message names the model and the cause); with
        `strict`, uncovered weights.

    Warns
    -----
    TracingFallbackWarning
        With `fallback=True`: the model could not be traced; its layers are chained in
        registration order.

    Examples
    --------
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
    >>> topo = channel_topology(net)
    >>> topo.num_nodes, [l.spatial for l in topo.layers]
    (21, [1, 900])
    """
    key = _cache_key(model)
    if key in _CACHE and (_CACHE[key].traced or fallback):
        if not _CACHE[key].traced:
            warnings.warn(
                f"{type(model).__name__} could not be traced; its channel graph chains its layers in "
                "module registration order (fallback=True), which is only right for plain chains",
                TracingFallbackWarning,
                stacklevel=2,
            )
        _check_coverage(_CACHE[key], type(model).__name__, strict)
        return _CACHE[key]
    try:
        topo = _trace(model)
    except TopologyError as first:  # a layout only shapes can tell (tokens, heads): follow them
        from dtg_gpu._shape_trace import trace_with_shapes

        try:
            topo = trace_with_shapes(model)
        except TopologyError:
            raise first from None
    except Exception as exc:  # torch.fx raises many kinds on dynamic control flow
        from dtg_gpu._shape_trace import trace_with_shapes

        try:
            topo = trace_with_shapes(model)
        except Exception as shape_exc:  # neither tracer follows it: say why for both
            shape_cause = " ".join(f"{type(shape_exc).__name__}: {shape_exc}".split())[:300]
        else:
            _CACHE[key] = topo
            _check_coverage(topo, type(model).__name__, strict)  # its error is the answer, not a fallback
            return topo
        if not fallback:
            cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            cause += f"; following shapes: {shape_cause}" if shape_cause != cause else ""
            raise TopologyError(
                f"{type(model).__name__}: cannot be traced ({cause}), "
                "so which layers feed which is unknown; "
                "make its forward traceable by torch.fx, or, if its conv/linear layers form one chain in "
                "registration order, pass fallback=True (Run(..., fallback=True), dtg analyze --registration-order)"
            ) from None
        warnings.warn(
            f"torch.fx could not trace {type(model).__name__} ({type(exc).__name__}: {exc}); "
            "building its channel graph from module registration order instead, which is "
            "only right for plain chains",
            TracingFallbackWarning,
            stacklevel=2,
        )
        topo = _module_order(model)
    _CACHE[key] = topo
    _check_coverage(topo, type(model).__name__, strict)
    return topo


def _check_coverage(topo: ChannelTopology, model_name: str, strict: bool) -> None:
    missing = [(n, why) for n, shape, role, why in topo.coverage_rows if role == "unsupported"]
    if not missing:
        return
    what = ", ".join(n for n, _ in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    msg = (
        f"{model_name}: {len(missing)} weight matri{'x is' if len(missing) == 1 else 'ces are'} not in the "
        f"channel graph ({what}): {missing[0][1]}; see ChannelTopology.coverage()"
    )
    if strict:
        raise TopologyError(msg)
    warnings.warn(msg, UncoveredWeightsWarning, stacklevel=3)
