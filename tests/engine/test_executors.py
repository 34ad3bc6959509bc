"""Sweeps on Ray (a real local instance) and the per-run feature cache: identical to the
local path, resumable, and one lost worker or bad run never loses or duplicates a row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from ray_helpers import BrokenRun, slow  # noqa: E402

from dtg_gpu import SolverOptions  # noqa: E402
from dtg_gpu.cli.main import main  # noqa: E402
from dtg_gpu.engine import executors  # noqa: E402
from dtg_gpu.engine.cache import CACHE_DIRNAME  # noqa: E402
from dtg_gpu.exceptions import DTGWarning, FailedRunsWarning  # noqa: E402
from dtg_gpu.sweeps import SweepConfig, SweepRuns, load_sweep, run_sweep  # noqa: E402
from dtg_gpu.workflow import featurize_sweep  # noqa: E402

HERE = Path(__file__).resolve().parents[1]  # tests/: the helpers ray_driver.py and ray_helpers.py
TINY = dict(
    model="lenet5",
    dataset="digits",
    lrs=(0.01, 0.05, 0.2),
    dropouts=(0.0, 0.5),
    seeds=1,
    epochs=2,
    checkpoint_every=10,
    checkpoint_unit="step",
    batch_size=64,
)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit for bit, NaN where NaN."""
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def same_features(a, b) -> None:
    same(a.stats, b.stats)
    same(a.log_eigenvalue, b.log_eigenvalue)
    assert (a.layer_stats is None) == (b.layer_stats is None)
    if a.layer_stats is not None:
        same(a.layer_stats, b.layer_stats)
    assert a.failed == b.failed and (a.usable == b.usable).all()


@pytest.fixture(scope="module")
def sweep(trained_sweep) -> Path:
    """6 LeNet-5 runs of 4 checkpoints on digits."""
    return trained_sweep(SweepConfig(**TINY))


@pytest.fixture(scope="module")
def vgg_sweep(trained_sweep) -> Path:
    """A second architecture: 2 VGG-11 (width 1/16) runs of 4 checkpoints."""
    cfg = SweepConfig(**{**TINY, "model": "vgg11", "lrs": (0.01,), "model_kwargs": {"width": 0.0625}})
    return trained_sweep(cfg, "vgg")


@pytest.fixture
def copy_of(sweep, tmp_path):
    import shutil

    def make() -> Path:
        dst = tmp_path / "sweep"
        shutil.copytree(sweep, dst, ignore=shutil.ignore_patterns(CACHE_DIRNAME))
        return dst

    return make


def mixed_runs(path: Path, vgg: Path) -> SweepRuns:
    """LeNet-5 runs, one with a damaged checkpoint, then VGG-11 runs (same run names)."""
    runs = load_sweep(path)
    bad = Path(runs[2].checkpoints[1])
    bad.write_bytes(b"\x00" * bad.stat().st_size)  # complete by size, unreadable
    return SweepRuns(list(runs) + list(load_sweep(vgg)), path=path)


# ------------------------------------------------------------------------------ cache
def test_cache_resumes_bit_identical_and_never_reads_stale_entries(copy_of, monkeypatch):
    path = copy_of()
    fresh = featurize_sweep(load_sweep(path), cache=False, device="cpu", solver=SolverOptions(chunk_size=8))
    first = featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(chunk_size=8))
    same_features(fresh, first)
    entries = sorted((path / CACHE_DIRNAME).glob("run-*/*.safetensors"))
    assert len(entries) == 6  # one per run

    solved = []
    real = executors.iter_solve
    monkeypatch.setattr(
        executors, "iter_solve", lambda chunks, *a, **k: solved.append(len(chunks)) or real(chunks, *a, **k)
    )
    again = featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(chunk_size=8))
    same_features(fresh, again)
    assert solved == []  # everything from the cache

    # a rewritten checkpoint: its unit (2 runs of 4 checkpoints) is solved again
    ckpt = Path(load_sweep(path)[3].checkpoints[0])
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 10**9))
    same_features(fresh, featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(chunk_size=8)))
    assert solved == [1]
    # damaged and foreign entries are misses, solved again, never an error
    entries[0].write_bytes(b"not a safetensors file")
    entries[5].write_bytes(entries[4].read_bytes())  # another run's entry under this name
    solved.clear()
    same_features(fresh, featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(chunk_size=8)))
    assert solved == [2]  # units 0 and 2, in one pipelined pass
    # other settings, another chunking: other keys
    solved.clear()
    featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(dtype=torch.float64, chunk_size=8))
    featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(chunk_size=4))
    assert solved == [3, 6]  # 3 units of 2 runs in float64; 6 units of one run
    assert len(list((path / CACHE_DIRNAME).glob("run-0000/*.safetensors"))) == 3


