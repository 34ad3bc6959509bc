"""Attention in the fx pass: multi-head attention and transformer encoder layers as channel graphs (queries, keys and values joined through their projections, packed qkv weights split)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dtg_gpu.exceptions import TopologyError
from dtg_gpu.topology.builder import _Builder, _merge, _Pieces, _Val, fx_args, fx_kwargs
from dtg_gpu.topology.rules import _LINEAR_FNS


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
    weight = fx_args(node)[1] if len(fx_args(node)) > 1 else fx_kwargs(node).get("weight")
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
    groups = fx_args(node)[6] if len(fx_args(node)) > 6 else fx_kwargs(node).get("groups", 1)
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
        a = fx_args(node)[i] if len(fx_args(node)) > i else fx_kwargs(node).get(key)
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
    layers: list[Any] = list(mod.layers) if isinstance(mod, nn.TransformerEncoder) else [mod]
    names = [f"{prefix}layers.{i}" for i in range(len(layers))] if isinstance(mod, nn.TransformerEncoder) else [name]
    for layer, lname in zip(layers, names):
        p = f"{lname}." if lname else ""
        attn = _attention_of(builder, f"{p}self_attn", layer.self_attn, x, x, x)
        x = _merged(builder, [x, attn])
        hidden = builder.add_layer(f"{p}linear1", layer.linear1, x, "linear")
        x = _merged(builder, [x, builder.add_layer(f"{p}linear2", layer.linear2, hidden, "linear")])
    return x


def _merged(builder: "_Builder", vs: list["_Val"]) -> "_Val":
    """`_merge` of values that carry channels (never `None`)."""
    out = _merge(builder, vs)
    assert out is not None
    return out


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
    a = fx_args(node)[0] if fx_args(node) else fx_kwargs(node).get("src")
    x = vals.get(a) if isinstance(a, torch.fx.Node) else None
    if not isinstance(x, _Val):
        raise TopologyError(f"{type(mod).__name__} {name!r}: its input carries no channels that dtg_gpu can follow")
    return encoder_layers(builder, name, mod, x)
