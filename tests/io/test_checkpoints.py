import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dtg_gpu import CheckpointError, Run, UnsafeCheckpointError, analyze, load_state_dict
from dtg_gpu.models import LeNet5


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.fixture
def lenet_ckpts(tmp_path):
    model = LeNet5()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, tmp_path / "a.safetensors")
    torch.save(sd, tmp_path / "b.pt")
    torch.save({"state_dict": {f"model.{k}": v for k, v in sd.items()}, "epoch": 3}, tmp_path / "c.ckpt")
    return model, sd, tmp_path


def test_all_formats_load_the_same_weights(lenet_ckpts):
    model, sd, tmp = lenet_ckpts
    run = Run(model=model, checkpoints=[tmp / "a.safetensors", tmp / "b.pt", tmp / "c.ckpt", sd])
    for t in range(4):
        w = run.weights(t)
        for k in run.topology.params:
            assert torch.equal(w[k], sd[k])
    res = analyze(run, device="cpu", dtype=torch.float64)
    assert torch.allclose(res.centrality, res.centrality[3].expand_as(res.centrality), atol=1e-12)


def test_code_executing_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump(_Evil(marker), f)
    torch.save({"x": torch.zeros(1), "y": _Evil(marker)}, tmp_path / "evil2.pt")
    for p in (path, tmp_path / "evil2.pt"):
        with pytest.raises(UnsafeCheckpointError, match=str(p.name)):
            load_state_dict(p)
    assert not marker.exists()


def test_truncated_and_missing_files_name_the_file(lenet_ckpts):
    model, sd, tmp = lenet_ckpts
    for name in ("a.safetensors", "b.pt"):
        data = (tmp / name).read_bytes()
        (tmp / f"cut-{name}").write_bytes(data[: len(data) // 2])
        with pytest.raises(CheckpointError, match=f"cut-{name}"):
            load_state_dict(tmp / f"cut-{name}")
    with pytest.raises(CheckpointError, match="nope.pt: checkpoint file not found"):
        load_state_dict(tmp / "nope.pt")
    run = Run(model=model, checkpoints=[sd, tmp / "cut-b.pt"])
    with pytest.raises(CheckpointError, match="cut-b.pt"):
        analyze(run, device="cpu")


def test_shape_mismatch_and_missing_key_name_file_and_parameter(lenet_ckpts):
    model, sd, tmp = lenet_ckpts
    bad = dict(sd)
    bad["features.3.weight"] = torch.zeros(16, 6, 3, 3)
    save_file(bad, tmp / "bad.safetensors")
    run = Run(model=model, checkpoints=[sd, tmp / "bad.safetensors"])
    with pytest.raises(
        CheckpointError, match=r"bad.safetensors: parameter 'features.3.weight' has shape \[16, 6, 3, 3\]"
    ):
        analyze(run, device="cpu")
    missing = {k: v for k, v in sd.items() if k != "classifier.4.weight"}
    run = Run(model=model, checkpoints=[missing], name="r7")
    with pytest.raises(CheckpointError, match="run 'r7' checkpoint 0: parameter 'classifier.4.weight' is missing"):
        analyze(run, device="cpu")


def test_empty_run_and_bad_arguments():
    with pytest.raises(ValueError, match="has no checkpoints"):
        analyze(Run(model=LeNet5(), checkpoints=[]), device="cpu")
    with pytest.raises(TypeError, match="nn.Module"):
        Run(model="lenet", checkpoints=[])
    run = Run(model=LeNet5(), checkpoints=[LeNet5().state_dict()])
    with pytest.raises(ValueError, match="alpha"):
        analyze(run, alpha=0, device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        analyze(run, dtype=torch.float16, device="cpu")
    with pytest.raises(ValueError, match="tol"):
        analyze(run, tol=-1, device="cpu")


def test_from_dir_reads_run_json(tmp_path):
    model = LeNet5(in_channels=1, num_classes=10)
    files = []
    for t in range(3):
        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / f"ckpt-{t + 1:04d}.safetensors"
        )
        files.append(f"ckpt-{t + 1:04d}.safetensors")
    (tmp_path / "run.json").write_text(
        json.dumps(
            {
                "model": "lenet5",
                "model_kwargs": {"in_channels": 1, "num_classes": 10},
                "checkpoints": [{"file": f, "step": i} for i, f in enumerate(files)],
                "final_accuracy": 0.93,
                "status": "complete",
            }
        )
    )
    run = Run.from_dir(tmp_path)
    assert len(run) == 3 and run.final_accuracy == 0.93 and run.name == tmp_path.name
    assert analyze(run, device="cpu").converged.all()
    (tmp_path / files[1]).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        Run.from_dir(tmp_path)
    with pytest.raises(CheckpointError, match="run folder not found"):
        Run.from_dir(tmp_path / "nope")


@pytest.mark.parametrize("size", ["small", "large"])
def test_safetensors_read_whole_or_mapped_give_the_same_tensors(tmp_path, monkeypatch, size):
    """Files up to SMALL_SAFETENSORS are read in one go, larger ones mapped: same tensors,
    same key selection, same error naming a truncated file, either way."""
    import dtg_gpu.io.checkpoints as ck

    if size == "large":
        monkeypatch.setattr(ck, "SMALL_SAFETENSORS", 0)
    sd = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(2).to(torch.bfloat16)}
    save_file(sd, tmp_path / "x.safetensors")
    got = load_state_dict(tmp_path / "x.safetensors")
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) and got[k].dtype == sd[k].dtype for k in sd)
    assert list(load_state_dict(tmp_path / "x.safetensors", keys=["c", "zz", "a"])) == ["c", "a"]
    data = (tmp_path / "x.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 7])
    with pytest.raises(CheckpointError, match="cut.safetensors: not a readable safetensors file"):
        load_state_dict(tmp_path / "cut.safetensors")


def test_a_small_safetensors_file_that_grows_while_read_is_mapped_instead(tmp_path, monkeypatch):
    """The one-read path reads exactly the size ``stat`` gave; a file that is longer by then
    (rewritten between the two) goes through the mapped path, never half-parsed."""
    import safetensors

    sd = {"a": torch.randn(3, 4)}
    path = tmp_path / "x.safetensors"
    save_file(sd, path)
    real_stat, real_safe_open, mapped = Path.stat, safetensors.safe_open, []

    def stale_stat(self, *a, **k):  # the size as it was before the file grew by 8 bytes
        st = real_stat(self, *a, **k)
        return os.stat_result((*st[:6], st.st_size - 8, *st[7:])) if self == path else st

    def spy(name, *a, **k):
        mapped.append(name)
        return real_safe_open(name, *a, **k)

    monkeypatch.setattr(Path, "stat", stale_stat)
    monkeypatch.setattr(safetensors, "safe_open", spy)
    got = load_state_dict(path)
    assert torch.equal(got["a"], sd["a"]) and mapped == [str(path)]