def test_unwritable_cache_warns_once_and_changes_nothing(copy_of, tmp_path):
    path = copy_of()
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    fresh = featurize_sweep(load_sweep(path), cache=False, device="cpu")
    with pytest.warns(DTGWarning, match="cannot be written") as rec:
        got = featurize_sweep(load_sweep(path), cache=blocker / "cache", device="cpu")
    assert sum("cannot be written" in str(w.message) for w in rec) == 1
    same_features(fresh, got)


def test_cli_featurize_resumes_from_the_cache_and_no_cache_leaves_none(copy_of, tmp_path, capsys):
    path = copy_of()
    assert main(["featurize", str(path), "--out", str(tmp_path / "a.csv"), "--device", "cpu", "--no-cache"]) == 0
    assert not (path / CACHE_DIRNAME).exists()
    assert main(["featurize", str(path), "--out", str(tmp_path / "b.csv"), "--device", "cpu"]) == 0
    assert len(list((path / CACHE_DIRNAME).glob("run-*/*.safetensors"))) == 6
    assert main(["featurize", str(path), "--out", str(tmp_path / "c.csv"), "--device", "cpu"]) == 0
    a, b, c = ((tmp_path / f"{x}.csv").read_text() for x in "abc")
    assert a == b == c
    assert main(["featurize", str(path), "--out", str(tmp_path / "d.csv"), "--address", "auto"]) == 1
    assert "--address needs --ray" in capsys.readouterr().err


# -------------------------------------------------------------------------------- Ray
def test_ray_is_bit_identical_to_local_with_bad_runs_named(local_ray, copy_of, vgg_sweep):
    path = copy_of()
    runs = mixed_runs(path, vgg_sweep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FailedRunsWarning)
        for chunk in (None, 4):  # default plan (3 runs a unit) and one run a unit
            local = featurize_sweep(runs, cache=False, device="cpu", solver=SolverOptions(chunk_size=chunk))
            remote = featurize_sweep(
                runs, cache=False, device="cpu", solver=SolverOptions(chunk_size=chunk), executor="ray"
            )
            same_features(local, remote)
            assert list(local.failed) == [runs[2].name] and not local.usable[2]
            assert str(runs[2].checkpoints[1]) in local.failed[runs[2].name]


def test_ray_writes_the_cache_local_reads_it(local_ray, copy_of, monkeypatch):
    path = copy_of()
    remote = featurize_sweep(load_sweep(path), device="cpu", executor="ray", solver=SolverOptions(chunk_size=4))
    assert len(list((path / CACHE_DIRNAME).glob("run-*/*.safetensors"))) == 6
    monkeypatch.setattr(executors, "iter_solve", lambda *a, **k: pytest.fail("solved again"))
    same_features(remote, featurize_sweep(load_sweep(path), device="cpu", solver=SolverOptions(chunk_size=4)))


def test_a_task_that_raises_names_its_runs_and_the_rest_finish(local_ray, copy_of):
    path = copy_of()
    runs = load_sweep(path)
    runs[1] = BrokenRun(model=runs[1].model, checkpoints=runs[1].checkpoints, name=runs[1].name, meta=runs[1].meta)
    local = featurize_sweep(load_sweep(path), cache=False, device="cpu", solver=SolverOptions(chunk_size=4))
    with pytest.warns(FailedRunsWarning, match="reader exploded"):
        got = featurize_sweep(runs, cache=False, device="cpu", solver=SolverOptions(chunk_size=4), executor="ray")
    assert list(got.failed) == [runs[1].name] and "RuntimeError" in got.failed[runs[1].name]
    keep = [i for i in range(6) if i != 1]
    same(got.stats[keep], local.stats[keep])
    assert torch.isnan(got.stats[1]).all()


def test_runs_held_in_memory_are_refused_with_their_name(local_ray):
    from conftest import make_checkpoints

    from dtg_gpu import Run
    from dtg_gpu.models import build_model

    net = build_model("lenet5", num_classes=10, in_channels=1)
    run = Run(model=net, checkpoints=make_checkpoints(net, t=2), name="in-ram")
    with pytest.raises(ValueError, match="'in-ram' holds its checkpoints in memory"):
        featurize_sweep([run], executor="ray", device="cpu")


def test_a_killed_worker_is_retried_and_the_result_is_complete(local_ray, copy_of, tmp_path):
    path = copy_of()
    expected = featurize_sweep(load_sweep(path), cache=False, device="cpu", solver=SolverOptions(chunk_size=4))
    pid_file = tmp_path / "pid"
    runs = slow(load_sweep(path), delay=0.4, pid_file=str(pid_file))
    killed = []

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not pid_file.exists():
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    t = threading.Thread(target=killer)
    t.start()
    got = featurize_sweep(runs, device="cpu", solver=SolverOptions(chunk_size=4), executor="ray")
    t.join()
    assert killed and killed[0] != os.getpid()
    same_features(expected, got)
    assert len(list((path / CACHE_DIRNAME).glob("run-*/*.safetensors"))) == 6


