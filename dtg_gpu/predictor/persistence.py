"""A fitted predictor as one `.safetensors` file: `save` writes its weights and settings (no
pickle, no code); `load` reads one back with every field checked, since predictor files
are untrusted. A mixin of [`PerformancePredictor`][dtg_gpu.PerformancePredictor]."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from dtg_gpu.core.validation import is_int
from dtg_gpu.predictor.networks import BLOCK_MODELS, _BlockHeads, _mlp
from dtg_gpu.predictor.scaling import SCALINGS

__all__ = ["save_predictor", "load_predictor"]


#: the file format: `/1` for every predictor without an MLP block or fitted head weights (what
#: older versions read), `/2` when a block has the seed's MLP of its own (`block_models`), saved
#: as `head<i>.` tensors and a nested `fitted.block_mlps` entry, `/3` when the blocks' weights are
#: fitted (`head_weights="stacked"`, a `block_weights` tensor; MLP blocks as in `/2`)
FORMATS = ("dtg_gpu.PerformancePredictor/1", "dtg_gpu.PerformancePredictor/2", "dtg_gpu.PerformancePredictor/3")

#: parameters newer than format /1 and the value a file that does not name them means (what
#: every predictor did before the parameter existed): left out of a file where they hold that
#: value, so that a file older versions could have written stays readable by them, and filled
#: in on reading (`head_weights` is `"stacked"` by default since 2026-12-07, but a file without
#: it was written with equal weights)
_NEWER_PARAMS = {"block_models": "auto", "head_weights": "equal"}


def save_predictor(clf: Any, path: str | os.PathLike) -> None:
    """Write the fitted predictor and its feature settings to one `.safetensors` file."""
    from safetensors.torch import save_file

    check_is_fitted(clf, "network_")
    tensors, meta = _parts(clf)
    from dtg_gpu.core.files import atomic_write

    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"dtg_predictor": json.dumps(meta)}))


def _parts(clf: Any) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the metadata of a fitted predictor (its MLP blocks' nested)."""
    tensors = {f"network.{k}": v.detach().contiguous() for k, v in clf.network_.state_dict().items()}
    tensors["mean"] = torch.as_tensor(clf.mean_)
    tensors["scale"] = torch.as_tensor(clf.scale_)
    if clf.scaling_ == "quantile":
        tensors["quantiles"] = torch.as_tensor(clf.quantiles_).contiguous()
    if clf.select_ is not None:
        tensors["selected"] = torch.as_tensor(clf.selected_, dtype=torch.int64)
    if clf.columns_.size != clf.n_features_in_:
        tensors["columns"] = torch.as_tensor(clf.columns_, dtype=torch.int64)
    params = clf.get_params()
    params["hidden_sizes"] = [int(h) for h in params["hidden_sizes"]]
    if params["blocks"] not in ("auto", None):
        params["blocks"] = [int(w) for w in params["blocks"]]
    if params["block_models"] != "auto":
        params["block_models"] = [str(m) for m in params["block_models"]]
    if not isinstance(params["random_state"], (int, type(None))):
        params["random_state"] = None
    for key, default in _NEWER_PARAMS.items():
        if params.get(key) == default:
            del params[key]
    models = getattr(clf, "block_models_", None)
    mlps = []
    mlp_blocks = [i for i, m in enumerate(models or ()) if m == "mlp"]
    for i, sub in zip(mlp_blocks, getattr(clf, "block_mlps_", None) or []):  # head<i>: block i's MLP
        sub_tensors, sub_meta = _parts(sub)
        tensors.update({f"head{i}.{k}": v for k, v in sub_tensors.items()})
        mlps.append(sub_meta)
    stacked = clf.head_weights == "stacked" and getattr(clf, "blocks_", None)
    if stacked:
        tensors["block_weights"] = torch.as_tensor(np.asarray(clf.block_weights_, dtype=np.float64))
    meta = {
        "format": FORMATS[2] if stacked else FORMATS[1] if mlps else FORMATS[0],
        "params": params,
        "classes": clf.classes_.tolist(),
        "n_features_in": int(clf.n_features_in_),
        "fitted": {
            "scaling": clf.scaling_,
            "select": None if clf.select_ is None else int(clf.select_),
            **({"blocks": [int(w) for w in blocks]} if (blocks := getattr(clf, "blocks_", None)) else {}),
            **({"block_models": list(models or ()), "block_mlps": mlps} if mlps else {}),
        },
    }
    return tensors, meta


