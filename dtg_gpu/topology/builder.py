"""Building a channel graph while a tracer walks a model: provisional node ids joined with union-find, the values that flow between ops, parametrised weights, and which parameters the graph covers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from dtg_gpu.exceptions import TopologyError
from dtg_gpu.topology.types import _PARAM_OK, ChannelTopology, WeightLayer


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

        return (f"{prefix}weight_orig", f"{prefix}weight_mask"), (_shape(orig), _shape(mask)), pruned
    return (), (), None


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

    def add_layer(self, name: str, module: Any, val: _Val, kind: str) -> _Val:
        """A `Conv*d` (`kind=\"conv\"`) or `Linear` module applied to `val`."""
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


def fx_args(node: torch.fx.Node) -> tuple[Any, ...]:
    """`node.args`, typed for the rules: torch.fx types an argument as the union of
    everything an argument can be; the rules check what they read at run time."""
    return cast(tuple[Any, ...], node.args)  # no copy: the tracers call this for every argument


def fx_kwargs(node: torch.fx.Node) -> dict[str, Any]:
    """`node.kwargs`, typed as `fx_args`."""
    return cast(dict[str, Any], node.kwargs)


def known_ids(val: _Val) -> np.ndarray:
    """The channel node ids of a value known to carry them."""
    ids = val.cell.ids
    assert ids is not None, "a rule read the ids of a value that carries none"
    return ids


def _shape(t: Any) -> tuple[int, ...]:
    """A tensor attribute's shape (a module's attributes are typed as tensors or modules)."""
    return tuple(t.shape)
