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
from typing import Any

import numpy as np
import torch
from torch import nn

from dtg_gpu.exceptions import TopologyError
from dtg_gpu.topology.attention import _add_call, _attention, _encoder
from dtg_gpu.topology.builder import _Builder, _Cell, _coverage, _merge, _Pieces, _tensor_vals, _Val, fx_args, fx_kwargs
from dtg_gpu.topology.rules import (
    _ADD,
    _ADD_METHODS,
    _CARRY_ATTR,
    _CONV_FNS,
    _LAYOUT_FNS,
    _LAYOUT_METHODS,
    _LINEAR_FNS,
    _MATMUL,
    _MATMUL_METHODS,
    _NO_CHANNEL_METHODS,
    _SDPA,
    _channel_op,
    _describe,
    _is_flatten,
    _keeps_channels,
)
from dtg_gpu.topology.types import _CONV, _PARAM_OK, ChannelTopology

__all__ = ["unknown_module_message"]


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer; `MultiheadAttention` and `TransformerEncoder(Layer)` stay
    leaves (their forward branches on the input, so it cannot be traced) and are handled as
    units (`_attention`, `_encoder`)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, _UNITS) or super().is_leaf_module(m, qualname)


_UNITS = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _trace(model: nn.Module) -> ChannelTopology:
    """The channel topology of `model` read from its `torch.fx` graph."""
    return _FxPass(model).run()


def _operands(node: torch.fx.Node) -> list:
    return [
        a
        for a in list(fx_args(node)) + list(fx_kwargs(node).values())
        for a in (a if isinstance(a, (list, tuple)) else (a,))
    ]


class _FxPass:
    """One walk over a traced model's nodes, moving channel ids along with the rules."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.gm = torch.fx.GraphModule(model, _Tracer().trace(model))
        self.state = dict(self.gm.state_dict(keep_vars=True))
        self.modules = dict(self.gm.named_modules())
        self.builder = _Builder()
        self.vals: dict[torch.fx.Node, _Val | None] = {}
        self.consts: dict[torch.fx.Node, Any] = {}
        self.attr_of: dict[torch.fx.Node, str] = {}  # a parameter, maybe expanded or cast
        self.joined: set[str] = set()  # parameters added to / joined with activations
        self.assumed: list[str] = []  # ops in no table: assumed to keep the channels, named
        self.layer_of: dict[torch.fx.Node, int] = {}  # node → index of the weight layer it is the output of

    def run(self) -> ChannelTopology:
        first_input = True
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.vals[node] = _Val(_Cell()) if first_input else None
                first_input = False
            elif node.op in ("get_attr", "output"):
                self.vals[node] = None
                if node.op == "get_attr" and node.target in self.state:
                    self.attr_of[node] = node.target
            else:
                self._track_parameters(node)
                args = _tensor_vals(list(fx_args(node)) + list(fx_kwargs(node).values()), self.vals)
                if node.op == "call_module":
                    self.vals[node] = self._module(node, self.modules[node.target], args)
                else:
                    self._call(node, args)
        coverage = _coverage(self.model, self.builder.layers, self.joined)
        return self.builder.finish(traced=True, coverage=coverage, assumed=self.assumed)

    def _track_parameters(self, node: torch.fx.Node) -> None:
        """Parameters carried through casts, and those joined with activations (coverage)."""
        if (
            node.op == "call_method"
            and node.target in _CARRY_ATTR
            and fx_args(node)
            and fx_args(node)[0] in self.attr_of
        ):
            self.attr_of[node] = self.attr_of[fx_args(node)[0]]
        elif _is_join(node):
            self.joined.update(
                self.attr_of[a] for a in _operands(node) if isinstance(a, torch.fx.Node) and a in self.attr_of
            )

    def _layer(self, node: torch.fx.Node, val: _Val) -> _Val:
        self.layer_of[node] = len(self.builder.layers) - 1
        return val

    def _module(self, node: torch.fx.Node, mod: nn.Module, args: list[_Val]) -> _Val | None:
        """The value a module call gives (`MODULE_RULES`, else its first input)."""
        if isinstance(mod, (_CONV, nn.Linear)) and not args:
            raise TopologyError(
                f"layer {node.target!r} is applied to a value that carries no channels (one computed from constants?)"
            )
        for kinds, rule in MODULE_RULES:
            if isinstance(mod, kinds):
                return rule(self, node, mod, args)
        if any(True for _ in mod.parameters(recurse=False)) and not isinstance(mod, _PARAM_OK):
            raise TopologyError(unknown_module_message(str(node.target), mod))
        return args[0] if args else None

    def _call(self, node: torch.fx.Node, args: list[_Val]) -> None:
        """A function or method call: a functional layer, a channel op, else the value rules."""
        if node.op == "call_function" and (node.target in _CONV_FNS or node.target in _LINEAR_FNS) and args:
            layer = _add_call(self.builder, self.gm, node, args[0], self.state)
            if layer is not None:
                self.vals[node] = self._layer(node, layer)
                return
        if _channel_op(node, args, self.vals, self.consts):
            return
        self.vals[node] = self._value(node, args)

    def _value(self, node: torch.fx.Node, args: list[_Val]) -> _Val | None:
        """What a call that is no layer and no channel op carries."""
        op, target = node.op, node.target
        if op == "call_method" and target in _NO_CHANNEL_METHODS:
            return None
        if op == "call_function" and target is _SDPA:
            value = fx_args(node)[2] if len(fx_args(node)) > 2 else fx_kwargs(node).get("value")
            return self.vals.get(value) if isinstance(value, torch.fx.Node) else None  # carries v's channels
        if (op == "call_function" and target in _MATMUL) or (op == "call_method" and target in _MATMUL_METHODS):
            # q·kᵀ (two channel-carrying operands) carries no channels (the method); scores·v carries v's
            return args[0] if len(args) == 1 else None
        if (op == "call_function" and target in _ADD) or (op == "call_method" and target in _ADD_METHODS):
            return _merge(self.builder, args)
        if op == "call_function" and target in (torch.cat, torch.concat):
            return self._cat(node, args)
        if _is_flatten(node):
            return _Val(args[0].cell, flat=True) if args else None
        if op == "call_function" and target is operator.getitem:
            pieces = self.vals.get(fx_args(node)[0])
            if isinstance(pieces, _Pieces):
                return pieces[fx_args(node)[1]]
            return args[0] if args and fx_args(node)[1] is not None else None
        return self._kept(node, args)

    def _cat(self, node: torch.fx.Node, args: list[_Val]) -> _Val | None:
        """`torch.cat` along the channels concatenates their ids; along another dim merges them."""
        dim = fx_args(node)[1] if len(fx_args(node)) > 1 else fx_kwargs(node).get("dim", 0)
        if dim == 1 and all(v.cell.ids is not None for v in args):
            return _Val(_Cell(np.concatenate([v.cell.ids for v in args])), flat=all(v.flat for v in args))
        merged: Any = args[0] if args else None
        for v in args[1:]:
            merged = _merge(self.builder, [merged, v])
        return merged

    def _kept(self, node: torch.fx.Node, args: list[_Val]) -> _Val | None:
        """Layout ops and ops in no table keep their first input's channels (and are named)."""
        op, target = node.op, node.target
        if args and (
            (op == "call_method" and target in _LAYOUT_METHODS) or (op == "call_function" and target in _LAYOUT_FNS)
        ):
            a = args[0]  # assumed to keep the channels; named if a layer then finds them wrong
            return _Val(a.cell, flat=a.flat, split=a.split, via=_describe(node))
        if not args or _keeps_channels(node):
            return args[0] if args else None
        a = args[0]  # in no table: assumed to keep the channels, listed, and named if a layer finds them wrong
        self.assumed.append(_describe(node))
        return _Val(a.cell, flat=a.flat, split=a.split, via=a.via or _describe(node))


