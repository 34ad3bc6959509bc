"""Fuzzing the untrusted inputs: mutated ``.safetensors``, ``.pt``, ``.ckpt``, ``run.json``,
``sweep.json`` and predictor files.

Every case must end in a result or in one of the documented exceptions (``DTGError`` and its
subclasses), read nothing outside the run folder (an audit hook watches every ``open``), and
allocate nothing like what a forged size field asks for. ``make test`` runs a short seeded
pass (``DTG_FUZZ_EXAMPLES``, default 150 per target); ``make fuzz`` runs 2,000 per target
(12,000 cases).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import dtg_gpu
from dtg_gpu import DTGError, PerformancePredictor, Run
from dtg_gpu.models import LeNet5
from dtg_gpu.sweeps import load_sweep

EXAMPLES = int(os.environ.get("DTG_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("DTG_FUZZ_RANDOM"),
    suppress_health_check=list(HealthCheck),
    database=None,
)

ROOT = Path(tempfile.mkdtemp(prefix="dtg-fuzz-"))
INSIDE = ROOT / "sweep" / "run-0000"
INSIDE.mkdir(parents=True)
SECRET = ROOT / "secret.safetensors"  # outside the run folder: must never be opened

# --------------------------------------------------------------- watching every open
_VIOLATIONS: list[str] = []
_WATCHING = [False]


def _audit(event, args):
    if not _WATCHING[0] or event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    try:
        p = Path(os.fsdecode(args[0])).resolve()
    except (OSError, ValueError, RuntimeError):
        return
    inside_root = p == ROOT or ROOT in p.parents
    if (inside_root and INSIDE.parent not in p.parents and p != INSIDE.parent) or str(p).startswith("/etc/"):
        _VIOLATIONS.append(str(p))


sys.addaudithook(_audit)


class watched:
    def __enter__(self):
        _WATCHING[0] = True

    def __exit__(self, *exc):
        _WATCHING[0] = False
        return False


# ---------------------------------------------------------------------- seed inputs
torch.manual_seed(0)
MODEL = LeNet5()
STATE = {k: v.contiguous() for k, v in MODEL.state_dict().items()}
save_file(STATE, str(SECRET))


def _bytes_of(write) -> bytes:
    buf = ROOT / "seed.tmp"
    write(buf)
    data = buf.read_bytes()
    buf.unlink()
    return data


SEEDS = {
    ".safetensors": _bytes_of(lambda p: save_file(STATE, str(p))),
    ".pt": _bytes_of(lambda p: torch.save(STATE, p)),
    ".ckpt": _bytes_of(
        lambda p: torch.save(
            {
                "state_dict": {f"model.{k}": v for k, v in STATE.items()},
                "epoch": 3,
                "hyper_parameters": {"lr": np.float64(0.1), "args": argparse.Namespace(lr=0.1)},
            },
            p,
        )
    ),
}
RUN_JSON = {
    "name": "run-0000",
    "model": "lenet5",
    "model_kwargs": {"num_classes": 10, "in_channels": 1},
    "checkpoints": [{"file": "ckpt-0001.safetensors", "val_accuracy": 0.5}],
    "final_accuracy": 0.9,
    "complete": True,
    "status": "complete",
}


@st.composite
def mutated(draw, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite", "header"]))
        pos = draw(st.integers(0, max(0, len(out) - 1)))
        if kind == "flip" and out:
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del out[pos:]
        elif kind == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=64))
            out[pos : pos + len(chunk)] = chunk
        elif kind == "header" and len(out) > 16:  # the first bytes: length fields, JSON header, zip magic
            p = draw(st.integers(0, min(len(out) - 1, 200)))
            out[p] = draw(st.integers(0, 255))
    return bytes(out)


SPECIAL = st.sampled_from(
    [
        "../secret.safetensors",
        str(SECRET),
        "/etc/passwd",
        "..",
        ".",
        "",
        "ckpt-0001.safetensors",
        "sub/../../../secret.safetensors",
        "lenet5",
        "ema.",
        "\x00",
        "vgg11",
        "1e309",
    ]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | SPECIAL,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12) | SPECIAL, inner, max_size=4),
    max_leaves=12,
)


def _clean_inside():
    for p in INSIDE.iterdir():
        p.unlink()


def _exercise_run(folder: Path, model=None) -> None:
    """What users call on a run folder; only documented errors may come out."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run.from_dir(folder, model=model)
        _ = run.final_accuracy
        run.weights(0)
        res = dtg_gpu.analyze(run, device="cpu")
        assert res.centrality.shape == (len(run), run.topology.num_nodes)