def test_a_killed_driver_resumes_where_it_stopped(copy_of):
    path = copy_of()
    expected = featurize_sweep(load_sweep(path), cache=False, device="cpu", solver=SolverOptions(chunk_size=4))
    env = {**os.environ, "PYTHONPATH": f"{HERE}:{HERE.parent}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ray_driver.py"), str(path), "1.0"],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    cache = path / CACHE_DIRNAME
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not list(cache.glob("run-*/*.safetensors")) and proc.poll() is None:
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0].decode(errors="replace")
    before = {p: p.stat().st_mtime_ns for p in cache.glob("run-*/*.safetensors")}
    assert 1 <= len(before) < 6, out[-2000:]
    got = featurize_sweep(slow(load_sweep(path)), device="cpu", solver=SolverOptions(chunk_size=4))
    same_features(expected, got)
    assert all(p.stat().st_mtime_ns == ns for p, ns in before.items())  # cached runs not solved again
    assert len(list(cache.glob("run-*/*.safetensors"))) == 6


def test_sweep_on_ray_trains_every_run_and_a_rerun_skips_finished_ones(local_ray, tmp_path, capsys):
    out = tmp_path / "raysweep"
    args = [
        "sweep",
        "--model",
        "lenet5",
        "--lr",
        "0.01",
        "0.05",
        "--dropout",
        "0",
        "--epochs",
        "1",
        "--checkpoint-every",
        "10",
        "--checkpoint-unit",
        "step",
        "--out",
        str(out),
        "--quiet",
        "--ray",
        "--group-size",
        "1",
    ]
    assert main(args) == 0
    runs = load_sweep(out)
    assert [r.name for r in runs] == ["run-0000", "run-0001"] and all(len(r) == 2 for r in runs)
    assert all(r.final_accuracy is not None for r in runs)
    kept = {p: p.stat().st_mtime_ns for p in (out / "run-0000").iterdir()}
    (out / "run-0001" / "run.json").unlink()  # as if its task had been killed before the end
    assert main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "run-0000").iterdir()} == kept
    assert len(load_sweep(out)) == 2


def test_without_ray_installed_the_cli_says_how_to_get_it(copy_of, tmp_path, monkeypatch, capsys):
    path = copy_of()
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    for name in ("dtg_gpu.core.ray", "dtg_gpu.engine.ray_executor", "dtg_gpu.sweeps.ray_training"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert main(["featurize", str(path), "--out", str(tmp_path / "f.csv"), "--ray", "--no-cache"]) == 1
    assert "pip install 'dtg_gpu[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "f.csv").exists()


def test_cache_sees_a_rewritten_file_inside_a_hugging_face_checkpoint_folder(tmp_path):
    import time as _time

    from safetensors.torch import save_file

    from dtg_gpu import Run
    from dtg_gpu.engine.cache import unit_key
    from dtg_gpu.models import LeNet5

    net = LeNet5()
    for n in (1, 2):
        (tmp_path / f"checkpoint-{n}").mkdir()
        save_file(net.state_dict(), str(tmp_path / f"checkpoint-{n}" / "model.safetensors"))
    run = Run.from_dir(tmp_path, model=net)
    before = unit_key([run], 2, 2, {}, "sig", tmp_path)
    _time.sleep(0.01)
    save_file({k: v + 1 for k, v in net.state_dict().items()}, str(tmp_path / "checkpoint-2" / "model.safetensors"))
    assert unit_key([run], 2, 2, {}, "sig", tmp_path) != before


def test_ray_folds_batch_norm_as_the_local_path_does(local_ray, tmp_path):
    """fold_batchnorm reaches the tasks: a worker traces the architecture again and folds it."""
    cfg = SweepConfig(
        **{**TINY, "model": "resnet20", "lrs": (0.05, 0.2), "dropouts": (0.0,), "model_kwargs": {"width": 2}}
    )
    path = run_sweep(cfg, tmp_path / "res", progress=False, device="cpu")
    local = featurize_sweep(load_sweep(path), cache=False, device="cpu", fold_batchnorm=True)
    remote = featurize_sweep(load_sweep(path), cache=False, device="cpu", executor="ray", fold_batchnorm=True)
    same_features(local, remote)
    plain = featurize_sweep(load_sweep(path), cache=False, device="cpu")
    assert not torch.allclose(plain.stats, local.stats)
