"""Run folders as people have them: Lightning, Hugging Face Trainer, plain numbered files.
Time order is never lexicographic; where it cannot be told, it is an error."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dtg_gpu import CheckpointError, Run
from dtg_gpu.models import LeNet5


def _states(model, t):
    g = torch.Generator().manual_seed(0)
    return [{k: v + i * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
            for i in range(t)]


def _order(run, states, key="features.0.weight"):
    """Which of ``states`` each checkpoint of ``run`` holds."""
    return [next(i for i, s in enumerate(states) if torch.equal(run.weights(t)[key], s[key]))
            for t in range(len(run))]


def test_numbered_files_in_natural_order(tmp_path):
    model = LeNet5()
    states = _states(model, 4)
    for step, sd in zip([2, 10, 1, 100], [states[1], states[2], states[0], states[3]]):
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / f"ckpt-{step}.safetensors")
    run = Run.from_dir(tmp_path, model=model)
    assert [p.name for p in run.checkpoints] == ["ckpt-1.safetensors", "ckpt-2.safetensors",
                                                 "ckpt-10.safetensors", "ckpt-100.safetensors"]
    assert _order(run, states) == [0, 1, 2, 3]


def test_unnumbered_names_are_an_error(tmp_path):
    model = LeNet5()
    for name in ("best.pt", "final.pt"):
        torch.save(model.state_dict(), tmp_path / name)
    with pytest.raises(CheckpointError, match="time order"):
        Run.from_dir(tmp_path, model=model)


def test_lightning_files_ordered_by_their_own_epoch_and_step(tmp_path):
    model = LeNet5()
    states = _states(model, 3)
    # names that sort wrongly, and a last.ckpt that repeats the final one
    for (epoch, step), sd, name in [((10, 110), states[2], "epoch=10-step=110.ckpt"),
                                    ((2, 30), states[0], "epoch=2-step=30.ckpt"),
                                    ((3, 40), states[1], "zzz.ckpt"),
                                    ((10, 110), states[2], "last.ckpt")]:
        torch.save({"state_dict": {f"model.{k}": v for k, v in sd.items()}, "epoch": epoch,
                    "global_step": step, "optimizer_states": []}, tmp_path / name)
    run = Run.from_dir(tmp_path, model=model)
    assert [p.name for p in run.checkpoints] == ["epoch=2-step=30.ckpt", "zzz.ckpt", "epoch=10-step=110.ckpt"]
    assert _order(run, states) == [0, 1, 2]


def test_huggingface_trainer_folders(tmp_path):
    model = LeNet5()
    states = _states(model, 3)
    layouts = {200: "safetensors", 1000: "sharded", 50: "bin"}
    for (n, kind), sd in zip(sorted(layouts.items()), states):
        d = tmp_path / f"checkpoint-{n}"
        d.mkdir()
        sd = {k: v.contiguous() for k, v in sd.items()}
        if kind == "safetensors":
            save_file(sd, d / "model.safetensors")
        elif kind == "bin":
            torch.save(sd, d / "pytorch_model.bin")
        else:
            keys = sorted(sd)
            half = len(keys) // 2
            shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
            for shard, names in shards.items():
                save_file({k: sd[k] for k in names}, d / shard)
            (d / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {}, "weight_map": {k: s for s, names in shards.items() for k in names}}))
    (tmp_path / "checkpoint-7").mkdir()        # no weights: not a checkpoint
    run = Run.from_dir(tmp_path, model=model)
    assert [p.name for p in run.checkpoints] == ["checkpoint-50", "checkpoint-200", "checkpoint-1000"]
    assert _order(run, states) == [0, 1, 2]


def test_sharded_index_cannot_point_outside(tmp_path):
    model = LeNet5()
    d = tmp_path / "checkpoint-1"
    d.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "outside.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "../outside.safetensors" for k in model.state_dict()}}))
    with pytest.raises(CheckpointError, match="outside"):
        Run.from_dir(tmp_path, model=model)


@pytest.mark.parametrize("key", ["model", "model_state_dict", "state_dict"])
def test_state_dict_nested_as_people_save_it(tmp_path, key):
    model = LeNet5()
    torch.save({key: model.state_dict(), "optimizer": {"lr": 0.1}, "epoch": 3}, tmp_path / "ckpt-1.pt")
    run = Run(model=model, checkpoints=[tmp_path / "ckpt-1.pt"])
    assert torch.equal(run.weights(0)["features.0.weight"], model.state_dict()["features.0.weight"])


class _Holder(torch.nn.Module):
    """A LightningModule-like container: holds the network, defines no forward of its own."""

    def __init__(self):
        super().__init__()
        self.model = LeNet5()

    def training_step(self, batch):   # pragma: no cover - never called
        return self.model(batch).sum()


@pytest.mark.parametrize("wrap", ["compile", "dataparallel", "holder"])
def test_wrapped_models_are_unwrapped(wrap):
    from dtg_gpu import channel_topology

    if wrap == "holder":
        wrapped = _Holder()
        inner = wrapped.model
    else:
        inner = LeNet5()
        wrapped = torch.compile(inner) if wrap == "compile" else torch.nn.DataParallel(inner)
    run = Run(model=wrapped, checkpoints=[wrapped.state_dict()])   # keys carry _orig_mod. / module. / model.
    assert run.model is inner
    assert run.topology.num_nodes == channel_topology(LeNet5()).num_nodes
    assert torch.equal(run.weights(0)["classifier.1.weight"], inner.state_dict()["classifier.1.weight"])


def test_cli_analyzes_a_lightning_folder_with_a_user_model(tmp_path, capsys):
    from dtg_gpu.cli.main import main

    model = LeNet5(in_channels=1)
    for epoch in (0, 1, 2):
        torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                    "epoch": epoch, "global_step": 10 * epoch}, tmp_path / f"epoch={epoch}.ckpt")
    assert main(["analyze", str(tmp_path), "--model", "dtg_gpu.models:LeNet5",
                 "--model-kwargs", '{"in_channels": 1}', "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "237 nodes" in out and "3 checkpoints" in out
    assert main(["analyze", str(tmp_path), "--model", "nosuchpkg:Net", "--device", "cpu"]) == 1
    assert "nosuchpkg" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "dtg_gpu" in capsys.readouterr().out
