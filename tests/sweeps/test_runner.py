import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import dtg_gpu
from dtg_gpu.exceptions import DatasetNotFoundError
from dtg_gpu.models import MODELS, build_model
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep
from dtg_gpu.sweeps.data import load_dataset

TINY = dict(
    model="lenet5",
    dataset="digits",
    lrs=(0.01, 0.05),
    dropouts=(0.0, 0.5),
    seeds=1,
    epochs=2,
    checkpoint_every=10,
    checkpoint_unit="step",
    batch_size=64,
)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_runs_forward_and_builds_a_graph(name):
    kw = {"width": 0.125} if name.startswith("vgg") else {}
    model = build_model(name, num_classes=10, in_channels=3, dropout=0.2, **kw)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    topo = dtg_gpu.channel_topology(model)
    assert topo.traced and topo.num_nodes > 10 and topo.structurally_connected()
    assert topo.layers[0].in_channels == 3 and topo.layers[-1].out_channels == 10


def test_tiny_sweep_writes_the_on_disk_format(tmp_path):
    out = run_sweep(SweepConfig(**TINY), tmp_path / "sw", progress=False, device="cpu")
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["runs"] == [f"run-{i:04d}" for i in range(4)]
    meta = json.loads((out / "run-0003" / "run.json").read_text())
    assert meta["complete"] and meta["status"] in ("complete", "diverged")
    assert (meta["lr"], meta["dropout"], meta["seed"]) == (0.05, 0.5, 0)
    assert len(meta["checkpoints"]) == 4  # 2 epochs x 20 steps, every 10 steps
    assert all("val_accuracy" in c and "val_loss" in c for c in meta["checkpoints"])
    assert 0.0 <= meta["final_accuracy"] <= 1.0
    assert not list(out.rglob("*.tmp"))
    runs = load_sweep(out)
    assert len(runs) == 4 and all(len(r) == 4 for r in runs)
    X = dtg_gpu.featurize(runs, timesteps=4, device="cpu", features="spec")
    assert X.shape == (4, 20) and torch.isfinite(X).all()
    # the same config again skips everything; a different one is refused
    before = (out / "run-0000" / "ckpt-0001.safetensors").stat().st_mtime_ns
    run_sweep(SweepConfig(**TINY), out, progress=False)
    assert (out / "run-0000" / "ckpt-0001.safetensors").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="different sweep"):
        run_sweep(SweepConfig(**{**TINY, "epochs": 3}), out, progress=False)


def test_one_run_at_a_time_matches_the_format(tmp_path):
    out = run_sweep(
        SweepConfig(**{**TINY, "lrs": (0.02,), "dropouts": (0.3,)}),
        tmp_path / "one",
        progress=False,
        device="cpu",
        group_size=1,
    )
    assert len(load_sweep(out)[0]) == 4


def test_diverging_run_is_recorded_honestly(tmp_path):
    cfg = SweepConfig(**{**TINY, "lrs": (1e4,), "dropouts": (0.0,)})
    out = run_sweep(cfg, tmp_path / "div", progress=False, device="cpu")
    meta = json.loads((out / "run-0000" / "run.json").read_text())
    assert meta["status"] == "diverged" and meta["complete"]
    assert len(meta["checkpoints"]) == 4 and meta["final_accuracy"] < 0.5
    run = load_sweep(out)[0]
    with pytest.warns(dtg_gpu.NonFiniteWeightsWarning):
        res = dtg_gpu.analyze(run, device="cpu")
    assert not res.finite.all()


def test_missing_dataset_says_where_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=rf"cifar10 was not found under {tmp_path}.*--download"):
        load_dataset("cifar10", root=tmp_path)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet")


def test_killed_sweep_resumes_without_losing_completed_runs(tmp_path):
    out = tmp_path / "killed"
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
        "0.02",
        "0.05",
        "--dropout",
        "0",
        "0.3",
        "0.6",
        "--seeds",
        "2",
        "--epochs",
        "2",
        "--checkpoint-every",
        "10",
        "--checkpoint-unit",
        "step",
        "--out",
        str(out),
        "--quiet",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and not list(out.glob("run-*/run.json")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.parent.name for p in out.glob("run-*/run.json"))
    assert 1 <= len(done) < 18, "the kill should land mid-sweep"  # 2 seeds: 2 grouped batches of 9
    snapshot = {p: p.read_bytes() for name in done for p in (out / name).iterdir()}
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    runs = load_sweep(out)
    assert len(runs) == 18
    for p, data in snapshot.items():  # completed runs were skipped, not redone
        assert p.read_bytes() == data


def test_sweep_table_is_tidy(tmp_path):
    from dtg_gpu.workflow import featurize_sweep

    out = run_sweep(SweepConfig(**{**TINY, "lrs": (0.02,)}), tmp_path / "t", progress=False, device="cpu")
    sf = featurize_sweep(load_sweep(out), alpha=0.5, device="cpu")
    df = sf.table()
    assert len(df) == 2 * 4 and {"run", "t", "lr", "dropout", "mean", "kurtosis_smoothed", "final_accuracy"} <= set(
        df.columns
    )
    first = df[(df.run == "run-0000") & (df.t == 0)].iloc[0]
    assert first["mean"] == first["mean_smoothed"]  # s~_1 = s_1
