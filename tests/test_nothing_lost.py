"""Nothing lost, nothing stale (issue #36): the sweep folder, ``--out`` targets, the feature
cache, ``dtg watch`` and a full disk."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

import dtg_gpu
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep

TINY = SweepConfig(model="lenet5", lrs=(0.05, 0.01), dropouts=(0.0,), epochs=2, checkpoint_every=1)


def _quiet_sweep(cfg, out, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.DTGWarning)
        return run_sweep(cfg, out, progress=False, device="cpu", **kw)


# ------------------------------------------------------------------ 1. the sweep folder
def test_sweep_refuses_a_non_empty_folder_without_its_sweep_json(tmp_path):
    out = tmp_path / "mine"
    (out / "run-0000").mkdir(parents=True)
    (out / "run-0000" / "notes.txt").write_text("my notes")
    (out / "data.csv").write_text("x")
    with pytest.raises(ValueError, match=r"not empty and has no sweep.json of dtg \(data.csv, run-0000\)"):
        run_sweep(TINY, out, progress=False, device="cpu")
    assert (out / "run-0000" / "notes.txt").read_text() == "my notes" and not (out / "sweep.json").exists()


def test_sweep_never_deletes_files_it_did_not_write(tmp_path):
    out = _quiet_sweep(TINY, tmp_path / "s")
    # an unfinished run (run.json gone) with a user's file in it, and a complete run whose
    # run.json has text appended: both are moved aside whole, then trained again
    (out / "run-0000" / "run.json").unlink()
    (out / "run-0000" / "my-analysis.ipynb").write_text("{}")
    with open(out / "run-0001" / "run.json", "a") as f:
        f.write("\n# note\n")
    with pytest.warns(dtg_gpu.DTGWarning, match="moved aside to"):
        run_sweep(TINY, out, progress=False, device="cpu")
    aside = {p.name[:8]: p for p in (out / ".dtg-aside").iterdir()}
    assert set(aside) == {"run-0000", "run-0001"}
    assert (aside["run-0000"] / "my-analysis.ipynb").read_text() == "{}"
    assert (aside["run-0001"] / "run.json").read_text().endswith("# note\n")
    assert len(load_sweep(out)) == 2 and not load_sweep(out).failed


def test_an_unfinished_run_of_dtgs_own_checkpoints_is_cleared_not_moved(tmp_path):
    out = _quiet_sweep(TINY, tmp_path / "s")
    (out / "run-0000" / "run.json").unlink()  # as a sweep killed before the run's end leaves it
    (out / "run-0000" / ".ckpt-0003.safetensors.abc.tmp.safetensors").write_bytes(b"partial")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dtg_gpu.DTGWarning)
        run_sweep(TINY, out, progress=False, device="cpu")
    assert not (out / ".dtg-aside").exists()
    assert sorted(p.name for p in (out / "run-0000").iterdir()) == [
        "ckpt-0001.safetensors",
        "ckpt-0002.safetensors",
        "run.json",
    ]


def test_a_link_in_place_of_a_run_folder_is_moved_aside_not_followed(tmp_path):
    out = _quiet_sweep(TINY, tmp_path / "s")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    import shutil

    shutil.rmtree(out / "run-0001")
    (out / "run-0001").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(dtg_gpu.DTGWarning, match="not a run folder dtg wrote"):
        run_sweep(TINY, out, progress=False, device="cpu")
    assert (elsewhere / "keep.txt").read_text() == "keep" and list(elsewhere.iterdir()) == [elsewhere / "keep.txt"]
    assert (out / "run-0001").is_dir() and not (out / "run-0001").is_symlink()


def test_a_run_of_another_grid_point_is_named_and_left_out(tmp_path):
    out = _quiet_sweep(TINY, tmp_path / "s")
    meta = json.loads((out / "run-0001" / "run.json").read_text())
    meta["lr"] = 0.5
    (out / "run-0001" / "run.json").write_text(json.dumps(meta))
    with pytest.warns(dtg_gpu.DTGWarning, match="not this sweep's"):
        run_sweep(TINY, out, progress=False, device="cpu")
    assert json.loads((out / "run-0001" / "run.json").read_text())["lr"] == 0.5  # untouched
    with pytest.warns(dtg_gpu.FailedRunsWarning):
        runs = load_sweep(out)
    assert "lr=0.5 where the grid has 0.01" in runs.failed["run-0001"] and len(runs) == 1


def test_a_flipped_bit_fails_the_recorded_hash_on_resume(tmp_path):
    out = _quiet_sweep(TINY, tmp_path / "s")
    f = out / "run-0000" / "ckpt-0002.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01  # a weight's bit: same size, still a valid file
    st = f.stat()
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.warns(dtg_gpu.DTGWarning, match="SHA-256 is not the one run.json recorded"):
        run_sweep(TINY, out, progress=False, device="cpu")
    assert (out / "run-0000" / "ckpt-0002.safetensors").read_bytes() != bytes(data)


# ------------------------------------------------------------------ 2, 11. what --out is
def test_out_through_a_symlink_updates_the_target_and_keeps_the_link(tmp_path):
    from dtg_gpu.core.files import atomic_write

    real = tmp_path / "real" / "features.csv"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "features.csv"
    link.symlink_to(real)
    atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new" and link.read_text() == "new"
    dangling = tmp_path / "d.csv"
    dangling.symlink_to(tmp_path / "real" / "later.csv")
    atomic_write(dangling, lambda p: p.write_text("via a writer"))
    assert dangling.is_symlink() and (tmp_path / "real" / "later.csv").read_text() == "via a writer"


def test_out_to_a_fifo_is_written_in_place(tmp_path):
    import threading

    from dtg_gpu.core.files import atomic_write

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    atomic_write(fifo, lambda p: p.write_bytes(b"through a writer"))
    reader.join(10)
    assert got == [b"through a writer"] and fifo.is_fifo()


def test_out_to_a_character_device_is_written_not_replaced(tmp_path):
    import stat

    from dtg_gpu.core.files import atomic_write

    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own, never the real one
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    atomic_write(null, "discarded")
    assert stat.S_ISCHR(null.stat().st_mode) and list(tmp_path.iterdir()) == [null]


def test_out_that_cannot_be_written_fails_before_the_work(tmp_path, capsys):
    from dtg_gpu.cli.main import main
    from dtg_gpu.core.files import atomic_write, check_target

    with pytest.raises(IsADirectoryError, match="is a folder"):
        atomic_write(tmp_path, "x")
    with pytest.raises(ValueError, match="not a file name"):
        check_target("")
    long_name = "f" * 240 + ".csv"  # legal (244 bytes), but NAME.XXXXXXXX.tmp.csv is not
    atomic_write(tmp_path / long_name, "ok")
    assert (tmp_path / long_name).read_text() == "ok" and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(OSError, match="longer than the file system allows"):
        check_target(tmp_path / ("g" * 300))
    # the CLI checks --out before featurising anything
    for bad, msg in ((str(tmp_path), "is a folder"), ("", "not a file name")):
        assert main(["featurize", str(tmp_path / "nosweep"), "--out", bad]) == 1
        assert msg in capsys.readouterr().err


# ------------------------------------------------------------------ 3, 4, 12, 13. the cache
def _stats(out, **kw):
    """The raw statistics of every run of a sweep folder (cached unless cache=False), and
    the runs that failed."""
    from dtg_gpu.workflow import featurize_sweep

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.DTGWarning)
        sf = featurize_sweep(load_sweep(out), **kw)
    return sf.stats, sf.failed


@pytest.fixture(scope="module")
def small_sweep(trained_sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.DTGWarning)
        return trained_sweep(TINY)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_cache_misses_a_checkpoint_replaced_with_its_timestamp_restored(small_sweep, tmp_path):
    import torch

    out = _copy(small_sweep, tmp_path / "s")
    first, _ = _stats(out)
    a, b = out / "run-0000" / "ckpt-0002.safetensors", out / "run-0001" / "ckpt-0002.safetensors"
    assert a.stat().st_size == b.stat().st_size
    st = a.stat()
    a.write_bytes(b.read_bytes())  # another run's checkpoint, same size
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p / touch -r / rsync -a leave it
    assert a.stat().st_mtime_ns == st.st_mtime_ns
    # the key misses (ctime moved); the recorded SHA-256 then names the file instead of
    # letting another run's weights into this run's row
    again, failed = _stats(out)
    assert list(failed) == ["run-0000"] and "SHA-256 is not the one run.json recorded" in failed["run-0000"]
    torch.testing.assert_close(again[1], first[1])  # solved again in a unit of its own: rounding


def test_cache_without_recorded_hashes_still_misses_a_restored_timestamp(small_sweep, tmp_path):
    import torch

    out = _copy(small_sweep, tmp_path / "s")
    for n in ("run-0000", "run-0001"):
        meta = json.loads((out / n / "run.json").read_text())
        for c in meta["checkpoints"]:
            c.pop("sha256")
        (out / n / "run.json").write_text(json.dumps(meta))
    first, _ = _stats(out)
    a, b = out / "run-0000" / "ckpt-0002.safetensors", out / "run-0001" / "ckpt-0002.safetensors"
    st = a.stat()
    a.write_bytes(b.read_bytes())
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    again, failed = _stats(out)
    fresh, _ = _stats(out, cache=False)
    assert not failed and torch.equal(again, fresh) and not torch.equal(again[0], first[0])


def test_two_runs_of_one_name_never_share_an_entry(small_sweep, tmp_path):
    import torch

    out = _copy(small_sweep, tmp_path / "s")
    for n in ("run-0000", "run-0001"):
        meta = json.loads((out / n / "run.json").read_text())
        meta["name"] = "same"
        (out / n / "run.json").write_text(json.dumps(meta))
    runs = load_sweep(out)
    assert [r.name for r in runs] == ["same", "same"]
    cached, _ = _stats(out)
    hit, _ = _stats(out)
    fresh, _ = _stats(out, cache=False)
    assert torch.equal(cached, fresh) and torch.equal(hit, fresh) and not torch.equal(fresh[0], fresh[1])


def test_stale_temporaries_of_a_killed_featurize_are_cleaned(small_sweep, tmp_path):
    import torch

    out = _copy(small_sweep, tmp_path / "s")
    _stats(out, solver=dtg_gpu.SolverOptions(dtype=torch.float64))
    cache = out / ".dtg-cache"
    entry = next(cache.iterdir())
    old = entry / ".abc.safetensors.1234abcd.tmp.safetensors"
    new = entry / ".abc.safetensors.5678abcd.tmp.safetensors"
    old.write_bytes(b"half")
    new.write_bytes(b"being written now")
    os.utime(old, (1, 1))
    _stats(out)  # new entries (float32 now): the cache is written
    assert not old.exists() and new.exists()


def test_a_cache_folder_linking_out_of_the_sweep_is_not_used(small_sweep, tmp_path):
    import torch

    out = _copy(small_sweep, tmp_path / "s")
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / ".dtg-cache").symlink_to(outside, target_is_directory=True)
    from dtg_gpu.workflow import featurize_sweep

    with pytest.warns(dtg_gpu.DTGWarning, match="leads outside the sweep folder"):
        X = featurize_sweep(load_sweep(out)).stats
    assert list(outside.iterdir()) == []
    assert torch.equal(X, _stats(out, cache=False)[0])


# ------------------------------------------------------------------ 5, 6, 8, 10. dtg watch
def _live(sweep, tmp_path):
    out = _copy(sweep, tmp_path / "live")
    (out / "run-0001" / "run.json").unlink()  # still training
    return out


def test_watch_refuses_a_predictor_of_another_architecture(small_sweep, tmp_path, capsys):
    from dtg_gpu.cli.main import main

    vgg = _quiet_sweep(
        SweepConfig(model="vgg11", lrs=(0.05, 0.01), dropouts=(0.0,), epochs=2, model_kwargs={"width": 1 / 16}),
        tmp_path / "vgg",
    )
    # two epochs of a tiny VGG may leave both runs at chance (thread count decides): give the
    # predictor two labels to learn, whatever the training did
    meta = json.loads((vgg / "run-0000" / "run.json").read_text())
    (vgg / "run-0000" / "run.json").write_text(json.dumps({**meta, "final_accuracy": 0.9}))
    pred = tmp_path / "vgg.safetensors"
    assert main(["train", str(vgg), "-k", "1", "--out", str(pred), "--epochs", "5"]) == 0
    live = _live(small_sweep, tmp_path)
    capsys.readouterr()
    assert main(["watch", str(live), "--predictor", str(pred), "--once", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    running = next(x for x in lines if x["run"] == "run-0001")
    assert running["verdict"] == "failed" and "another architecture" in running["error"]
    assert running["p_sufficient"] is None


def test_watch_sees_a_run_restarted_into_its_folder(small_sweep, tmp_path):
    from dtg_gpu.workflow.watch import SweepWatcher

    live = _live(small_sweep, tmp_path)
    w = SweepWatcher(live)
    w.poll()
    before = list(w._seen["run-0001"].records)
    # the run restarts: new files under the old names, same count
    for i in (1, 2):
        src = live / "run-0000" / f"ckpt-000{i}.safetensors"
        (live / "run-0001" / f"ckpt-000{i}.safetensors").write_bytes(src.read_bytes())
    w.poll()
    after = w._seen["run-0001"].records
    assert len(after) == 2 and after[-1]["dtg"] != before[-1]["dtg"]


def test_watch_judges_from_readable_checkpoints_when_the_newest_is_half_written(small_sweep, tmp_path):
    from dtg_gpu.workflow.watch import SweepWatcher

    live = _live(small_sweep, tmp_path)
    full = (live / "run-0001" / "ckpt-0002.safetensors").read_bytes()
    (live / "run-0001" / "ckpt-0002.safetensors").write_bytes(full[: len(full) // 2])
    w = SweepWatcher(live)
    v = {x.run: x for x in w.poll()}
    assert v["run-0001"].verdict == "wait" and v["run-0001"].checkpoints == 1
    assert "ckpt-0002" in (v["run-0001"].error or "")
    (live / "run-0001" / "ckpt-0002.safetensors").write_bytes(full)  # the write completes
    v = {x.run: x for x in w.poll()}
    assert v["run-0001"].checkpoints == 2 and v["run-0001"].error is None


@pytest.mark.parametrize("interval", ["inf", "1e300", "nan", "0", "-1"])
def test_watch_interval_must_be_a_sane_number_of_seconds(small_sweep, interval, capsys):
    from dtg_gpu.cli.main import main

    assert main(["watch", str(small_sweep), "--interval", interval, "--once"]) == 1
    assert "--interval must be a number of seconds in (0, 604800]" in capsys.readouterr().err


# ------------------------------------------------------------------ 7. a full disk
_FULL_DISK = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
limit = int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from dtg_gpu.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _dtg_on_a_full_disk(limit, *args):
    import subprocess
    import sys

    env = {**os.environ, "DTG_GPU_NATIVE": "0"}
    return subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(limit), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_a_full_disk_is_one_line_naming_the_file_and_loses_nothing(small_sweep, tmp_path):
    out = _copy(small_sweep, tmp_path / "s")
    csv = tmp_path / "features.csv"
    csv.write_text("the previous features\n")
    r = _dtg_on_a_full_disk(64, "featurize", out, "-k", "2", "--out", csv)
    # files may not grow past 64 bytes: the cache entries fail first (a warning, and the work
    # goes on), then the CSV cannot be written: one line naming it, the old file kept
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "feature cache" in r.stderr and "cannot be written" in r.stderr
    assert f"{csv}: cannot be written" in r.stderr and csv.read_text() == "the previous features\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".features.csv")]
    pred = tmp_path / "p.safetensors"
    r = _dtg_on_a_full_disk(64, "train", out, "-k", "2", "--out", pred, "--epochs", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr and f"{pred}: cannot be written" in r.stderr
    assert not pred.exists()


def test_a_full_disk_while_training_names_the_checkpoint(tmp_path):
    # sweep.json (< 8 KB) is written, the first checkpoint (~250 KB) is not
    r = _dtg_on_a_full_disk(
        8192, "sweep", "--lr", "0.01", "--dropout", "0", "--epochs", "1", "--out", tmp_path / "s", "--quiet"
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "ckpt-0001.safetensors: cannot be written" in r.stderr
    assert not (tmp_path / "s" / "run-0000" / "run.json").exists()


# ------------------------------------------------------------------ 9, 14, 15. one line each
def test_ray_at_a_dead_address_fails_within_seconds_naming_it():
    import socket
    import time

    pytest.importorskip("ray")
    from dtg_gpu.core.ray import check_reachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"no Ray cluster answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match="ray://127.0.0.1"):
        check_reachable(f"ray://127.0.0.1:{port}")
    assert time.monotonic() - started < 15
    check_reachable("auto")  # left to Ray


def test_out_of_memory_is_one_line_with_what_to_lower(small_sweep, tmp_path, monkeypatch, capsys):
    from dtg_gpu.cli.main import main

    def no_memory(*a, **k):
        raise MemoryError()

    monkeypatch.setattr("dtg_gpu.analysis.extract_features", no_memory)
    assert main(["featurize", str(small_sweep), "-k", "1", "--out", str(tmp_path / "f.csv")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dtg featurize: error: out of memory; use --device cpu") and err.count("\n") == 1

    def torch_oom(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory: 1 TB")

    monkeypatch.setattr("dtg_gpu.analysis.extract_features", torch_oom)
    assert main(["featurize", str(small_sweep), "-k", "1", "--out", str(tmp_path / "f.csv")]) == 1
    assert "can't allocate memory: 1 TB; use --device cpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    "device, msg", [("meta", "a meta device holds no numbers"), ("mps", "MPS (Apple GPU) is not available")]
)
def test_devices_that_cannot_solve_are_refused_the_same_way_cached_or_not(small_sweep, tmp_path, device, msg, capsys):
    import torch

    from dtg_gpu.cli.main import main

    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    out = _copy(small_sweep, tmp_path / "s")
    for _ in range(2):  # the second run would be all cache hits
        assert main(["featurize", str(out), "-k", "2", "--out", str(tmp_path / "f.csv")]) == 0
        assert main(["featurize", str(out), "-k", "2", "--out", str(tmp_path / "f.csv"), "--device", device]) == 1
        assert msg in capsys.readouterr().err


def test_predict_names_a_short_run_and_judges_the_others(small_sweep, tmp_path, capsys):
    from dtg_gpu.cli.main import main

    pred = tmp_path / "p.safetensors"
    assert main(["train", str(small_sweep), "-k", "2", "--out", str(pred), "--epochs", "2"]) == 0
    short = _copy(small_sweep / "run-0001", tmp_path / "short")
    meta = json.loads((short / "run.json").read_text())
    meta["checkpoints"] = meta["checkpoints"][:1]
    meta["name"] = "short"
    (short / "run.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["predict", str(pred), str(small_sweep / "run-0000"), str(short)]) == 1  # one run failed
    cap = capsys.readouterr()
    rows = dict(line.split("\t", 1) for line in cap.out.splitlines())
    assert "nan" not in rows["run-0000"] and "failed" in rows["short"]
    assert "short: has 1 checkpoint(s); this predictor reads the first 2" in cap.err


def test_a_meta_tensor_in_a_checkpoint_is_a_checkpoint_error(tmp_path):
    import torch
    from torch import nn

    net = nn.Sequential(nn.Linear(3, 2))
    state = {k: torch.empty(v.shape, device="meta") for k, v in net.state_dict().items()}
    with pytest.raises(dtg_gpu.CheckpointError, match="is a meta tensor"):
        dtg_gpu.analyze(dtg_gpu.Run(model=net, checkpoints=[state]), device="cpu")


def test_watch_solves_every_runs_new_checkpoints_in_batches(small_sweep, tmp_path, monkeypatch):
    from dtg_gpu import analysis
    from dtg_gpu.early_stopping import StoppingRule, run_records
    from dtg_gpu.workflow.watch import SweepWatcher

    live = _live(small_sweep, tmp_path)
    calls = []
    real = analysis.extract_features

    def counted(runs, *a, **kw):
        calls.append(len(runs))
        return real(runs, *a, **kw)

    monkeypatch.setattr(analysis, "extract_features", counted)
    w = SweepWatcher(live)
    w.poll()
    assert calls == [2]  # both runs (2 checkpoints each) in one solve, not one solve per run
    rec = w._seen["run-0000"].records
    ref = run_records(load_sweep(small_sweep)[0])
    np.testing.assert_allclose([r["dtg"] for r in rec], [r["dtg"] for r in ref], rtol=1e-5)
    # weight statistics only where the rule reads them (they are half a pass's time)
    assert rec[0]["weight_stats"] is None
    w2 = SweepWatcher(live, rule=StoppingRule(features="dtg+weight_stats"))
    w2.poll()
    assert w2._seen["run-0000"].records[0]["weight_stats"] == pytest.approx(ref[0]["weight_stats"])
