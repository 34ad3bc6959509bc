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
    return [{k: v + i * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()} for i in range(t)]


def _order(run, states, key="features.0.weight"):
    """Which of ``states`` each checkpoint of ``run`` holds."""
    return [next(i for i, s in enumerate(states) if torch.equal(run.weights(t)[key], s[key])) for t in range(len(run))]


def test_numbered_files_in_natural_order(tmp_path):
    model = LeNet5()
    states = _states(model, 4)
    for step, sd in zip([2, 10, 1, 100], [states[1], states[2], states[0], states[3]]):
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / f"ckpt-{step}.safetensors")
    run = Run.from_dir(tmp_path, model=model)
    assert [p.name for p in run.checkpoints] == [
        "ckpt-1.safetensors",
        "ckpt-2.safetensors",
        "ckpt-10.safetensors",
        "ckpt-100.safetensors",
    ]
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
    for (epoch, step), sd, name in [
        ((10, 110), states[2], "epoch=10-step=110.ckpt"),
        ((2, 30), states[0], "epoch=2-step=30.ckpt"),
        ((3, 40), states[1], "zzz.ckpt"),
        ((10, 110), states[2], "last.ckpt"),
    ]:
        torch.save(
            {
                "state_dict": {f"model.{k}": v for k, v in sd.items()},
                "epoch": epoch,
                "global_step": step,
                "optimizer_states": [],
            },
            tmp_path / name,
        )
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
            (d / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": {k: s for s, names in shards.items() for k in names}})
            )
    (tmp_path / "checkpoint-7").mkdir()  # no weights: not a checkpoint
    run = Run.from_dir(tmp_path, model=model)
    assert [p.name for p in run.checkpoints] == ["checkpoint-50", "checkpoint-200", "checkpoint-1000"]
    assert _order(run, states) == [0, 1, 2]


def test_sharded_index_cannot_point_outside(tmp_path):
    model = LeNet5()
    d = tmp_path / "checkpoint-1"
    d.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "outside.safetensors")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: "../outside.safetensors" for k in model.state_dict()}})
    )
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

    def training_step(self, batch):  # pragma: no cover - never called
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
    run = Run(model=wrapped, checkpoints=[wrapped.state_dict()])  # keys carry _orig_mod. / module. / model.
    assert run.model is inner
    assert run.topology.num_nodes == channel_topology(LeNet5()).num_nodes
    assert torch.equal(run.weights(0)["classifier.1.weight"], inner.state_dict()["classifier.1.weight"])


def test_cli_analyzes_a_lightning_folder_with_a_user_model(tmp_path, capsys):
    from dtg_gpu.cli.main import main

    model = LeNet5(in_channels=1)
    for epoch in (0, 1, 2):
        torch.save(
            {
                "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "epoch": epoch,
                "global_step": 10 * epoch,
            },
            tmp_path / f"epoch={epoch}.ckpt",
        )
    assert (
        main(
            [
                "analyze",
                str(tmp_path),
                "--model",
                "dtg_gpu.models:LeNet5",
                "--model-kwargs",
                '{"in_channels": 1}',
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "237 nodes" in out and "3 checkpoints" in out
    assert main(["analyze", str(tmp_path), "--model", "nosuchpkg:Net", "--device", "cpu"]) == 1
    assert "nosuchpkg" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "dtg_gpu" in capsys.readouterr().out


def test_tied_weights_stored_once_by_safetensors_save_model(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_model

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Linear(4, 4, bias=False)
            self.mid = torch.nn.Linear(4, 4)
            self.dec = torch.nn.Linear(4, 4, bias=False)
            self.dec.weight = self.enc.weight

        def forward(self, x):
            return self.dec(torch.relu(self.mid(self.enc(x))))

    net = Tied()
    save_model(net, str(tmp_path / "ckpt-1.safetensors"))
    with safe_open(str(tmp_path / "ckpt-1.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert len({"enc.weight", "dec.weight"} & stored) == 1  # de-duplicated
    run = Run(model=net, checkpoints=[tmp_path / "ckpt-1.safetensors"])
    w = run.weights(0)
    assert torch.equal(w["enc.weight"], net.enc.weight.detach()) and torch.equal(w["dec.weight"], w["enc.weight"])
    import dtg_gpu

    assert dtg_gpu.analyze(run, device="cpu").converged.all()


def test_files_written_by_pytorch_lightning_itself(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    import dtg_gpu

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = LeNet5(in_channels=1)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 1, 32, 32), torch.randint(0, 10, (64,)))
    module = Module()
    saved = []

    class Keep(pl.Callback):  # the weights at each save, to compare with what is read back
        def on_train_epoch_end(self, trainer, pl_module):
            saved.append({k: v.detach().clone() for k, v in pl_module.net.state_dict().items()})

    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, save_last=True)
    trainer = pl.Trainer(
        max_epochs=11,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Keep(), ckpt],
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=32))
    files = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert "last.ckpt" in files and "epoch=10-step=22.ckpt" in files and "epoch=2-step=6.ckpt" in files
    run = Run.from_dir(tmp_path, model=LeNet5(in_channels=1))
    assert [p.name for p in run.checkpoints] == [f"epoch={e}-step={2 * (e + 1)}.ckpt" for e in range(11)]
    for t in (0, 2, 10):  # natural epoch order (10 after 2), last.ckpt not repeated
        assert torch.equal(run.weights(t)["features.0.weight"], saved[t]["features.0.weight"])
    assert dtg_gpu.analyze(run, device="cpu").converged.all()


def test_cli_featurize_and_train_a_folder_of_your_own_run_folders(tmp_path, capsys):
    import json

    from dtg_gpu.cli.main import main

    root = tmp_path / "mine"
    for r in range(4):
        d = root / f"trial_{r * 5}"  # natural order: trial_5 before trial_10
        d.mkdir(parents=True)
        states = _states(LeNet5(in_channels=1), 3)
        for epoch, sd in enumerate(states):
            torch.save(
                {"state_dict": {f"model.{k}": v for k, v in sd.items()}, "epoch": epoch, "global_step": 10 * epoch},
                d / f"epoch={epoch}.ckpt",
            )
        (d / "run.json").write_text(json.dumps({"final_accuracy": 0.5 + 0.1 * r}))
    (root / ".dtg-cache").mkdir()  # hidden folders are not runs
    (root / "notes").mkdir()  # nor folders without checkpoints
    args = ["--model", "dtg_gpu.models:LeNet5", "--model-kwargs", '{"in_channels": 1}', "--device", "cpu"]
    assert main(["featurize", str(root), "--out", str(tmp_path / "f.csv"), *args]) == 0
    lines = (tmp_path / "f.csv").read_text().splitlines()
    assert [l.split(",")[0] for l in lines[1:]] == ["trial_0", "trial_5", "trial_10", "trial_15"]
    assert lines[1].split(",")[1] == "0.5"
    assert main(["train", str(root), "--out", str(tmp_path / "p.safetensors"), "--epochs", "5", *args]) == 0
    assert (tmp_path / "p.safetensors").is_file()
    capsys.readouterr()
    assert main(["featurize", str(root), "--out", str(tmp_path / "g.csv"), "--device", "cpu"]) == 1
    assert "no sweep.json" in capsys.readouterr().err
