"""[`channel_topology`][dtg_gpu.channel_topology]: trace a model with the fx pass, else the shape pass, else (with fallback) registration order; cached per architecture; coverage checked."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from dtg_gpu.exceptions import TopologyError, TracingFallbackWarning, UncoveredWeightsWarning
from dtg_gpu.topology.fx_pass import _module_order, _trace
from dtg_gpu.topology.types import ChannelTopology

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
        from dtg_gpu.topology.shape_pass import trace_with_shapes

        try:
            topo = trace_with_shapes(model)
        except TopologyError:
            raise first from None
    except Exception as exc:  # torch.fx raises many kinds on dynamic control flow
        from dtg_gpu.topology.shape_pass import trace_with_shapes

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