def _expect_documented(fn) -> None:
    try:
        with watched():
            fn()
    except DTGError:
        pass
    assert not _VIOLATIONS, f"read outside the run folder: {_VIOLATIONS[:3]}"


@pytest.fixture(scope="module", autouse=True)
def bounded_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 1_000_000, f"peak RSS grew by {grown / 1e6:.1f} GB while fuzzing"  # KiB


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".ckpt"])
def test_fuzz_checkpoint_files(suffix):
    @FUZZ
    @given(data=mutated(SEEDS[suffix]))
    def case(data):
        _clean_inside()
        path = INSIDE / f"ckpt-0001{suffix}"
        path.write_bytes(data)
        _expect_documented(lambda: dtg_gpu.load_state_dict(path))
        _expect_documented(lambda: _exercise_run(INSIDE, model=MODEL))

    case()


def test_fuzz_run_json():
    @FUZZ
    @given(
        fields=st.dictionaries(st.sampled_from(sorted(RUN_JSON) + ["file", "prefix"]), JSON, max_size=4),
        whole=st.one_of(st.none(), JSON),
        raw=st.one_of(st.none(), st.binary(max_size=64)),
    )
    def case(fields, whole, raw):
        _clean_inside()
        (INSIDE / "ckpt-0001.safetensors").write_bytes(SEEDS[".safetensors"])
        meta = json.loads(json.dumps(RUN_JSON))
        meta.update(fields)
        if (
            isinstance(meta.get("checkpoints"), list)
            and fields.get("file") is not None
            and meta["checkpoints"]
            and isinstance(meta["checkpoints"][0], dict)
        ):
            meta["checkpoints"][0]["file"] = fields["file"]
        text = raw if raw is not None else json.dumps(meta if whole is None else whole).encode()
        (INSIDE / "run.json").write_bytes(text)
        _expect_documented(lambda: _exercise_run(INSIDE))

    case()


def test_fuzz_sweep_json():
    @FUZZ
    @given(doc=JSON, runs=st.one_of(st.none(), st.lists(JSON | SPECIAL, max_size=4)))
    def case(doc, runs):
        _clean_inside()
        (INSIDE / "ckpt-0001.safetensors").write_bytes(SEEDS[".safetensors"])
        (INSIDE / "run.json").write_text(json.dumps(RUN_JSON))
        if runs is not None:
            doc = {"format": "dtg_gpu.sweep/1", "runs": runs}
        (INSIDE.parent / "sweep.json").write_text(json.dumps(doc))

        def load():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for run in load_sweep(INSIDE.parent):
                    run.weights(0)

        _expect_documented(load)

    case()


def _predictor_seed(clf: PerformancePredictor, d: int, name: str) -> tuple[dict, dict]:
    """The metadata and tensors of `clf` fitted on `d` random columns and saved."""
    X = np.random.default_rng(0).normal(size=(30, d))
    clf.fit(X, (X[:, 0] > 0).astype(int)).save(ROOT / name)
    from safetensors import safe_open

    with safe_open(str(ROOT / name), framework="pt") as f:
        return json.loads(f.metadata()["dtg_predictor"]), {k: f.get_tensor(k) for k in f.keys()}


def _load_and_predict(path: Path) -> None:
    clf = PerformancePredictor.load(path)
    proba = clf.predict_proba(np.zeros((2, clf.n_features_in_)))
    assert proba.shape == (2, len(clf.classes_)) and np.isfinite(proba).all()


def _save_load_and_predict(tensors: dict, meta: dict, name: str) -> None:
    """Write a (mutated) predictor file inside the sandbox; loading it predicts or is refused."""
    path = INSIDE / name
    try:
        save_file(tensors, str(path), metadata={"dtg_predictor": json.dumps(meta)})
    except (ValueError, TypeError):
        return
    _expect_documented(lambda: _load_and_predict(path))


