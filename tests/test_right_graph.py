"""Never a silently wrong graph (issue #34): the topology cache, reparametrised weights, two
checkpoint series in one folder, and models that cannot be traced."""

from __future__ import annotations

import copy
import warnings

import networkx as nx
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, prune, spectral_norm, weight_norm

import dtg_gpu
from dtg_gpu import CheckpointError, TopologyError
from dtg_gpu.topology import channel_topology


def _plain() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def _nx_centrality(layers: list[tuple[torch.Tensor, str]]) -> np.ndarray:
    """NetworkX's eigenvector centrality of a chain of conv/linear weights built independently:
    nodes input channels, then each layer's outputs; edge = Frobenius norm of the slice (a
    linear layer after a flatten of P positions: the norm over its P input columns)."""
    g = nx.Graph()
    offset, width_in = 0, layers[0][0].shape[1]
    g.add_nodes_from(range(width_in))
    for w, kind in layers:
        out = w.shape[0]
        if kind == "conv":
            norms = w.reshape(out, w.shape[1], -1).norm(dim=2)
        else:
            norms = w.reshape(out, width_in, -1).norm(dim=2)
        base = offset + width_in
        for o in range(out):
            for i in range(width_in):
                g.add_edge(offset + i, base + o, weight=float(norms[o, i]))
        offset, width_in = base, out
    c = nx.eigenvector_centrality(g, weight="weight", max_iter=10_000, tol=1e-12)
    return np.array([c[n] for n in sorted(g)])


# ------------------------------------------------------------------ 1. the topology cache
class _Block(nn.Module):
    def __init__(self, residual: bool):
        super().__init__()
        self.residual = residual
        self.a, self.b = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return x + y if self.residual else y


class _Net(nn.Module):
    def __init__(self, residual: bool):
        super().__init__()
        self.stem, self.block, self.fc = nn.Conv2d(3, 4, 3, padding=1), _Block(residual), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.block(self.stem(x)).mean((2, 3)))


def test_a_constructor_flag_that_changes_the_flow_gets_its_own_graph():
    skip, chain = channel_topology(_Net(True)), channel_topology(_Net(False))
    # input 3, stem 4, a 4, b 4, fc 2; the skip joins b's outputs with the stem's
    assert (skip.num_nodes, chain.num_nodes) == (3 + 4 + 4 + 2, 3 + 4 + 4 + 4 + 2)
    assert channel_topology(_Net(True)) is skip  # the cache still serves equal models


def test_runs_that_differ_only_in_dropout_rate_share_one_graph():
    from dtg_gpu.models import build_model

    a = build_model("resnet20", width=4, dropout=0.0)
    b = build_model("resnet20", width=4, dropout=0.5)
    assert channel_topology(a) is channel_topology(b)  # one trace, one batch in featurize


def test_a_class_redefined_in_a_notebook_gets_its_own_graph():
    cell = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
    def forward(self, x):
        return self.b(self.a(x)) {}