def _is_join(node: torch.fx.Node) -> bool:
    """A sum or concatenation: parameters among its operands are joined with activations."""
    if node.op == "call_function":
        return node.target in _ADD or node.target in (torch.cat, torch.concat)
    return node.op == "call_method" and node.target in _ADD_METHODS


def _batchnorm_module(p: _FxPass, node: torch.fx.Node, mod: nn.Module, args: list[_Val]) -> _Val | None:
    _attach_batchnorm(p.builder, node, mod, p.layer_of)
    return args[0] if args else None


def _flatten_module(p: _FxPass, node: torch.fx.Node, mod: nn.Module, args: list[_Val]) -> _Val | None:
    return _Val(args[0].cell, flat=True) if args and mod.start_dim == 1 else (args[0] if args else None)


#: module type(s) -> the value a call of such a module gives; first match wins
MODULE_RULES: tuple[tuple[Any, Any], ...] = (
    (_CONV, lambda p, node, mod, args: p._layer(node, p.builder.add_layer(node.target, mod, args[0], "conv"))),
    (nn.Linear, lambda p, node, mod, args: p._layer(node, p.builder.add_layer(node.target, mod, args[0], "linear"))),
    (nn.modules.batchnorm._BatchNorm, _batchnorm_module),
    (nn.MultiheadAttention, lambda p, node, mod, args: _attention(p.builder, node.target, mod, node, p.vals)),
    (
        (nn.TransformerEncoder, nn.TransformerEncoderLayer),
        lambda p, node, mod, args: _encoder(p.builder, node.target, mod, node, p.vals),
    ),
    (nn.Flatten, _flatten_module),
)


def _attach_batchnorm(builder: _Builder, node: torch.fx.Node, mod: Any, layer_of: dict) -> None:
    """Record a batch norm that directly follows a weight layer (for `fold_batchnorm`):
    its input is the layer's output and nothing else reads that output."""
    src = fx_args(node)[0] if fx_args(node) else None
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


def _module_order(model: nn.Module) -> ChannelTopology:
    builder = _Builder()
    val = _Val(_Cell())
    for name, mod in model.named_modules():
        if isinstance(mod, _CONV):
            val = builder.add_layer(name, mod, val, "conv")
        elif isinstance(mod, nn.Linear):
            val = builder.add_layer(name, mod, _Val(val.cell, flat=True), "linear")
    return builder.finish(traced=False, coverage=_coverage(model, builder.layers))