def load_predictor(cls: Any, path: str | os.PathLike) -> Any:
    """Read a predictor written by [`save`][dtg_gpu.PerformancePredictor.save] (no pickle, no code), validated.

    Predictor files are untrusted: every field is checked before it is used, and the
    network's shapes against the tensors the file holds before anything is built, so a
    tampered file is refused with one line instead of predicting nonsense.

    Raises
    ------
    CheckpointError
        Not a predictor file, or a field that is missing, malformed or inconsistent
        (the message names the file and the field).
    """
    from safetensors import SafetensorError, safe_open

    from dtg_gpu.exceptions import CheckpointError

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: not a valid dtg_gpu predictor file: {what}")

    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("dtg_predictor")
            if raw is None:
                raise bad("no 'dtg_predictor' metadata")
            meta = json.loads(raw)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except CheckpointError:
        raise
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError, RecursionError) as exc:
        raise bad(" ".join(str(exc).split()) or type(exc).__name__) from None
    clf = _from_parts(cls, meta, tensors, bad)
    return clf


def _from_parts(cls: Any, meta: Any, tensors: dict, bad) -> Any:
    """A predictor from a file's metadata and tensors, every field checked (`bad(why)`
    makes the error that names the file)."""
    clf, classes, d, fitted = _meta_from(cls, meta, bad)
    own = {k: v for k, v in tensors.items() if not k.startswith("head") and k != "block_weights"}
    expected, d = _scaling_from(clf, own, d, bad)
    _network_from(clf, own, fitted, classes, d, expected, bad)
    _block_mlps_from(cls, clf, tensors, fitted, meta["format"], bad)
    _block_weights_from(clf, tensors.get("block_weights"), meta["format"], bad)
    return clf


def _block_weights_from(clf: Any, t: torch.Tensor | None, fmt: str, bad) -> None:
    """The blocks' weights: fitted ones (format /3, `head_weights="stacked"`), else equal."""
    h = len(clf.blocks_ or ())
    stacked = fmt == FORMATS[2]
    if stacked != (clf.head_weights == "stacked" and h > 0) or stacked != (t is not None):
        raise bad(f"format {FORMATS[2]!r}, head_weights='stacked', blocks and 'block_weights' go together")
    clf.block_weights_ = np.full(h, 1.0 / h) if h else None
    if t is None:
        return
    w = t.double().numpy() if t.is_floating_point() else np.array([np.nan])
    if w.shape != (h,) or not np.isfinite(w).all() or (w < 0).any() or abs(w.sum() - 1.0) > 1e-6:
        raise bad(f"'block_weights' must be {h} non-negative weights adding up to 1")
    clf.block_weights_ = w


def _block_mlps_from(cls: Any, clf: Any, tensors: dict, fitted: dict, fmt: str, bad) -> None:
    """The seed's MLP of each `"mlp"` block (format /2; the block models were checked with
    the network), each checked like a file of its own and against its block's width."""
    mlps = fitted.get("block_mlps")
    heads = sorted({k.split(".", 1)[0] for k in tensors if k.startswith("head")})
    blocks = clf.blocks_ or ()
    mlp_index = [i for i, m in enumerate(clf.block_models_ or ()) if m == "mlp"]
    clf.block_mlps_ = []
    if mlps is None and not heads and not mlp_index:
        return
    if fmt == FORMATS[0]:
        raise bad(f"block MLPs need format {FORMATS[1]!r} or {FORMATS[2]!r}")
    if not isinstance(mlps, list) or not mlps or len(mlps) != len(mlp_index):
        raise bad("fitted.block_mlps must hold one entry per 'mlp' block of fitted.block_models")
    if heads != sorted(f"head{i}" for i in mlp_index):
        raise bad(f"tensors {heads} do not match the 'mlp' blocks {mlp_index}")
    for i, sub_meta in zip(mlp_index, mlps):
        if not isinstance(sub_meta, dict) or sub_meta.get("format") != FORMATS[0]:
            raise bad(f"fitted.block_mlps entry for block {i} must be a plain predictor ({FORMATS[0]!r})")
        prefix = f"head{i}."
        sub_tensors = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        sub = _from_parts(cls, sub_meta, sub_tensors, lambda why, i=i: bad(f"block MLP {i}: {why}"))
        if sub.blocks_ or sub.n_features_in_ != blocks[i] or list(sub.classes_) != [0, 1]:
            raise bad(f"block MLP {i} must be one network on block {i}'s {blocks[i]} columns with classes [0, 1]")
        clf.block_mlps_.append(sub)


