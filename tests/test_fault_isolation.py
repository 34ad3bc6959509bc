"""One bad run never stops a sweep: it is named, its row is NaN, it is left out of training,
and the rest is computed; ``strict`` turns it into an error."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from conftest import SMALL_SWEEP
from safetensors.torch import load_file, save_file

import dtg_gpu
from dtg_gpu import CheckpointError, FailedRunsWarning
from dtg_gpu.cli.main import main
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep
from dtg_gpu.workflow import compare, featurize_sweep
from dtg_gpu.workflow.demo import demo_config, run_demo

CFG = SweepConfig(**SMALL_SWEEP)


@pytest.fixture(scope="module")
def clean_sweep(trained_sweep):
    return trained_sweep(CFG)


def _files(folder):
    return [folder / c["file"] for c in json.loads((folder / "run.json").read_text())["checkpoints"]]


def tamper(sweep):
    """run-0002: a corrupt checkpoint (same size); run-0003: diverged but finite (|w| ~ 1e17);
    run-0004: complete, but its run.json names a model that does not exist."""
    bad = _files(sweep / "run-0002")[1]
    data = bytearray(bad.read_bytes())
    data[:8] = b"\xff" * 8  # the header length: corrupt, same size
    bad.write_bytes(bytes(data))
    for f in _files(sweep / "run-0003"):
        save_file({k: v * 1e17 for k, v in load_file(f).items()}, str(f))
    meta = json.loads((sweep / "run-0003" / "run.json").read_text())
    for c in meta["checkpoints"]:  # as training itself records a diverging run's files
        c["bytes"] = (sweep / "run-0003" / c["file"]).stat().st_size
        c["sha256"] = hashlib.sha256((sweep / "run-0003" / c["file"]).read_bytes()).hexdigest()
    (sweep / "run-0003" / "run.json").write_text(json.dumps(meta))
    meta = json.loads((sweep / "run-0004" / "run.json").read_text())
    meta["model"] = "foonet"
    (sweep / "run-0004" / "run.json").write_text(json.dumps(meta))
    meta = json.loads((sweep / "run-0005" / "run.json").read_text())
    meta["status"] = "diverged"  # as training records a run whose loss became NaN
    (sweep / "run-0005" / "run.json").write_text(json.dumps(meta))
    return bad


@pytest.fixture
def bad_sweep(clean_sweep, tmp_path):
    out = tmp_path / "sweep"
    shutil.copytree(clean_sweep, out)
    tamper(out)
    return out


def test_load_sweep_names_and_skips_an_unreadable_run(bad_sweep):
    with pytest.warns(FailedRunsWarning, match="run-0004.*foonet") as rec:
        runs = load_sweep(bad_sweep)
    assert [r.name for r in runs] == [f"run-{i:04d}" for i in range(12) if i != 4]
    assert set(runs.failed) == {"run-0004"}
    assert rec[0].message.failures == runs.failed
    with pytest.raises(CheckpointError, match="foonet"):
        load_sweep(bad_sweep, strict=True)


def test_featurize_isolates_a_corrupt_checkpoint(bad_sweep, clean_sweep):
    with pytest.warns(FailedRunsWarning):
        runs = load_sweep(bad_sweep)
    with pytest.warns(FailedRunsWarning, match=r"run-0002.*ckpt") as rec:
        X = dtg_gpu.featurize(runs, timesteps=3, device="cpu", features="spec")  # the scale-free centrality
    assert list(rec[0].message.failures) == ["run-0002"]
    names = [r.name for r in runs]
    i_bad = names.index("run-0002")
    assert torch.isnan(X[i_bad]).all()
    good = [i for i in range(len(runs)) if i != i_bad]
    assert torch.isfinite(X[good]).all()  # the diverged-but-finite run solves like the others
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FailedRunsWarning)
        clean = {r.name: r for r in load_sweep(clean_sweep)}
    ref = dtg_gpu.featurize([clean[n] for n in names if n != "run-0002"], timesteps=3, device="cpu", features="spec")
    # scale-free: the run multiplied by 1e17 has the features of the clean run
    np.testing.assert_allclose(X[good].numpy(), ref.numpy(), atol=2e-4, rtol=1e-3)
    with pytest.raises(CheckpointError, match="run-0002"):
        dtg_gpu.featurize(runs, timesteps=3, device="cpu", strict=True)


def test_compare_leaves_failed_runs_out(bad_sweep):
    with pytest.warns(FailedRunsWarning):
        runs = load_sweep(bad_sweep)
        sf = featurize_sweep(runs, device="cpu")
    assert set(sf.failed) == {"run-0002", "run-0004"}
    assert sf.usable.tolist() == [r.name != "run-0002" for r in sf.runs]
    rows = compare(sf, [2], ["dtg", "weight_stats"], repeats=2)
    assert {r["features"] for r in rows} == {"dtg", "weight_stats"}
    assert all(np.isfinite(r["scores"]["accuracy"]["mean"]) for r in rows)


def test_cli_goes_on_past_bad_runs_and_strict_stops(bad_sweep, tmp_path, capsys):
    csv = tmp_path / "f.csv"
    assert main(["featurize", str(bad_sweep), "--timesteps", "2", "--out", str(csv), "--device", "cpu"]) == 0
    lines = csv.read_text().splitlines()
    assert len(lines) == 1 + 12  # every run, those that could not be read as NaN rows
    for name in ("run-0002", "run-0004"):  # unreadable checkpoint; run.json naming no model
        bad_row = next(line for line in lines if line.startswith(f"{name},"))
        assert bad_row.split(",")[2] == ""  # NaN features, written as empty fields
    err = capsys.readouterr().err
    assert "run-0002" in err and "run-0004" in err
    assert (
        main(["featurize", str(bad_sweep), "--timesteps", "2", "--out", str(csv), "--strict", "--device", "cpu"]) == 1
    )
    assert "foonet" in capsys.readouterr().err
    pred = tmp_path / "p.safetensors"
    assert (
        main(["train", str(bad_sweep), "--timesteps", "2", "--out", str(pred), "--epochs", "20", "--device", "cpu"])
        == 0
    )
    assert "trained on 10 runs" in capsys.readouterr().out
    assert main(["evaluate", str(bad_sweep), "--timesteps", "2", "--repeats", "2", "--device", "cpu"]) == 0
    assert "precision" in capsys.readouterr().out
    assert (
        main(
            [
                "predict",
                str(pred),
                str(bad_sweep / "run-0001"),
                str(bad_sweep / "run-0002"),
                str(bad_sweep / "run-0004"),
                "--device",
                "cpu",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("run-0001\tP(sufficient)=0.") or out[0].startswith("run-0001\tP(sufficient)=1.")
    assert "run-0002" in out[1] and out[1].endswith("failed")
    assert "run-0004" in out[2] and "failed: " in out[2]


@pytest.mark.slow
def test_demo_finishes_on_a_sweep_with_bad_runs(tmp_path, monkeypatch):
    out = tmp_path / "demo"
    run_sweep(demo_config(quick=True), out / "sweep", progress=False, device="cpu")
    tamper(out / "sweep")
    # the report's side: the runs stay bad (a resumed sweep would retrain two of them,
    # tested in test_resumed_sweep_retrains_damaged_runs_and_keeps_foreign_ones)
    monkeypatch.setattr("dtg_gpu.workflow.demo.run_sweep", lambda *a, **k: out / "sweep")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.DTGWarning)
        results = run_demo(out, quick=True, device="cpu", progress=False, repeats=2, echo=lambda *a: None)
    assert set(results["failed_runs"]) == {"run-0002", "run-0004"}
    page = (out / "report" / "index.html").read_text()
    assert "Runs left out (2)" in page and "run-0002" in page and "foonet" in page
    start = page.index('<table class="sortable">')
    table = page[start : page.index("</table>", start)]
    assert table.count("<tr") == 1 + 15  # header + every run that loaded
    assert table.count('<tr class="out">') == 1  # run-0002: loaded, but unreadable
    assert '<tr class="div"><td data-v="run-0005">' in table  # the diverged run is marked
    ks = results["early_k"], results["timesteps"]
    assert f"P(sufficient) k={ks[0]}" in table and f"verdict k={ks[0]}" in table
    assert f"P(sufficient) k={ks[1]}" in table and f"verdict k={ks[1]}" not in table  # k = T is not early
    assert "addEventListener" in page
    with pytest.raises(CheckpointError):
        run_demo(out, quick=True, device="cpu", progress=False, repeats=2, echo=lambda *a: None, strict=True)


def test_resumed_sweep_retrains_damaged_runs_and_keeps_foreign_ones(tmp_path):
    out = tmp_path / "sweep"
    cfg = demo_config(quick=True)
    run_sweep(cfg, out, progress=False, device="cpu")
    before = {n: (out / n / "run.json").read_text() for n in ("run-0002", "run-0003", "run-0004", "run-0006")}
    tamper(out)
    with pytest.warns(dtg_gpu.DTGWarning) as caught:
        run_sweep(cfg, out, progress=False, device="cpu")
    said = " ".join(str(w.message) for w in caught)
    # same-size corruption fails its recorded SHA-256: moved aside, retrained
    aside = sorted(p.name.rsplit("-", 1)[0] for p in (out / ".dtg-aside").iterdir())
    assert [a[:8] for a in aside] == ["run-0002"] and "SHA-256" in said
    for n in ("run-0002", "run-0003"):
        assert json.loads((out / n / "run.json").read_text())["complete"] is True
    # the folders moved aside keep every file as it was
    moved = next(p for p in (out / ".dtg-aside").iterdir() if p.name.startswith("run-0002"))
    assert len(list(moved.glob("ckpt-*.safetensors"))) == len(list((out / "run-0002").glob("ckpt-*.safetensors")))
    # run-0004 names another model: kept as it is, named, and left out by load_sweep
    assert "foonet" in (out / "run-0004" / "run.json").read_text() and "not this sweep's" in said
    assert (out / "run-0006" / "run.json").read_text() == before["run-0006"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.DTGWarning)
        runs = load_sweep(out)
    assert set(runs.failed) == {"run-0004"} and "model='foonet' where the grid has 'lenet5'" in runs.failed["run-0004"]
