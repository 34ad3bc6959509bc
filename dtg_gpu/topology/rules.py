"""Op rules of the fx pass: which functions, methods and modules keep a tensor's channels, which join channels (sums, concatenations), which change its layout, and the rule for one call."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from dtg_gpu.core.validation import is_int
from dtg_gpu.exceptions import TopologyError
from dtg_gpu.topology.builder import _Cell, _Pieces, _SizeOf, _Val, fx_args, fx_kwargs, known_ids

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


def _is_flatten(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and node.target in _FLATTEN_FN:
        start = fx_args(node)[1] if len(fx_args(node)) > 1 else fx_kwargs(node).get("start_dim", 0)
        return start == 1
    if node.op == "call_method" and node.target == "flatten":
        start = fx_args(node)[1] if len(fx_args(node)) > 1 else fx_kwargs(node).get("start_dim", 0)
        return start == 1
    if node.op in ("call_method", "call_function") and (
        node.target in ("view", "reshape") or node.target is torch.reshape
    ):
        shape: Any = fx_args(node)[1:]
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
    if node.op == "call_function" and target is getattr and len(fx_args(node)) > 1 and fx_args(node)[1] in _META_ATTRS:
        return True  # x.dtype, x.device: nothing downstream consumes them as channels
    name = target if node.op == "call_method" else getattr(target, "__name__", None)
    if name in ("_assert", "_assert_async", "isinstance"):
        return True
    if name in _REDUCE and node.op in ("call_method", "call_function"):
        dim = fx_args(node)[1] if len(fx_args(node)) > 1 else fx_kwargs(node).get("dim")
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        return dim is not None and all(isinstance(d, int) and d not in (1, -3) for d in dims)
    return False


_CONV_FNS = {torch.conv1d, torch.conv2d, torch.conv3d, nn.functional.conv1d, nn.functional.conv2d, nn.functional.conv3d}


_LINEAR_FNS = {nn.functional.linear, torch._C._nn.linear}


_ARITH = {
    operator.floordiv: operator.floordiv,
    operator.mul: operator.mul,
    operator.add: operator.add,
    operator.sub: operator.sub,
}


def _const(a: Any, consts: dict) -> Any:
    if isinstance(a, torch.fx.Node):
        return consts.get(a)
    return a if is_int(a) else None


def _dim1(node: torch.fx.Node, pos: int) -> bool:
    dim = fx_args(node)[pos] if len(fx_args(node)) > pos else fx_kwargs(node).get("dim", 0)
    return dim == 1


def _source(node: torch.fx.Node, vals: dict) -> Any:
    raw = fx_args(node)[0] if fx_args(node) else None
    return vals.get(raw) if isinstance(raw, torch.fx.Node) else None


def _channels(node: torch.fx.Node, vals: dict) -> _Val | None:
    """The value whose channel dim `node` works on, when its channel nodes are known."""
    src = _source(node, vals)
    return src if isinstance(src, _Val) and src.cell.ids is not None else None


# --- sizes and integer arithmetic on them -------------------------------------------------
def _size_call(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`x.size()` (all dims) or `x.size(d)` (the channel count when `d == 1`)."""
    src = _source(node, vals)
    if not isinstance(src, _Val):
        return False
    if len(fx_args(node)) > 1 or "dim" in fx_kwargs(node):
        dim = fx_args(node)[1] if len(fx_args(node)) > 1 else fx_kwargs(node)["dim"]
        consts[node] = len(known_ids(src)) if dim == 1 and src.cell.ids is not None and src.split is None else None
    else:
        consts[node] = _SizeOf(src)
    vals[node] = None
    return True