"""
    ns1: dict = {"nn": nn}
    exec(cell.format(""), ns1)
    ns2: dict = {"nn": nn}
    exec(cell.format("+ x"), ns2)  # the same name, a skip added
    first, second = channel_topology(ns1["Net"]()), channel_topology(ns2["Net"]())
    assert (first.num_nodes, second.num_nodes) == (12, 8)


def test_training_mode_and_eval_mode_are_different_graphs():
    class Aux(nn.Module):  # as GoogLeNet: an auxiliary head only in training mode
        def __init__(self):
            super().__init__()
            self.a, self.b, self.aux = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 3)

        def forward(self, x):
            h = self.a(x)
            return (self.b(h), self.aux(h)) if self.training else self.b(h)

    m = Aux()
    train = channel_topology(m.train())
    with pytest.warns(dtg_gpu.UncoveredWeightsWarning, match="aux"):
        evaluated = channel_topology(copy.deepcopy(m).eval())
    assert train.num_nodes == 4 + 4 + 2 + 3 and evaluated.num_nodes == 4 + 4 + 2


# ------------------------------------------------------------------ 2, 3. reparametrised weights
def _trained(make):
    torch.manual_seed(0)
    m = make()
    m.train()
    for _ in range(3):  # training-mode passes move spectral norm's u and v away from their init
        m(torch.randn(2, 3, 8, 8))
    m.eval()
    effective = [
        (mod.weight.detach().clone(), "conv" if isinstance(mod, nn.Conv2d) else "linear")
        for mod in m.modules()
        if isinstance(mod, (nn.Conv2d, nn.Linear))
    ]
    return copy.deepcopy(m.state_dict()), effective


def _wrapped(apply):
    """A maker of the plain net with ``apply(module)`` on its conv and its linear layer."""

    def make():
        m = _plain()
        for mod in (m[0], m[3]):
            apply(mod)
        return m

    return make


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_wrapped(parametrizations.spectral_norm), id="parametrizations.spectral_norm"),
        pytest.param(_wrapped(lambda mod: weight_norm(mod, dim=None)), id="weight_norm dim=None"),
        pytest.param(_wrapped(lambda mod: weight_norm(mod, dim=1)), id="weight_norm dim=1"),
        pytest.param(_wrapped(spectral_norm), id="legacy spectral_norm"),
        pytest.param(_wrapped(lambda mod: prune.l1_unstructured(mod, "weight", 0.5)), id="prune"),
    ],
)
def test_reparametrised_weights_are_the_networks_own_at_inference(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # legacy weight_norm is deprecated
        state, effective = _trained(make)
        fresh = make()  # a fresh model: its own u, v, masks are not the checkpoint's
    run = dtg_gpu.Run(model=fresh, checkpoints=[state, state])
    w = run.weights(0)
    for layer, (want, _) in zip(run.topology.layers, effective):
        torch.testing.assert_close(w[layer.param], want, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(w[k], v) for k, v in run.weights(0).items())  # the same at every call
    res = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-10)
    np.testing.assert_allclose(res.centrality[0].numpy(), _nx_centrality(effective), atol=1e-6)


# ------------------------------------------------------------------ 4. two series in one folder
@pytest.mark.parametrize(
    "names, chosen",
    [
        (["model_{}.pt", "ema_{}.pt"], "model_{}.pt"),
        (["epoch{}.pt", "epoch{}_ema.pt"], "epoch{}.pt"),
        (["model_{}.pt", "optimizer_{}.pt"], "model_{}.pt"),
    ],
)
def test_a_second_series_is_never_merged_into_the_first(tmp_path, names, chosen):
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    for t in range(1, 4):
        for n in names:
            state = {k: v + t for k, v in net.state_dict().items()}
            if "optim" in n:
                state = {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
            torch.save(state, tmp_path / n.format(t))
    run = dtg_gpu.Run.from_dir(tmp_path, model=net)
    assert [p.name for p in run.checkpoints] == [chosen.format(t) for t in (1, 2, 3)]
    if "optim" not in names[1]:
        other = dtg_gpu.Run.from_dir(tmp_path, model=net, pattern=names[1].replace("{}", "*"))
        assert [p.name for p in other.checkpoints] == [names[1].format(t) for t in (1, 2, 3)]


def test_two_series_that_cannot_be_told_apart_are_an_error_that_says_how_to_choose(tmp_path):
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    for t in range(1, 3):
        torch.save(net.state_dict(), tmp_path / f"student_{t}.pt")
        torch.save(net.state_dict(), tmp_path / f"actor_{t}.pt")
    with pytest.raises(
        CheckpointError, match=r"2 checkpoint series in one folder \(actor_\*.pt \(2 files\), student_\*.pt"
    ):
        dtg_gpu.Run.from_dir(tmp_path, model=net)
    with pytest.raises(CheckpointError, match="pattern='actor_\\*.pt'"):
        dtg_gpu.Run.from_dir(tmp_path, model=net)
    assert len(dtg_gpu.Run.from_dir(tmp_path, model=net, pattern="student_*.pt")) == 2
    with pytest.raises(CheckpointError, match="no checkpoint file matches pattern 'x_\\*.pt'"):
        dtg_gpu.Run.from_dir(tmp_path, model=net, pattern="x_*.pt")


# ------------------------------------------------------------------ 5. models that cannot be traced
class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return self.b(self.a(x))


def test_an_untraceable_model_is_refused_in_one_line_by_the_cli(tmp_path, capsys, monkeypatch):
    from dtg_gpu.cli.main import main

    folder = tmp_path / "run"
    folder.mkdir()
    for t in (1, 2):
        torch.save(_DataDependent().state_dict(), folder / f"ckpt-{t}.pt")
    (tmp_path / "usermodels.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class DataDependent(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)\n"
        "    def forward(self, x):\n        if x.sum() > 0:\n            x = x * 2\n        return self.b(self.a(x))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["analyze", str(folder), "--model", "usermodels:DataDependent"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DataDependent: cannot be traced" in err and "--registration-order" in err
    assert main(["analyze", str(folder), "--model", "usermodels:DataDependent", "--registration-order", "--json"]) == 0
    cap = capsys.readouterr()
    assert "registration order" in cap.err and '"num_nodes": 9' in cap.out


def test_featurize_keeps_a_nan_row_for_a_run_it_could_not_load(tmp_path, capsys):
    import json

    import pandas as pd

    from dtg_gpu.cli.main import main
    from dtg_gpu.sweeps import SweepConfig, run_sweep

    cfg = SweepConfig(
        model="lenet5", lrs=(0.05, 0.01, 0.02), dropouts=(0.0,), epochs=1, checkpoint_every=10, checkpoint_unit="step"
    )
    out = run_sweep(cfg, tmp_path / "s", progress=False, device="cpu")
    meta = json.loads((out / "run-0001" / "run.json").read_text())
    meta["model"] = "foonet"  # cannot be built: left out at load
    (out / "run-0001" / "run.json").write_text(json.dumps(meta))
    assert main(["featurize", str(out), "-k", "2", "--out", str(tmp_path / "f.csv")]) == 0
    assert "(NaN rows)" in capsys.readouterr().err
    df = pd.read_csv(tmp_path / "f.csv")
    assert sorted(df["run"]) == ["run-0000", "run-0001", "run-0002"]
    bad = df[df["run"] == "run-0001"].iloc[0]
    assert bad.drop("run").isna().all() and df[df["run"] != "run-0001"].drop(columns="run").notna().all().all()


# ------------------------------------------------------------------ layouts people have
def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _states(n=3):
    net = _net()
    return [{k: v + t for k, v in net.state_dict().items()} for t in range(1, n + 1)]


def test_timm_checkpoints_with_last_and_best_left_out_and_the_ema_selectable(tmp_path):
    states = _states()
    for t, sd in enumerate(states):
        ema = {k: v * 0.5 for k, v in sd.items()}
        torch.save(
            {"epoch": t, "arch": "mlp", "state_dict": sd, "state_dict_ema": ema}, tmp_path / f"checkpoint-{t}.pth.tar"
        )
    torch.save({"state_dict": states[-1]}, tmp_path / "last.pth.tar")
    torch.save({"state_dict": states[0]}, tmp_path / "model_best.pth.tar")
    run = dtg_gpu.Run.from_dir(tmp_path, model=_net())
    assert [p.name for p in run.checkpoints] == [f"checkpoint-{t}.pth.tar" for t in range(3)]
    torch.testing.assert_close(run.weights(1)["0.weight"], states[1]["0.weight"])
    ema = dtg_gpu.Run.from_dir(tmp_path, model=_net(), prefix="state_dict_ema.")
    torch.testing.assert_close(ema.weights(1)["0.weight"], states[1]["0.weight"] * 0.5)


def test_accelerate_and_deepspeed_folders_are_runs(tmp_path):
    from safetensors.torch import save_file

    states = _states()
    acc, ds = tmp_path / "acc", tmp_path / "ds"
    for t, sd in enumerate(states, start=1):
        (acc / f"checkpoint_{t * 10}").mkdir(parents=True)
        save_file(sd, str(acc / f"checkpoint_{t * 10}" / "model.safetensors"))
        (ds / f"global_step{t * 100}").mkdir(parents=True)
        torch.save({"module": sd, "ds_version": "0.14"}, ds / f"global_step{t * 100}" / "mp_rank_00_model_states.pt")
    for folder in (acc, ds):
        run = dtg_gpu.Run.from_dir(folder, model=_net())
        assert len(run) == 3
        torch.testing.assert_close(run.weights(2)["2.weight"], states[2]["2.weight"])


def test_lightning_folders_given_one_level_up(tmp_path):
    states = _states()
    logs = tmp_path / "lightning_logs"
    (logs / "version_0" / "checkpoints").mkdir(parents=True)
    for t, sd in enumerate(states):
        torch.save(
            {"state_dict": sd, "epoch": t, "global_step": 10 * t},
            logs / "version_0" / "checkpoints" / f"epoch={t}-step={10 * t}.ckpt",
        )
    for folder in (logs, logs / "version_0"):
        run = dtg_gpu.Run.from_dir(folder, model=_net())
        assert [p.name for p in run.checkpoints] == [f"epoch={t}-step={10 * t}.ckpt" for t in range(3)]
    (logs / "version_1" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"2 Lightning runs \(version_0, version_1\); pass one version_N folder"):
        dtg_gpu.Run.from_dir(logs, model=_net())


def test_peft_adapters_and_torchscript_archives_get_a_message_of_their_own(tmp_path):
    peft = tmp_path / "adapter"
    peft.mkdir()
    (peft / "adapter_config.json").write_text("{}")
    torch.save({"base_model.model.lora_A.weight": torch.zeros(2, 3)}, peft / "adapter_model.bin")
    with pytest.raises(CheckpointError, match="a PEFT adapter .* merge it"):
        dtg_gpu.Run.from_dir(peft, model=_net())
    scripted = tmp_path / "script"
    scripted.mkdir()
    torch.jit.save(torch.jit.script(_net()), scripted / "model-1.pt")
    with pytest.raises(CheckpointError, match="a TorchScript archive .* torch.jit.load"):
        dtg_gpu.analyze(dtg_gpu.Run.from_dir(scripted, model=_net()), device="cpu")


@pytest.mark.parametrize(
    "layer, msg",
    [
        (lambda: nn.Embedding(10, 4), "maps token ids, not channels"),
        (lambda: nn.LSTM(4, 5, batch_first=True), "recurrent layers"),
        (lambda: nn.GRU(4, 5, batch_first=True), "recurrent layers"),
    ],
)
def test_embeddings_and_recurrent_layers_are_refused_saying_why(layer, msg):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.fc = layer(), nn.Linear(4 if "token" in msg else 5, 2)

        def forward(self, x):
            h = self.first(x)
            h = h[0] if isinstance(h, tuple) else h
            return self.fc(h[:, -1])

    with pytest.raises(TopologyError, match=msg):
        channel_topology(Net())
