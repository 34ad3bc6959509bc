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
from dtg_gpu.topology.builder import _Builder, _Cell, _coverage, _merge, _Pieces, _tensor_vals, _Val
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


def _module_order(model: nn.Module) -> ChannelTopology:
    builder = _Builder()
    val = _Val(_Cell())
    for name, mod in model.named_modules():
        if isinstance(mod, _CONV):
            val = builder.add_layer(name, mod, val, "conv")
        elif isinstance(mod, nn.Linear):
            val = builder.add_layer(name, mod, _Val(val.cell, flat=True), "linear")
    return builder.finish(traced=False, coverage=_coverage(model, builder.layers))
