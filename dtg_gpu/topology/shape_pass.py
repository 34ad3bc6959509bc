r"""The channel graph of a model whose layout only shapes can tell (transformers).

[`channel_topology`][dtg_gpu.channel_topology] first follows channels symbolically, with the
channel dimension at position 1. Tensors laid out `[batch, tokens, channels]` and reshaped
into attention heads (timm's ViT, Swin, MaxViT, MLP-Mixer) defeat that; for them this module
runs the traced forward pass once on an example input (on the `meta` device when the model
lives there: no compute, no memory) and carries beside every value an integer tensor of its
shape holding, per element, the channel node it belongs to (`-1`: none). Layout operations
(reshape, permute, transpose, slicing, `unbind`, `cat`, `roll`, padding, ...) are applied
to that id tensor as they are to the value, so channels are followed exactly through any
rearrangement; the method's rules do the rest:

- a conv/linear call is a weight layer; its input features must each carry one node (a
  flatten of `C × S` positions in either order is the method's `[out, C, S]` view; the
  columns of `W` are permuted to it), or all carry the same nodes: a linear on the token
  dimension (MLP-Mixer token mixing), listed in the coverage and not graphed;
- elementwise ops between operands whose channels correspond one to one merge them (residual
  addition, gates); a broadcast operand with fewer channels leaves the other as it is;
- a product of two channel-carrying values (`q·kᵀ`) carries none; `scores·v` and
  `scaled_dot_product_attention` carry `v`'s;
- any other op keeps the channels along dimensions it does not resize, and an op that
  resizes a dimension along which channels vary is an error that names it.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from torch import nn

from dtg_gpu.exceptions import TopologyError
from dtg_gpu.topology.attention import _attention_of, encoder_layers, packed_qkv
from dtg_gpu.topology.builder import _Builder, _Cell, _coverage, _Val, known_ids
from dtg_gpu.topology.fx_pass import _Tracer
from dtg_gpu.topology.rules import (
    _ADD,
    _ADD_METHODS,
    _CONV_FNS,
    _LINEAR_FNS,
    _MATMUL,
    _MATMUL_METHODS,
    _SDPA,
    _describe,
)
from dtg_gpu.topology.shape_rules import (
    _LAYOUT_FNS,
    _LAYOUT_METHODS,
    _PACKED_ATTENTION,
    _REDUCE,
    _broadcast,
    _example_inputs,
    _has,
    _none,
    _per_feature,
)
from dtg_gpu.topology.types import _CONV, _PARAM_OK, ChannelTopology

__all__ = ["trace_with_shapes"]


class _IdInterpreter(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, builder: _Builder, state: dict):
        super().__init__(gm)
        self.builder, self.state = builder, state
        self.ids: dict[torch.fx.Node, Any] = {}
        self.attr_of: dict[torch.fx.Node, str] = {}
        self.joined: set[str] = set()
        self.mixing: dict[str, str] = {}
        self.constant: set[str] = set()  # layers applied to constants (a position-bias MLP)
        self.live: set[torch.fx.Node] = set()  # values that depend on the model's input
        self.modules = dict(gm.named_modules())

    # -------------------------------------------------------------- helpers
    def _arg_ids(self, a):
        if isinstance(a, torch.fx.Node):
            return self.ids.get(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg_ids(x) for x in a)
        return None

    def _with_ids(self, a):
        """`a` with every tensor replaced by its id tensor (for layout ops)."""
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            i = self.ids.get(a)
            if isinstance(v, torch.Tensor):
                return i if isinstance(i, torch.Tensor) else _none(v.shape)
            if isinstance(v, (list, tuple)) and isinstance(i, (list, tuple)):
                return type(v)(
                    x if isinstance(x, torch.Tensor) else (_none(y.shape) if isinstance(y, torch.Tensor) else y)
                    for x, y in zip(i, v)
                )
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self._with_ids(x) for x in a)
        if isinstance(a, dict):
            return {k: self._with_ids(v) for k, v in a.items()}
        return a

    def _canonical(self, ids: torch.Tensor) -> torch.Tensor:
        """Ids replaced by their union-find representatives (merged nodes compare equal)."""
        u, inv = torch.unique(ids, return_inverse=True)
        roots = torch.as_tensor([self.builder.find(int(i)) if i >= 0 else -1 for i in u.tolist()], dtype=torch.long)
        return roots[inv]

    def _input_val(self, n: torch.fx.Node, ids: torch.Tensor, dim: int, layer: str) -> tuple[_Val | None, Any]:
        """The channel nodes a layer reads along `dim`: `(value, permutation)`, or
        `(None, None)` for a linear on the token dimension."""
        feats = _per_feature(self._canonical(ids), dim)
        sizes = np.array([len(f) for f in feats])
        if (sizes > 1).any():
            if dim % ids.dim() == ids.dim() - 1 and all(np.array_equal(f, feats[0]) for f in feats):
                return None, None  # every feature carries the same channels: token mixing
            raise TopologyError(
                f"layer {layer!r}: its input features mix channels in a way dtg_gpu cannot "
                f"map to nodes (after {_describe(n)})"
            )
        nodes = np.array([f[0] if len(f) else -1 for f in feats])
        if (nodes < 0).any():
            nodes[nodes < 0] = self.builder.alloc(int((nodes < 0).sum()), "input")
        if len(np.unique(nodes)) == len(nodes):
            return _Val(_Cell(nodes)), None
        _, first, counts = np.unique(nodes, return_index=True, return_counts=True)
        if len(set(counts.tolist())) != 1:
            raise TopologyError(
                f"layer {layer!r}: its input features repeat channels unevenly; dtg_gpu cannot "
                "view its weight as [out, C, S]"
            )
        channels = nodes[np.sort(first)]
        perm = np.concatenate([np.flatnonzero(nodes == c) for c in channels])
        val = _Val(_Cell(channels), flat=True)
        return val, (None if np.array_equal(perm, np.arange(len(nodes))) else perm)

    def _merge(self, a: torch.Tensor, b: torch.Tensor, shape) -> torch.Tensor:
        A, B = self._canonical(a.expand(shape)), self._canonical(b.expand(shape))
        if not _has(A):
            return B.clone()
        if not _has(B):
            return A.clone()
        both = (A >= 0) & (B >= 0)
        pairs = torch.unique(torch.stack([A[both], B[both]], 1), dim=0)
        if len(pairs) == len(torch.unique(A[A >= 0])) == len(torch.unique(B[B >= 0])):
            self.builder.union(pairs[:, 0].numpy(), pairs[:, 1].numpy())
            return torch.where(A >= 0, A, B)
        # a broadcast operand with fewer channels (a one-channel map): the other keeps its own
        return (A if len(torch.unique(A[A >= 0])) >= len(torch.unique(B[B >= 0])) else B).clone()

    def _keep(self, n: torch.fx.Node, src: torch.Tensor, shape) -> torch.Tensor:
        """Channels kept along the dimensions the op does not resize."""
        shape = tuple(shape)
        if tuple(src.shape) == shape:
            return src
        if not _has(src):
            return _none(shape)
        dims = None
        if (
            n.op == "call_method"
            and n.target in _REDUCE
            or (n.op == "call_function" and getattr(n.target, "__name__", "") in _REDUCE)
        ):
            d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            if d is not None:
                dims = [x % src.dim() for x in (d if isinstance(d, (list, tuple)) else (d,))]
        if dims is not None:
            out = src
            for d in sorted(dims, reverse=True):
                if not bool((out == out.narrow(d, 0, 1)).all()):
                    return _none(shape)  # a reduction over the channels: no channels left
                out = out.narrow(d, 0, 1)
            return out.reshape(shape) if out.numel() == int(np.prod(shape)) else out.expand(shape)
        if src.dim() != len(shape):
            raise TopologyError(
                f"{_describe(n)}: changes the rank of a value that carries channels in a way "
                "dtg_gpu cannot follow; its channel mapping is unknown"
            )
        out = src
        for d, (a, b) in enumerate(zip(src.shape, shape)):
            if a != b:
                if not bool((out == out.narrow(d, 0, 1)).all()):
                    raise TopologyError(
                        f"{_describe(n)}: resizes a dimension along which the channels vary; "
                        "its channel mapping is unknown"
                    )
                out = out.narrow(d, 0, 1)
        return out.expand(shape)

    def _layer(self, n: torch.fx.Node, result, name: str, kind: str, module=None) -> torch.Tensor:
        x = n.args[0] if n.args else n.kwargs.get("input")
        if x not in self.live:  # computes from constants only (Swin-V2's position-bias MLP): no channels
            if module is not None:
                self.constant.update(k for k, _ in module.named_parameters(prefix=name))
            return _none(result.shape)
        ids = self._with_ids(x)
        dim = 1 if kind == "conv" else -1
        val, perm = self._input_val(n, ids, dim, name)
        if val is None:  # a linear on the token dimension: channels pass through
            w = module.weight if module is not None else None
            self.mixing[f"{name}.weight" if w is not None else name] = name
            return self._keep(n, ids.narrow(-1, 0, 1), result.shape)
        if module is not None:
            if perm is not None:
                return self._permuted_linear(name, module, val, perm, result)
            out = self.builder.add_layer(name, module, val, kind)
        else:
            from dtg_gpu.topology.attention import _add_call

            added = _add_call(self.builder, self.module, n, val, self.state)
            if added is None:
                return self._keep(n, ids, result.shape)
            out = added
        return _broadcast(known_ids(out), result.shape, 1 if kind == "conv" else -1)

    def _permuted_linear(self, name: str, mod: nn.Linear, val: _Val, perm: np.ndarray, result) -> torch.Tensor:
        prefix = f"{name}." if name else ""
        src = f"{prefix}weight"
        cols = torch.as_tensor(perm, dtype=torch.long)
        out = self.builder.add(
            name,
            f"{src}[columns]",
            "linear",
            tuple(mod.weight.shape),
            mod.in_features,
            mod.out_features,
            1,
            val,
            (src,),
            (tuple(mod.weight.shape),),
            _Columns(cols),
        )
        return _broadcast(known_ids(out), result.shape, -1)

    # ------------------------------------------------------------------ nodes
    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        try:
            self.ids[n] = self._ids_of(n, result)
        except TopologyError:
            raise
        except Exception as exc:  # an op our rules do not know how to apply to ids
            raise TopologyError(
                f"{_describe(n)}: dtg_gpu cannot follow the channels through it ({type(exc).__name__}: {exc})"
            ) from None
        return result

    def _ids_of(self, n: torch.fx.Node, result):
        if n.op == "placeholder":
            self.live.add(n)
            return _none(result.shape) if isinstance(result, torch.Tensor) else None
        if n.op == "output":
            return None
        if n.op == "get_attr":
            if n.target in self.state:
                self.attr_of[n] = str(n.target)
            return _none(result.shape) if isinstance(result, torch.Tensor) else None
        operands = [
            a
            for a in itertools.chain(n.args, n.kwargs.values())
            for a in (a if isinstance(a, (list, tuple)) else (a,))
            if isinstance(a, torch.fx.Node)
        ]
        attrs = [self.attr_of[a] for a in operands if a in self.attr_of]
        if any(a in self.live for a in operands):
            self.live.add(n)
            self.joined.update(attrs)  # a parameter meets the activations (weights of layers stay graphed)
        elif attrs:
            self.attr_of[n] = attrs[0]  # a parameter, indexed, reshaped or computed on without any input
        target: Any = n.target  # a str (module, method) or a callable (function)
        if n.op == "call_module":
            return self._module_ids(n, self.modules[target], result)
        if n.op == "call_function" and target in _PACKED_ATTENTION:
            return self._packed_attention(n, result)
        if n.op == "call_function" and (target in _CONV_FNS or target in _LINEAR_FNS):
            return self._layer(n, result, n.name, "conv" if target in _CONV_FNS else "linear")
        if (n.op == "call_function" and target in _ADD) or (n.op == "call_method" and target in _ADD_METHODS):
            return self._sum_ids(n, operands, result)
        if n.op == "call_function" and target is _SDPA:
            v = n.args[2] if len(n.args) > 2 else n.kwargs.get("value")
            return self._keep(n, self._with_ids(v), result.shape)
        if (n.op == "call_function" and (target in _MATMUL or target is torch.einsum)) or (
            n.op == "call_method" and target in _MATMUL_METHODS
        ):
            return self._product_ids(n, operands, result)
        if n.op == "call_function" and target in (torch.cat, torch.concat, torch.stack):
            self.joined.update(self.attr_of[a] for a in operands if a in self.attr_of)
        if (n.op == "call_method" and target in _LAYOUT_METHODS) or (n.op == "call_function" and target in _LAYOUT_FNS):
            args, kwargs = self._with_ids(list(n.args)), self._with_ids(dict(n.kwargs))
            if n.op == "call_method":
                return getattr(args[0], target)(*args[1:], **kwargs)
            return target(*args, **kwargs)
        if n.op == "call_function" and target is nn.functional.pad:
            args = self._with_ids(list(n.args))
            return nn.functional.pad(args[0], *args[1:2], mode="constant", value=-1)
        return self._generic(n, result)

    def _module_ids(self, n: torch.fx.Node, mod: Any, result):
        """A module call: a weight layer, attention, a parametrised module dtg_gpu does not
        know (an error), a pure rearrangement, or the generic rule."""
        for kinds, rule in _MODULE_RULES:
            if isinstance(mod, kinds):
                return rule(self, n, mod, result)
        if any(True for _ in mod.parameters(recurse=False)) and not isinstance(mod, _PARAM_OK):
            from dtg_gpu.topology.fx_pass import unknown_module_message

            raise TopologyError(unknown_module_message(str(n.target), mod))
        if isinstance(mod, (nn.Flatten, nn.Unflatten, nn.ChannelShuffle, nn.PixelShuffle, nn.PixelUnshuffle)):
            return mod(self._with_ids(n.args[0]))
        return self._generic(n, result)

    def _sum_ids(self, n: torch.fx.Node, operands: list, result):
        """`a + b` and the like: the channel ids of both operands merged (a parameter joined)."""
        self.joined.update(self.attr_of[a] for a in operands if a in self.attr_of)
        a, b = (self._with_ids(x) for x in (list(n.args) + [None])[:2])
        if not isinstance(b, torch.Tensor):
            return self._keep(n, a, result.shape) if isinstance(a, torch.Tensor) else None
        if not isinstance(a, torch.Tensor):
            return self._keep(n, b, result.shape)
        return self._merge(a, b, result.shape)

    def _product_ids(self, n: torch.fx.Node, operands: list, result):
        """A matrix product carries the channels of its one channel-carrying operand."""
        tensors = [self._with_ids(a) for a in operands if isinstance(self.env[a], torch.Tensor)]
        carrying = [t for t in tensors if _has(t)]
        if len(carrying) != 1:
            return _none(result.shape)  # q·kᵀ carries no channels (the method)
        return self._keep(n, carrying[0], result.shape)

    def _rearranged(self, n: torch.fx.Node, src: torch.Tensor, result: torch.Tensor) -> torch.Tensor | None:
        """The op applied to the ids, when it only moves, copies or pads elements.

        The op runs on two encodings of the ids (`id + 1` and a random relabelling, `0`
        for no channel); it is a rearrangement when both give whole numbers that decode to
        the same ids, which an op that computes with the values (a mean over channels, a
        norm) fails."""
        tensors = [
            a
            for a in itertools.chain(n.args, n.kwargs.values())
            if isinstance(a, torch.fx.Node) and isinstance(self.env.get(a), torch.Tensor)
        ]
        if len(tensors) != 1 or n.op == "call_module" and any(True for _ in self.modules[n.target].parameters()):
            return None
        u = torch.unique(src[src >= 0])
        g = torch.Generator().manual_seed(len(u))
        relabel = torch.randperm(len(u) + 7, generator=g)[: len(u)].double() + 1
        lookup = torch.zeros(int(u.max()) + 2 if len(u) else 1, dtype=torch.double)
        lookup[u + 1] = relabel
        enc = [(src + 1).double(), lookup[src + 1]]
        outs = []
        for e in enc:  # on the CPU, whatever device the model is on (one tensor argument, no weights)

            def swap(a, e=e):
                return e if a is tensors[0] else self.env[a]

            args = torch.fx.node.map_aggregate(n.args, lambda a: swap(a) if isinstance(a, torch.fx.Node) else a)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, lambda a: swap(a) if isinstance(a, torch.fx.Node) else a)
            try:
                if n.op == "call_module":
                    r = self.modules[n.target](*args, **kwargs)
                elif n.op == "call_method":
                    r = getattr(args[0], str(n.target))(*args[1:], **kwargs)
                else:
                    r = n.target(*args, **kwargs)  # type: ignore[operator]  # call_function: a callable
            except Exception:
                return None
            if not isinstance(r, torch.Tensor) or tuple(r.shape) != tuple(result.shape):
                return None
            outs.append(r.cpu().double())
        one, two = outs
        if not (bool((one == one.round()).all()) and bool((two == two.round()).all())):
            return None
        decoded = one.long() - 1
        if bool(((decoded < -1) | (decoded > (int(u.max()) if len(u) else -1))).any()):
            return None
        known = torch.isin(decoded, torch.cat([u, torch.tensor([-1])]))
        if not bool(known.all()) or not torch.equal(lookup[decoded + 1], two):
            return None
        return decoded

    def _generic(self, n: torch.fx.Node, result):
        src = next(
            (
                self._with_ids(a)
                for a in itertools.chain(n.args, n.kwargs.values())
                if isinstance(a, torch.fx.Node) and isinstance(self.env.get(a), torch.Tensor)
            ),
            None,
        )
        if (
            isinstance(result, torch.Tensor)
            and isinstance(src, torch.Tensor)
            and _has(src)
            and tuple(result.shape) != tuple(src.shape)
        ):
            moved = self._rearranged(n, src, result)
            if moved is not None:
                return moved
        if isinstance(result, torch.Tensor):
            return self._keep(n, src, result.shape) if isinstance(src, torch.Tensor) else _none(result.shape)
        if isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result):
            return tuple(
                self._keep(n, src, r.shape) if isinstance(r, torch.Tensor) and isinstance(src, torch.Tensor) else None
                for r in result
            )
        return None

    def _attention(self, n: torch.fx.Node, mod: nn.MultiheadAttention, result):
        def arg(i: int, key: str) -> _Val:
            a = n.args[i] if len(n.args) > i else n.kwargs.get(key)
            val, _ = self._input_val(n, self._with_ids(a), -1, f"{n.target}.{key}")
            if val is None or val.flat:
                raise TopologyError(f"attention {n.target!r}: its {key} does not carry one channel per feature")
            return val

        out = _attention_of(self.builder, str(n.target), mod, arg(0, "query"), arg(1, "key"), arg(2, "value"))
        return (_broadcast(known_ids(out), result[0].shape, -1), None)

    def _packed_attention(self, n: torch.fx.Node, result) -> torch.Tensor:
        """A wrapped attention function on a packed `qkv` weight and a `proj` weight
        (torchvision's `shifted_window_attention`): its q, k, v blocks and `proj`, as
        `nn.MultiheadAttention`."""
        sig = _PACKED_ATTENTION[n.target]
        bound = sig.bind(*n.args, **n.kwargs).arguments
        names = []
        for key in ("qkv_weight", "proj_weight"):
            a = bound.get(key)
            if not (isinstance(a, torch.fx.Node) and a in self.attr_of):
                raise TopologyError(f"{_describe(n)}: its {key} is not a parameter of the model")
            names.append(self.attr_of[a])
        qkv, proj = names
        val, _ = self._input_val(n, self._with_ids(bound["input"]), -1, qkv)
        if val is None or val.flat:
            raise TopologyError(f"{_describe(n)}: its input does not carry one channel per feature")
        w_qkv, w_proj = self.state[qkv], self.state[proj]
        base = qkv[: -len(".weight")] if qkv.endswith(".weight") else qkv
        blocks = packed_qkv(self.builder, base, qkv, tuple(w_qkv.shape), (val, val, val))
        pname = proj[: -len(".weight")] if proj.endswith(".weight") else proj
        out = self.builder.add(
            pname, proj, "linear", tuple(w_proj.shape), w_proj.shape[1], w_proj.shape[0], 1, _Val(blocks[2].cell)
        )
        return _broadcast(known_ids(out), result.shape, -1)

    def _encoder(self, n: torch.fx.Node, mod: nn.Module, result):
        a = n.args[0] if n.args else n.kwargs.get("src")
        x, _ = self._input_val(n, self._with_ids(a), -1, str(n.target))
        if x is None or x.flat:
            raise TopologyError(f"{type(mod).__name__} {n.target!r}: its input does not carry one channel per feature")
        return _broadcast(known_ids(encoder_layers(self.builder, str(n.target), mod, x)), result.shape, -1)


#: module type(s) -> the ids a call of such a module gives; first match wins
_MODULE_RULES: tuple[tuple[Any, Any], ...] = (
    (_CONV, lambda p, n, mod, result: p._layer(n, result, n.target, "conv", mod)),
    (nn.Linear, lambda p, n, mod, result: p._layer(n, result, n.target, "linear", mod)),
    (nn.MultiheadAttention, lambda p, n, mod, result: p._attention(n, mod, result)),
    ((nn.TransformerEncoder, nn.TransformerEncoderLayer), lambda p, n, mod, result: p._encoder(n, mod, result)),
)


class _Columns:
    """The effective weight `W[:, perm]`: a linear's columns in the method's `[out, C, S]` order."""

    def __init__(self, perm: torch.Tensor):
        self.perm = perm

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        return w[:, self.perm.to(w.device)]

    def __repr__(self) -> str:
        return f"columns[{len(self.perm)}]"


def trace_with_shapes(model: nn.Module) -> ChannelTopology:
    """The channel graph of `model` from one forward pass on an example input (see the
    module's description).

    Raises
    ------
    TopologyError
        No example input runs the model, or an operation whose channel mapping is unknown
        (named with its module).
    """
    gm = torch.fx.GraphModule(model, _Tracer().trace(model))
    state = dict(gm.state_dict(keep_vars=True))
    device = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(0)).device
    modes = {m: m.training for m in gm.modules()}
    gm.eval()
    last: Exception | None = None
    try:
        with torch.no_grad():
            for x in _example_inputs(model, device):
                builder = _Builder()
                interp = _IdInterpreter(gm, builder, state)
                try:
                    interp.run(x)
                except TopologyError:
                    raise
                except Exception as exc:  # the wrong input size for this model: try the next
                    last = exc
                    continue
                coverage = _coverage(model, builder.layers, interp.joined)
                if interp.constant:
                    coverage = tuple(
                        (
                            name,
                            shape,
                            "embedding",
                            "computes a position bias from constants (it depends on no input): not a channel map",
                        )
                        if name in interp.constant
                        else (name, shape, role, why)
                        for name, shape, role, why in coverage
                    )
                if interp.mixing:
                    coverage = tuple(
                        (
                            name,
                            shape,
                            "token-mixing",
                            "a linear on the token dimension (token mixing): not a channel map",
                        )
                        if name in interp.mixing
                        else (name, shape, role, why)
                        for name, shape, role, why in coverage
                    )
                return builder.finish(traced=True, coverage=coverage)
    finally:
        for m, mode in modes.items():
            m.training = mode
    raise TopologyError(
        f"{type(model).__name__}: no example input runs the model to follow its channels "
        f"({type(last).__name__ if last else 'no input'}: {last})"
    )