def _meta_from(cls: Any, meta: Any, bad) -> tuple[Any, list, int, dict]:
    if not isinstance(meta, dict) or meta.get("format") not in FORMATS:
        raise bad("unknown format")
    params = meta.get("params")
    known = set(cls().get_params())
    if not isinstance(params, dict) or not set(params) <= known:
        raise bad(f"params must be an object with keys among {sorted(known)}")
    hidden = params.get("hidden_sizes", (32,))
    if not isinstance(hidden, list) or not all(is_int(h) and 1 <= h <= 65536 for h in hidden):
        raise bad(f"hidden_sizes must be a list of integers in [1, 65536], got {hidden!r}")
    params["hidden_sizes"] = tuple(hidden)
    for key in ("blocks", "block_models"):
        if isinstance(params.get(key), list):
            params[key] = tuple(params[key])
    if params.get("feature_settings") is not None and not isinstance(params["feature_settings"], dict):
        raise bad("feature_settings must be an object")
    for key, absent in _NEWER_PARAMS.items():
        params.setdefault(key, absent)
    try:
        clf = cls(**params)
        clf._check_params()
    except (ValueError, TypeError) as exc:
        raise bad(str(exc)) from None
    classes = meta.get("classes")
    if (
        not isinstance(classes, list)
        or len(classes) < 2
        or len(set(map(repr, classes))) != len(classes)
        or not all(isinstance(c, (int, str)) and not isinstance(c, bool) for c in classes)
    ):
        raise bad(f"classes must list at least two distinct labels, got {classes!r}")
    d = meta.get("n_features_in")
    if not is_int(d) or not 1 <= d <= 10_000_000:
        raise bad(f"n_features_in must be a positive integer, got {d!r}")
    fitted = meta.get("fitted", {"scaling": clf.scaling, "select": clf.select})  # files before auto
    if (
        not isinstance(fitted, dict)
        or fitted.get("scaling") not in SCALINGS
        or not (
            fitted.get("select") is None
            or (isinstance(fitted["select"], int) and not isinstance(fitted["select"], bool) and fitted["select"] >= 1)
        )
    ):
        raise bad(f"fitted must hold a scaling among {SCALINGS} and select (null or a positive integer)")
    clf.scaling_, clf.select_ = fitted["scaling"], fitted.get("select")
    clf.classes_ = np.array(classes)
    clf.n_features_in_ = d
    return clf, classes, d, fitted


