"""A local sweep on worker processes (`workers=`, `dtg sweep --workers`): the same runs as one
process trains, every run written, a failing batch named while the others finish."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dtg_gpu.cli.main import main
from dtg_gpu.exceptions import SweepFailedError
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep
from dtg_gpu.sweeps.data import load_dataset
from dtg_gpu.sweeps.parallel import worker_threads

# batch norm + residual: trains one run at a time, which is what workers are for
SMALL = dict(
    model="resnet20",
    dataset="digits",
    lrs=(0.01, 0.05),
    dropouts=(0.0, 0.5),
    seeds=1,
    epochs=2,
    checkpoint_every=2,
    checkpoint_unit="step",
    batch_size=64,
    momentum=0.9,
    weight_decay=5e-4,
    model_kwargs={"width": 2},
)


@pytest.fixture(scope="module")
def small_digits():
    """digits cut to 256 / 64 / 64 images: the same code paths, a fifth of the time"""
    ds = load_dataset("digits")
    cut = {"train": 256, "val": 64, "test": 64}
    return replace(ds, **{k: tuple(t[:n] for t in getattr(ds, k)) for k, n in cut.items()})


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _meta(out, name):
    return json.loads((out / name / "run.json").read_text())


def test_workers_train_the_same_runs_as_one_process(tmp_path, one_thread, small_digits):
    cfg = SweepConfig(**SMALL)
    ref = run_sweep(cfg, tmp_path / "one", progress=False, device="cpu", dataset=small_digits)
    # two processes of one thread each, as the reference's one thread
    out = run_sweep(cfg, tmp_path / "two", progress=False, device="cpu", workers=2, dataset=small_digits)
    runs = load_sweep(out)
    assert len(runs) == 4 and not runs.failed
    for i in range(4):
        name = f"run-{i:04d}"
        want, got = _meta(ref, name), _meta(out, name)
        for key in ("lr", "dropout", "seed", "status", "final_accuracy"):
            assert got[key] == want[key], (name, key)
        assert [c["val_accuracy"] for c in got["checkpoints"]] == [c["val_accuracy"] for c in want["checkpoints"]]
        last = got["checkpoints"][-1]["file"]
        a, b = load_file(ref / name / last), load_file(out / name / last)
        assert a.keys() == b.keys() and any(k.endswith("running_mean") for k in a)
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)
    assert not list(out.rglob("*.tmp*"))


def test_a_failing_batch_is_named_and_the_others_finish(tmp_path, small_digits):
    cfg = SweepConfig(**{**SMALL, "lrs": (0.01,), "dropouts": (0.0, 0.25, 0.5)})
    out = run_sweep(cfg, tmp_path / "sw", progress=False, device="cpu", dataset=small_digits)
    # run-0001: unfinished with a user's file in it, which must be moved aside, but the
    # aside folder's name is taken by a file: its worker fails. run-0002: unfinished, dtg's own.
    (out / "run-0001" / "run.json").unlink()
    (out / "run-0001" / "notes.txt").write_text("mine")
    (out / ".dtg-aside").write_text("not a folder")
    (out / "run-0002" / "run.json").unlink()
    kept = (out / "run-0000" / "run.json").read_bytes()
    with pytest.raises(SweepFailedError, match=r"1 run\(s\).*run-0001: FileExistsError") as info:
        run_sweep(cfg, out, progress=False, device="cpu", workers=2, dataset=small_digits)
    assert set(info.value.failures) == {"run-0001"}
    assert _meta(out, "run-0002")["complete"]  # trained again beside the failure
    assert (out / "run-0000" / "run.json").read_bytes() == kept  # complete: not touched
    assert (out / "run-0001" / "notes.txt").read_text() == "mine"  # nothing of the user's lost
    # the obstacle removed, the same call trains what is left
    (out / ".dtg-aside").unlink()
    run_sweep(cfg, out, progress=False, device="cpu", workers=2, dataset=small_digits)
    assert len(load_sweep(out)) == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_workers_must_be_a_positive_integer(tmp_path, bad):
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        run_sweep(SweepConfig(**SMALL), tmp_path / "w", progress=False, workers=bad)
    assert not (tmp_path / "w").exists()


def test_workers_are_for_the_local_executor(tmp_path):
    with pytest.raises(ValueError, match="workers=2 is for the local executor"):
        run_sweep(SweepConfig(**SMALL), tmp_path / "w", progress=False, executor="ray", workers=2)


def test_threads_are_shared_between_workers():
    assert worker_threads(2, 2) == 1
    assert worker_threads(4, 16) == 4
    assert worker_threads(3, 2) == 1  # never zero
    assert worker_threads(1, 8) == 8


def test_cli_workers(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["sweep", "--model", "lenet5", "--lr", "0.01", "0.05", "--dropout", "0", "--epochs", "1"]
    args += ["--checkpoint-every", "10", "--checkpoint-unit", "step", "--group-size", "1", "--quiet"]
    args += ["--device", "cpu", "--out", str(out)]
    assert main([*args, "--workers", "2"]) == 0
    assert "sweep complete" in capsys.readouterr().out
    assert len(load_sweep(out)) == 2
    assert main([*args[:-1], str(tmp_path / "bad"), "--workers", "0"]) != 0
    assert "--workers must be >= 1" in capsys.readouterr().err