def _shape_attr(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`x.shape`."""
    src = _source(node, vals)
    if len(fx_args(node)) > 1 and fx_args(node)[1] == "shape" and isinstance(src, _Val):
        consts[node], vals[node] = _SizeOf(src), None
        return True
    return False


def _size_item(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`x.shape[1]`: the channel count."""
    raw = fx_args(node)[0] if fx_args(node) else None
    if not isinstance(consts.get(raw), _SizeOf):
        return False
    v = consts[raw].val
    consts[node] = len(known_ids(v)) if fx_args(node)[1] == 1 and v.cell.ids is not None and v.split is None else None
    vals[node] = None
    return True


def _size_arith(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`C // g`, `C * 2`, ... on known sizes."""
    if not any(isinstance(a, torch.fx.Node) and a in consts for a in fx_args(node)):
        return False
    xs = [_const(a, consts) for a in fx_args(node)[:2]]
    fn = _ARITH[node.target]  # type: ignore[index]  # a key of _ARITH: the table sent the node here
    consts[node] = fn(*xs) if None not in xs and not (fn is operator.floordiv and xs[1] == 0) else None
    vals[node] = None
    return True


# --- slicing along the channel dim ---------------------------------------------------------
def _chunk_split(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`chunk`/`split` along dim 1: each piece gets its slice of the channel nodes."""
    src = _channels(node, vals)
    if src is None or src.split is not None or not _dim1(node, 2):
        return False
    ids = known_ids(src)
    n = len(ids)
    spec: Any = (
        fx_args(node)[1]
        if len(fx_args(node)) > 1
        else fx_kwargs(node).get("chunks", fx_kwargs(node).get("split_size_or_sections"))
    )
    if node.target in ("chunk", torch.chunk):
        size = -(-n // spec)
        sizes = [min(size, n - i) for i in range(0, n, size)]
    elif isinstance(spec, int):
        sizes = [min(spec, n - i) for i in range(0, n, spec)]
    else:
        sizes = list(spec)
    bounds = np.cumsum([0] + sizes)
    vals[node] = _Pieces(_Val(_Cell(ids[a:b])) for a, b in zip(bounds[:-1], bounds[1:]))
    return True


def _narrow(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`x.narrow(1, start, length)` with known bounds."""
    src = _channels(node, vals)
    if src is None or src.split is not None or fx_args(node)[1] != 1:
        return False
    start, length = _const(fx_args(node)[2], consts), _const(fx_args(node)[3], consts)
    if start is None or length is None:
        return False
    vals[node] = _Val(_Cell(known_ids(src)[start : start + length]))
    return True


def _channel_slice(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """`x[:, a:b]`."""
    src = _channels(node, vals)
    index = fx_args(node)[1] if len(fx_args(node)) > 1 else None
    if src is None or src.split is not None or not (isinstance(index, tuple) and len(index) > 1):
        return False
    sl = index[1]
    if not isinstance(sl, slice) or sl == slice(None):
        return False
    parts = [_const(x, consts) if x is not None else None for x in (sl.start, sl.stop, sl.step)]
    vals[node] = _Val(_Cell(known_ids(src)[slice(*parts)]))
    return True


# --- channel shuffle: view into (g, C/g), transpose, view back ----------------------------
def _reshape(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """A `view`/`reshape` that splits the channel dim into `(g, C/g)`, or merges it back."""
    src = _channels(node, vals)
    if src is None:
        return False
    ids = known_ids(src)
    shape = list(fx_args(node)[1:]) if node.op == "call_method" else list(fx_args(node)[1])
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
    if len(dims) >= 3 and dims[0] is not None and dims[1] is not None and dims[0] > 1 and dims[0] * dims[1] == len(ids):
        vals[node] = _Val(_Cell(ids), split=(dims[0], dims[1]))
        return True
    return False


def _shuffle(node: torch.fx.Node, vals: dict, consts: dict) -> bool:
    """A `transpose`/`permute` of the split channel dims (not with a spatial one)."""
    src = _channels(node, vals)
    if src is None or src.split is None:
        return False
    k = len(src.split)
    if node.target == "permute":
        perm = list(fx_args(node)[1:]) if not isinstance(fx_args(node)[1], (tuple, list)) else list(fx_args(node)[1])
        chan = [p - 1 for p in perm[1 : k + 1]]
        if perm[0] != 0 or sorted(chan) != list(range(k)):
            raise TopologyError(
                f"{_describe(node)}: a permute that moves the channel dimension; its channel mapping is unknown"
            )
    else:
        a, b = fx_args(node)[1], fx_args(node)[2]
        if not (1 <= a <= k and 1 <= b <= k):
            raise TopologyError(
                f"{_describe(node)}: a transpose of a split channel dimension with "
                "a spatial one; its channel mapping is unknown"
            )
        chan = list(range(k))
        chan[a - 1], chan[b - 1] = chan[b - 1], chan[a - 1]
    grid = known_ids(src).reshape(src.split).transpose(chan)
    vals[node] = _Val(_Cell(grid.reshape(-1)), split=tuple(grid.shape))
    return True


ChannelRule = Callable[[torch.fx.Node, dict, dict], bool]

#: `call_method` name -> the rules tried in order; the first that returns True handled the node
METHOD_RULES: dict[str, tuple[ChannelRule, ...]] = {
    "size": (_size_call,),
    "chunk": (_chunk_split,),
    "split": (_chunk_split,),
    "narrow": (_narrow,),
    "view": (_reshape,),
    "reshape": (_reshape,),
    "transpose": (_shuffle,),
    "permute": (_shuffle,),
}

#: `call_function` target -> the rules tried in order
FUNCTION_RULES: dict[Any, tuple[ChannelRule, ...]] = {
    getattr: (_shape_attr,),
    operator.getitem: (_size_item, _channel_slice),
    torch.chunk: (_chunk_split,),
    torch.split: (_chunk_split,),
    torch.reshape: (_reshape,),
    torch.transpose: (_shuffle,),
    **{fn: (_size_arith,) for fn in _ARITH},
}


def _channel_op(node: torch.fx.Node, args: list, vals: dict, consts: dict) -> bool:
    """Channel-exact slicing, sizes and shuffles; `True` when `node` was handled.

    `chunk`/`split`/`narrow`/`x[:, a:b]` along dim 1 give each piece the matching
    slice of channel nodes; `x.size()` / `x.size(1)` / `x.shape` give the channel count
    so that shapes computed from it are known; a `view` that splits the channel dim into
    `(g, C/g)`, a `transpose` of those dims and the `view` that merges them back permute
    the channel nodes (ShuffleNet's channel shuffle). A reshape of a split channel dim that is
    not understood is an error that names it, never a silent identity. The rules are the
    tables `METHOD_RULES` and `FUNCTION_RULES`.
    """
    if node.op == "call_method" and isinstance(node.target, str):
        rules = METHOD_RULES.get(node.target, ())
    elif node.op == "call_function":
        try:
            rules = FUNCTION_RULES.get(node.target, ())
        except TypeError:  # an unhashable target
            rules = ()
    else:
        rules = ()
    return any(rule(node, vals, consts) for rule in rules)


def _describe(node: torch.fx.Node) -> str:
    """`op 'transpose' (node transpose_1) in module 'blocks.0.mlp_tokens' (MixerBlock)`."""
    op = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    stack = node.meta.get("nn_module_stack") or {}
    where = ""
    if stack:
        path, cls = list(stack.values())[-1]
        where = f" in module {path!r} ({getattr(cls, '__name__', cls)})"
    return f"op {op!r} (node {node.name}){where}"
