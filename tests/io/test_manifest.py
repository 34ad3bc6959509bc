"""run.json in one module: what dtg sweep writes (RunManifest), what the library reads
(check_run_json) and how a run folder is judged (run_state)."""

import json

import pytest

from dtg_gpu.exceptions import CheckpointError
from dtg_gpu.io.manifest import RunManifest, check_run_json, read_manifest, run_state


def _manifest(**kw):
    fields = dict(
        name="run-0000", model="lenet5", model_kwargs={}, dataset="digits", lr=0.1, dropout=0.0, seed=0,
        epochs=1, optimizer="sgd", momentum=0.9, weight_decay=0.0, lr_schedule="constant", batch_size=64,
        checkpoint_every=1, checkpoint_unit="epoch", checkpoints=[], final_accuracy=0.5, test_loss=1.0,
        status="complete",
    )  # fmt: skip
    return RunManifest(**{**fields, **kw})


def test_the_written_fields_and_their_order():
    d = _manifest().to_dict()
    assert list(d)[:3] == ["name", "model", "model_kwargs"] and list(d)[-3:] == ["status", "complete", "seconds"]
    assert d["complete"] is True and len(d) == 21


def test_a_trained_run_json_is_a_run_manifest(trained_sweep):
    from dtg_gpu.sweeps import SweepConfig

    folder = trained_sweep(SweepConfig(lrs=(0.1,), dropouts=(0.0,), epochs=1, checkpoint_every=1)) / "run-0000"
    meta = read_manifest(folder / "run.json")
    assert list(meta) == list(_manifest().to_dict())  # every field, in the dataclass's order
    assert RunManifest(**meta).to_dict() == meta
    assert run_state(folder) == "complete" and run_state(folder, verify=True) == "complete"
    ckpt = folder / meta["checkpoints"][0]["file"]
    ckpt.write_bytes(ckpt.read_bytes()[:-1])
    assert "bytes, run.json recorded" in run_state(folder)


def test_run_state_names_what_is_wrong(tmp_path):
    assert run_state(tmp_path) == "unfinished"
    (tmp_path / "run.json").write_text(json.dumps({"complete": False}))
    assert "does not say the run is complete" in run_state(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"complete": True, "checkpoints": [{"file": "../x"}]}))
    assert "run.json" in run_state(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    assert "damaged" in run_state(tmp_path)


def test_check_run_json_refuses_fields_the_library_reads_wrongly_typed(tmp_path):
    path = tmp_path / "run.json"
    assert check_run_json({"model": "lenet5", "model_kwargs": None}, path)["model_kwargs"] == {}
    for bad, field in (
        (["x"], "JSON object"),
        ({"model": 3}, "'model'"),
        ({"final_accuracy": "high"}, "'final_accuracy'"),
    ):
        with pytest.raises(CheckpointError, match=field):
            check_run_json(bad, path)


def test_sweep_json_is_a_sweep_manifest(trained_sweep):
    from dtg_gpu.io.manifest import SweepManifest
    from dtg_gpu.sweeps import SweepConfig

    folder = trained_sweep(SweepConfig(lrs=(0.1,), dropouts=(0.0,), epochs=1, checkpoint_every=1))
    meta = read_manifest(folder / "sweep.json")
    assert list(meta) == ["format", "config", "runs", "grid"] and meta["format"] == "dtg_gpu.sweep/1"
    assert SweepManifest(**meta).to_dict() == meta and meta["runs"] == ["run-0000"]