PRED_META, PRED_TENSORS = _predictor_seed(
    PerformancePredictor(random_state=0, epochs=3, scaling="quantile", select=3), 4, "p.safetensors"
)


def test_fuzz_predictor_files():
    @FUZZ
    @given(
        params=st.dictionaries(st.sampled_from(sorted(PRED_META["params"]) + ["evil"]), JSON, max_size=3),
        top=st.dictionaries(st.sampled_from(["classes", "n_features_in", "format"]), JSON, max_size=2),
        drop=st.lists(st.sampled_from(sorted(PRED_TENSORS)), max_size=2),
        scale=st.floats(allow_nan=True, allow_infinity=True),
        flip=st.booleans(),
        tail=st.one_of(st.none(), mutated(b"\x00" * 64)),
    )
    def case(params, top, drop, scale, flip, tail):
        meta = json.loads(json.dumps(PRED_META))
        meta["params"].update(params)
        meta.update(top)
        tensors = {k: v.clone() for k, v in PRED_TENSORS.items() if k not in drop}
        if flip and "mean" in tensors:
            tensors["mean"][0] = scale
        path = INSIDE / "p.safetensors"
        try:
            save_file(tensors, str(path), metadata={"dtg_predictor": json.dumps(meta)})
        except (ValueError, TypeError):
            return
        if tail is not None:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2] + tail)
        _expect_documented(lambda: _load_and_predict(path))

    case()


# a predictor file of format /2: linear heads and the seed's MLP on a block of its own
BLOCK_META, BLOCK_TENSORS = _predictor_seed(
    PerformancePredictor(random_state=0, epochs=3, blocks=(2, 3, 1), block_models=("linear", "mlp", "linear")),
    6,
    "b.safetensors",
)


def test_fuzz_predictor_files_with_a_block_mlp():
    @FUZZ
    @given(
        fitted=st.dictionaries(st.sampled_from(["blocks", "block_models", "block_mlps", "scaling"]), JSON, max_size=2),
        nested=st.dictionaries(
            st.sampled_from(["format", "n_features_in", "classes", "params", "fitted"]), JSON, max_size=2
        ),
        drop=st.lists(st.sampled_from(sorted(BLOCK_TENSORS)), max_size=2),
        extra=st.sampled_from([None, "head0.mean", "head1.evil", "head9.network.0.weight"]),
    )
    def case(fitted, nested, drop, extra):
        meta = json.loads(json.dumps(BLOCK_META))
        meta["fitted"].update(fitted)
        mlps = meta["fitted"].get("block_mlps")
        if isinstance(mlps, list) and mlps and isinstance(mlps[0], dict):
            mlps[0].update(nested)
        tensors = {k: v.clone() for k, v in BLOCK_TENSORS.items() if k not in drop}
        if extra is not None:
            tensors[extra] = torch.zeros(3)
        _save_load_and_predict(tensors, meta, "b.safetensors")

    case()


# a predictor file of format /3: the blocks' weights fitted by stacking, beside an MLP block
STACK_META, STACK_TENSORS = _predictor_seed(
    PerformancePredictor(
        random_state=0, epochs=3, blocks=(2, 3, 1), block_models=("linear", "mlp", "linear"), head_weights="stacked"
    ),
    6,
    "s.safetensors",
)


def test_fuzz_predictor_files_with_stacked_head_weights():
    @FUZZ
    @given(
        weights=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=4),
        params=st.dictionaries(st.sampled_from(["head_weights", "blocks", "block_models"]), JSON, max_size=2),
        fmt=st.sampled_from([None, "dtg_gpu.PerformancePredictor/1", "dtg_gpu.PerformancePredictor/2"]),
        drop=st.lists(st.sampled_from(sorted(STACK_TENSORS)), max_size=1),
    )
    def case(weights, params, fmt, drop):
        meta = json.loads(json.dumps(STACK_META))
        meta["params"].update(params)
        if fmt is not None:
            meta["format"] = fmt
        tensors = {k: v.clone() for k, v in STACK_TENSORS.items() if k not in drop}
        if weights:
            tensors["block_weights"] = torch.tensor(weights, dtype=torch.float64)
        _save_load_and_predict(tensors, meta, "s.safetensors")

    case()