def _scaling_from(clf: Any, tensors: dict, d: int, bad) -> tuple[set[str], int]:
    """Columns, scaling and selected features; returns the tensors read and the width."""
    columns = tensors.get("columns")
    if columns is not None:
        if columns.dim() != 1 or columns.dtype != torch.int64 or not 1 <= columns.numel() <= d:
            raise bad("'columns' must be an int64 vector of at most n_features_in indices")
        c = columns.numpy()
        if c.min() < 0 or c.max() >= d or (np.diff(c) == 0).any():
            raise bad("'columns' must be distinct indices below n_features_in")
        clf.columns_ = c
        d = c.size
    else:
        clf.columns_ = np.arange(d)

    def vector(name: str, positive: bool = False) -> np.ndarray:
        t = tensors.get(name)
        if t is None or tuple(t.shape) != (d,) or not t.is_floating_point():
            raise bad(f"{name!r} must be a float vector of {d} values")
        v = t.double().numpy()
        if not np.isfinite(v).all() or (positive and not (v > 0).all()):
            raise bad(f"{name!r} holds {'non-positive or ' if positive else ''}non-finite values")
        return v

    clf.mean_ = vector("mean")
    clf.scale_ = vector("scale", positive=True)
    expected = {"mean", "scale"} | ({"columns"} if columns is not None else set())
    if clf.scaling_ == "quantile":
        q = tensors.get("quantiles")
        if q is None or q.dim() != 2 or q.shape[1] != d or q.shape[0] < 1:
            raise bad(f"a quantile-scaled predictor needs 'quantiles' of shape [n, {d}]")
        qn = q.double().numpy()
        if not np.isfinite(qn).all() or (np.diff(qn, axis=0) < 0).any():
            raise bad("'quantiles' must be finite and non-decreasing down each column")
        clf.quantiles_ = qn
        expected.add("quantiles")
    sel = tensors.get("selected")
    if clf.select_ is not None:
        if sel is None or sel.dim() != 1 or sel.dtype != torch.int64:
            raise bad(f"a predictor with select={clf.select_} needs its 'selected' features (int64)")
        s = sel.numpy()
        if s.size != min(int(clf.select_), d) or (s.size and (s.min() < 0 or s.max() >= d)) or (np.diff(s) <= 0).any():
            raise bad("'selected' must be increasing feature indices within range")
        clf.selected_ = s
        expected.add("selected")
    else:
        clf.selected_ = np.arange(d)
    return expected, d


def _network_from(clf: Any, tensors: dict, fitted: dict, classes: list, d: int, expected: set[str], bad) -> None:
    """The network's weights, their shapes checked against the rest of the file."""
    n_out = 1 if len(classes) == 2 else len(classes)
    blocks = fitted.get("blocks")
    if blocks is not None and (
        not isinstance(blocks, list)
        or len(blocks) < 2
        or not all(is_int(w) and w >= 1 for w in blocks)
        or sum(blocks) != clf.selected_.size
        or n_out != 1
        or clf.hidden_sizes
    ):
        raise bad(f"fitted.blocks must be positive widths adding up to the {clf.selected_.size} features")
    clf.blocks_ = tuple(blocks) if blocks else None
    shapes: dict[str, tuple[int, ...]] = {}
    linear: list[int] | None = None
    clf.block_models_ = None
    if blocks:
        models = fitted.get("block_models", ["linear"] * len(blocks))
        if (
            not isinstance(models, list)
            or len(models) != len(blocks)
            or not all(m in BLOCK_MODELS for m in models)
            or "linear" not in models
        ):
            raise bad("fitted.block_models must name 'linear' or 'mlp' for each block, at least one 'linear'")
        clf.block_models_ = tuple(models)
        linear = [i for i, m in enumerate(models) if m == "linear"]
        shapes["network.linear.weight"], shapes["network.linear.bias"] = (len(linear), d), (len(linear),)
    widths = [int(clf.selected_.size), *clf.hidden_sizes, n_out]
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        if blocks:
            break
        shapes[f"network.{2 * i}.weight"], shapes[f"network.{2 * i}.bias"] = (b, a), (b,)
    for k, shape in shapes.items():
        t = tensors.get(k)
        if t is None or tuple(t.shape) != shape or not t.is_floating_point() or not torch.isfinite(t).all():
            raise bad(f"{k!r} must be a finite float tensor of shape {list(shape)}")
    extra = set(tensors) - expected - set(shapes)
    if extra:
        raise bad(f"unexpected tensors {sorted(extra)[:5]}")
    clf.network_ = (  # sizes checked against the file
        _BlockHeads(blocks, linear) if blocks else _mlp(clf.selected_.size, clf.hidden_sizes, n_out)
    )
    clf.network_.load_state_dict({k[len("network.") :]: tensors[k].float() for k in shapes})
    clf.network_.eval()
