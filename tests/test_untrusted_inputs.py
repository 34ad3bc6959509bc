"""Untrusted inputs and crashes: nothing read outside its folder, nothing finished ever
deleted, every bad file a one-line error. One test per defect found by trying the project as
a hostile or unlucky user (the commands in the issue are the reproductions)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import dtg_gpu
from dtg_gpu import CheckpointError, PerformancePredictor, Run, UnsafeCheckpointError
from dtg_gpu.cli.main import main
from dtg_gpu.exceptions import SweepLockedError
from dtg_gpu.models import LeNet5, build_model
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep

CFG = SweepConfig(
    model="lenet5",
    dataset="digits",
    lrs=(0.01, 0.1),
    dropouts=(0.0,),
    seeds=2,
    epochs=1,
    checkpoint_every=10,
    checkpoint_unit="step",
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return run_sweep(CFG, tmp_path_factory.mktemp("ui") / "sweep", progress=False, device="cpu")


@pytest.fixture
def work(sweep, tmp_path):
    out = tmp_path / "sweep"
    shutil.copytree(sweep, out)
    return out


def _meta(folder):
    return json.loads((folder / "run.json").read_text())


def _set_meta(folder, **fields):
    meta = _meta(folder)
    meta.update(fields)
    (folder / "run.json").write_text(json.dumps(meta))


def _snapshot(folder: Path) -> dict:
    return {
        p.relative_to(folder): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".dtg-sweep")
    }


# 1 ------------------------------------------------------------------ concurrent sweeps
def test_a_second_sweep_on_a_locked_folder_is_refused_and_deletes_nothing(work):
    import fcntl

    (work / "run-0001" / "run.json").unlink()  # one unfinished run: the second process would redo it
    before = _snapshot(work)
    fd = os.open(work / ".dtg-sweep.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "the other process"
        with pytest.raises(SweepLockedError, match="another process"):
            run_sweep(CFG, work, progress=False, device="cpu")
        assert _snapshot(work) == before
    finally:
        os.close(fd)  # the lock dies with its holder
    run_sweep(CFG, work, progress=False, device="cpu")
    assert (work / "run-0001" / "run.json").is_file()
    assert (work / "run-0000" / "ckpt-0001.safetensors").read_bytes() == before[Path("run-0000/ckpt-0001.safetensors")]


def test_two_processes_on_one_sweep_never_lose_a_finished_run(work):
    """Both `dtg sweep` processes start on the same folder; every run ends complete and no
    finished run is deleted (the loser is refused with one line)."""
    for name in ("run-0000", "run-0001"):
        shutil.rmtree(work / name)
    cmd = [
        sys.executable,
        "-m",
        "dtg_gpu.cli.main",
        "sweep",
        "--model",
        "lenet5",
        "--dataset",
        "digits",
        "--lr",
        "0.01",
        "0.1",
        "--dropout",
        "0.0",
        "--seeds",
        "2",
        "--epochs",
        "1",
        "--checkpoint-every",
        "10",
        "--checkpoint-unit",
        "step",
        "--out",
        str(work),
        "--quiet",
        "--device",
        "cpu",
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes[0] == 0, outs
    for p, (_out, err) in zip(procs, outs):
        if p.returncode:
            assert "another process" in err and "Traceback" not in err
    runs = load_sweep(work)
    assert len(runs) == 4 and all(len(r) == 2 for r in runs)


# 2 ---------------------------------------------------------------------- atomic outputs
def test_featurize_killed_mid_write_keeps_the_old_csv(work, tmp_path):
    csv = tmp_path / "f.csv"
    assert main(["featurize", str(work), "--out", str(csv), "--device", "cpu"]) == 0
    old = csv.read_bytes()
    # `ulimit -f 2`: the new CSV (per-layer statistics, several KB) cannot be written whole
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048)); "
        "from dtg_gpu.cli.main import main; "
        f"sys.exit(main(['featurize', {str(work)!r}, '--per-layer', '--out', {str(csv)!r}, '--device', 'cpu']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "error" in proc.stderr and "Traceback" not in proc.stderr
    assert csv.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv", "sweep"]  # no temporary left


def test_train_into_a_missing_folder_fails_before_training(work, tmp_path, capsys):
    target = tmp_path / "missing" / "dir" / "p.safetensors"
    assert main(["train", str(work), "--out", str(target), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "missing" in err and "does not exist" in err and not target.parent.exists()


def test_written_files_respect_the_umask(work, tmp_path):
    old = os.umask(0o022)
    try:
        pred = tmp_path / "p.safetensors"
        assert main(["train", str(work), "--out", str(pred), "--epochs", "5", "--device", "cpu"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(pred.stat().st_mode) == 0o644
    ckpt = work / "run-0000" / "ckpt-0001.safetensors"
    assert stat.S_IMODE(ckpt.stat().st_mode) & 0o044  # not 0600


# 3 --------------------------------------------------------------------- confined paths
@pytest.mark.parametrize(
    "name",
    ["../../other/ckpt.safetensors", "/etc/passwd", "/no/such/file", "sub/../../x.safetensors"],
    ids=["dotdot", "abs-exists", "abs-missing", "nested"],
)
def test_run_json_paths_cannot_leave_the_run_folder(work, name):
    folder = work / "run-0000"
    meta = _meta(folder)
    meta["checkpoints"][0]["file"] = name
    (folder / "run.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="outside|absolute") as e:
        Run.from_dir(folder)
    assert "missing" not in str(e.value) and "exist" not in str(e.value)  # says nothing of the target


def test_symlinks_out_of_the_run_folder_are_refused(work, tmp_path):
    folder = work / "run-0000"
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(folder / "ckpt-0001.safetensors", outside)
    (folder / "ckpt-0001.safetensors").unlink()
    (folder / "ckpt-0001.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside"):
        Run.from_dir(folder)


@pytest.mark.parametrize("runs", [["../x"], ["/tmp"], [".."], [3], "run-0000"])
def test_sweep_json_run_names_stay_inside(work, runs):
    meta = json.loads((work / "sweep.json").read_text())
    meta["runs"] = runs
    (work / "sweep.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="sweep.json"):
        load_sweep(work)


# 4 ------------------------------------------------------- sizes before allocations
def test_huge_num_classes_in_run_json_is_refused_before_building(work):
    folder = work / "run-0000"
    meta = _meta(folder)
    meta["model_kwargs"]["num_classes"] = 10_000_000
    (folder / "run.json").write_text(json.dumps(meta))
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckpointError, match="classifier.7.weight.*shape"):
        Run.from_dir(folder)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KiB: nothing like 5 GB


def _trained_predictor(tmp_path, **kw) -> Path:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6))
    y = (X[:, 0] > 0).astype(int)
    clf = PerformancePredictor(random_state=0, epochs=5, **kw).fit(X, y)
    path = tmp_path / "p.safetensors"
    clf.save(path)
    return path


def _tamper_predictor(path: Path, meta_fn=None, tensor_fn=None) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["dtg_predictor"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta_fn:
        meta_fn(meta)
    if tensor_fn:
        tensor_fn(tensors)
    save_file(tensors, str(path), metadata={"dtg_predictor": json.dumps(meta)})


@pytest.mark.parametrize(
    "case",
    [
        "hidden_huge",
        "classes_one",
        "mean_nan",
        "scale_zero",
        "scaling_bogus",
        "missing_param",
        "extra_param",
        "no_mean",
        "selected_out_of_range",
        "unknown_key",
    ],
)
def test_tampered_predictor_files_are_refused(tmp_path, case):
    path = _trained_predictor(tmp_path)
    meta_fn, tensor_fn = {
        "hidden_huge": (lambda m: m["params"].update(hidden_sizes=[30_000_000]), None),
        "classes_one": (lambda m: m.update(classes=[0]), None),
        "mean_nan": (None, lambda t: t["mean"].fill_(float("nan"))),
        "scale_zero": (None, lambda t: t["scale"].zero_()),
        "scaling_bogus": (lambda m: m["params"].update(scaling="bogus"), None),
        "missing_param": (None, lambda t: t.pop("network.0.bias")),
        "extra_param": (None, lambda t: t.update(extra=torch.zeros(3))),
        "no_mean": (None, lambda t: t.pop("mean")),
        "selected_out_of_range": (
            lambda m: m["params"].update(select=2),
            lambda t: t.update(selected=torch.tensor([0, 99])),
        ),
        "unknown_key": (lambda m: m["params"].update(evil="x"), None),
    }[case]
    _tamper_predictor(path, meta_fn, tensor_fn)
    with pytest.raises(CheckpointError, match="p.safetensors"):
        PerformancePredictor.load(path)


def test_a_predictor_refuses_runs_of_another_architecture(work, tmp_path, capsys):
    pred = tmp_path / "p.safetensors"
    assert main(["train", str(work), "--timesteps", "2", "--out", str(pred), "--epochs", "5", "--device", "cpu"]) == 0
    clf = PerformancePredictor.load(pred)
    vgg = build_model("vgg11", width=0.0625, num_classes=10, in_channels=1)
    other = Run(model=vgg, checkpoints=[vgg.state_dict()] * 2, name="vgg-run")
    mine = load_sweep(work)[0]
    with pytest.warns(dtg_gpu.FailedRunsWarning, match="vgg-run.*architecture"):
        proba = clf.predict_runs([mine, other], device="cpu")
    assert np.isfinite(proba[0]).all() and np.isnan(proba[1]).all()
    with pytest.raises(ValueError, match="architecture"):
        clf.predict_runs([other], device="cpu", strict=True)


# 5 ---------------------------------------------------------------- silently accepted
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_non_float_weights_are_refused(dtype):
    model = LeNet5()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["features.0.weight"] = sd["features.0.weight"].to(dtype)
    with pytest.raises(CheckpointError, match=r"features\.0\.weight.*dtype"):
        Run(model=model, checkpoints=[sd]).weights(0)


def test_a_missing_weight_is_never_filled_from_an_ema_copy():
    model = LeNet5()
    sd = dict(model.state_dict())
    sd["ema.features.3.weight"] = sd.pop("features.3.weight")
    with pytest.raises(CheckpointError, match=r"'features\.3\.weight' is missing"):
        Run(model=model, checkpoints=[sd]).weights(0)


def test_model_and_ema_copies_are_ambiguous_until_a_prefix_is_chosen():
    model = LeNet5()
    sd = {
        **{f"model.{k}": v for k, v in model.state_dict().items()},
        **{f"ema.{k}": v * 2 for k, v in model.state_dict().items()},
    }
    with pytest.raises(CheckpointError, match="'ema.', 'model.'.*prefix"):
        Run(model=model, checkpoints=[sd]).weights(0)
    w = Run(model=model, checkpoints=[sd], prefix="ema.").weights(0)
    assert torch.equal(w["features.0.weight"], model.state_dict()["features.0.weight"] * 2)


@pytest.mark.parametrize("k", ["-1", "0", "100"])
def test_evaluate_refuses_timesteps_out_of_range(work, k, capsys):
    with pytest.raises(SystemExit) if k in ("-1", "0") else _no_exit():
        code = main(["evaluate", str(work), "--timesteps", k, "--repeats", "2", "--device", "cpu"])
        assert code == 1 and "only 2 checkpoints" in capsys.readouterr().err


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_runs_of_different_lengths_are_said_not_silently_shrunk(work):
    runs = load_sweep(work)
    short = Run(model=runs[0].model, checkpoints=runs[0].checkpoints[:1], name="short")
    with pytest.warns(dtg_gpu.DTGWarning, match="1 to 2 checkpoints.*short"):
        X = dtg_gpu.featurize([*runs, short], device="cpu", features="spec")
    assert X.shape == (5, 5)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--checkpoint-every", "50", "--epochs", "2"], "longer than the run"),
        (["--checkpoint-unit", "step", "--checkpoint-every", "100000"], "longer than the run"),
        (["--lr", "inf"], "learning rates"),
        (["--lr", "nan"], "learning rates"),
        (["--model", "foonet"], "unknown model"),
        (["--dataset", "foo"], "unknown dataset"),
    ],
)
def test_sweep_validates_everything_before_writing(tmp_path, capsys, args, match):
    out = tmp_path / "S"
    assert main(["sweep", "--out", str(out), "--quiet", "--device", "cpu", "--epochs", "1", *args]) == 1
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_a_typo_does_not_poison_the_folder(tmp_path, capsys):
    out = tmp_path / "S"
    base = [
        "sweep",
        "--out",
        str(out),
        "--quiet",
        "--device",
        "cpu",
        "--lr",
        "0.01",
        "--dropout",
        "0",
        "--epochs",
        "1",
        "--checkpoint-every",
        "20",
        "--checkpoint-unit",
        "step",
    ]
    assert main(base + ["--model", "foonet"]) == 1
    assert main(base + ["--model", "lenet5"]) == 0
    assert len(load_sweep(out)) == 1


# 7 ------------------------------------------------------------------- one-line errors
@pytest.mark.parametrize(
    "field,value,match",
    [
        ("model", 3, "'model'"),
        ("model", None, "'model'"),
        ("model_kwargs", [1], "'model_kwargs'"),
        ("model_kwargs", "x", "'model_kwargs'"),
        ("checkpoints", [{"nofile": 1}], r"checkpoints\[0\]"),
        ("checkpoints", [{"file": 5}], r"checkpoints\[0\]"),
        ("checkpoints", "x", "'checkpoints'"),
        ("final_accuracy", [0.5], "'final_accuracy'"),
        ("final_accuracy", "abc", "'final_accuracy'"),
    ],
)
def test_malformed_run_json_fields_are_named(work, field, value, match, capsys):
    _set_meta(work / "run-0000", **{field: value})
    with pytest.raises(CheckpointError, match=match):
        Run.from_dir(work / "run-0000")
    assert main(["analyze", str(work / "run-0000"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.json" in err


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", "{", "\xff\xfe", "[" * 100_000 + "]" * 100_000],
    ids=["list", "truncated", "not-utf8", "deeply-nested"],
)
def test_bad_run_json_names_the_file(work, text, capsys):
    (work / "run-0000" / "run.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(CheckpointError, match="run.json"):
        Run.from_dir(work / "run-0000")
    # a sweep with such a run goes on without it (it is not complete)
    assert len(load_sweep(work)) == 3


@pytest.mark.parametrize(
    "text", ['{"format": 1}', "[]", "{", "[" * 100_000], ids=["no-runs", "list", "truncated", "nested"]
)
def test_bad_sweep_json_names_the_file(work, text, capsys):
    (work / "sweep.json").write_text(text)
    with pytest.raises(CheckpointError, match="sweep.json"):
        load_sweep(work)
    assert main(["evaluate", str(work), "--device", "cpu"]) == 1
    assert "sweep.json" in capsys.readouterr().err


# 8 ------------------------------------------------------------------ clear messages
def test_random_bytes_are_corrupt_and_payloads_are_unsafe(tmp_path):
    import random

    rnd = tmp_path / "random.pt"
    for seed in range(64):  # seeded: some random bytes start like a pickle, most do not
        rnd.write_bytes(random.Random(seed).randbytes(4096))
        with pytest.raises(CheckpointError, match=r"random\.pt: not a (readable )?torch checkpoint") as e:
            dtg_gpu.load_state_dict(rnd)
        assert not isinstance(e.value, UnsafeCheckpointError), seed
    torch.save({"x": torch.zeros(1), "cfg": argparse.ArgumentParser}, tmp_path / "evil.pt")
    with pytest.raises(UnsafeCheckpointError, match="argparse.ArgumentParser"):
        dtg_gpu.load_state_dict(tmp_path / "evil.pt")
    torch.save(LeNet5(), tmp_path / "whole.pt")
    with pytest.raises(UnsafeCheckpointError, match="state_dict") as e:
        dtg_gpu.load_state_dict(tmp_path / "whole.pt")
    assert "\x1b[" not in str(e.value)


def test_lightning_hyper_parameters_with_numpy_and_namespace_load(tmp_path):
    model = LeNet5()
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "epoch": 3,
        "hyper_parameters": {"lr": np.float64(0.1), "args": argparse.Namespace(lr=0.1, width=np.int64(2))},
    }
    torch.save(ckpt, tmp_path / "epoch=3-step=30.ckpt")
    w = Run(model=model, checkpoints=[tmp_path / "epoch=3-step=30.ckpt"]).weights(0)
    assert torch.equal(w["features.0.weight"], model.state_dict()["features.0.weight"])


def test_float8_checkpoints_are_read(tmp_path):
    model = LeNet5()
    sd = {k: v.to(torch.float8_e4m3fn) for k, v in model.state_dict().items()}
    save_file(sd, tmp_path / "ckpt-1.safetensors")
    res = dtg_gpu.analyze(Run(model=model, checkpoints=[tmp_path / "ckpt-1.safetensors"]), device="cpu")
    assert res.converged.all()


def test_analyze_json_is_valid_json_with_null_for_nan(work, capsys):
    files = [work / "run-0000" / c["file"] for c in _meta(work / "run-0000")["checkpoints"]]
    save_file({k: torch.full_like(v, float("nan")) for k, v in load_file(files[0]).items()}, str(files[0]))
    _set_meta(
        work / "run-0000",
        checkpoints=[
            {k: v for k, v in c.items() if k not in ("bytes", "sha256")}
            for c in _meta(work / "run-0000")["checkpoints"]
        ],
    )
    assert main(["analyze", str(work / "run-0000"), "--json", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out
    data = json.loads(out)
    assert data["timesteps"][0]["mean"] is None and data["timesteps"][1]["mean"] is not None


# 9 ----------------------------------------------------------------------- resumed sweeps
def test_a_resumed_sweep_retrains_a_run_with_a_truncated_checkpoint(work):
    f = work / "run-0001" / "ckpt-0002.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    good = (work / "run-0000" / "ckpt-0002.safetensors").read_bytes()
    with pytest.warns(dtg_gpu.FailedRunsWarning, match="run-0001.*recorded"):
        damaged = load_sweep(work)
    assert len(damaged) == 3 and "truncated" in damaged.failed["run-0001"]
    run_sweep(CFG, work, progress=False, device="cpu")
    runs = load_sweep(work)
    assert len(runs) == 4
    assert (work / "run-0000" / "ckpt-0002.safetensors").read_bytes() == good  # untouched
    rec = _meta(work / "run-0001")["checkpoints"][1]
    assert rec["bytes"] == f.stat().st_size
    import hashlib

    assert rec["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
