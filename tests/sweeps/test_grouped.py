import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dtg_gpu.models import build_model
from dtg_gpu.sweeps import SweepConfig, run_sweep
from dtg_gpu.sweeps.grouped import GroupedSequential, sequential_layers

ARCHS = [("lenet5", {}), ("vgg11", {"width": 0.125})]


def _models(name, kw, seeds, dropout=0.0, in_channels=1):
    out = []
    for s in seeds:
        torch.manual_seed(s)
        out.append(build_model(name, num_classes=10, in_channels=in_channels, dropout=dropout, **kw))
    return out


@pytest.mark.parametrize("name,kw", ARCHS)
def test_grouped_forward_and_gradients_match_each_model(name, kw, device):
    models = [m.to(device) for m in _models(name, kw, [0, 1, 2])]
    x = torch.randn(7, 1, 32, 32, device=device)
    net = GroupedSequential(models, [0.0, 0.0, 0.0], example=x)
    out = net.forward(x, train=True)  # dropout 0: training forward is deterministic
    assert out.shape == (3, 7, 10)
    grads = torch.autograd.grad((out**2).sum(), list(net.params.values()))
    for j, m in enumerate(models):
        m.train()
        ref = m(x)
        torch.testing.assert_close(out[j], ref, rtol=1e-5, atol=1e-5)
        (ref**2).sum().backward()
        for g, (key, _p) in zip(grads, net.params.items()):
            torch.testing.assert_close(g[j], dict(m.named_parameters())[key].grad, rtol=1e-4, atol=1e-5)
        assert net.state(j).keys() == m.state_dict().keys()


def test_grouped_dropout_uses_each_runs_rate():
    def probe():  # conv = identity, then dropout, then identity linear: output = x * mask / keep
        net = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(256, 256))
        with torch.no_grad():
            net[0].weight.fill_(1.0), net[0].bias.zero_()
            net[3].weight.copy_(torch.eye(256)), net[3].bias.zero_()
        return net

    rates = [0.0, 0.5, 0.9]
    x = torch.rand(200, 1, 16, 16) + 1.0
    net = GroupedSequential([probe() for _ in rates], rates, example=x)
    torch.manual_seed(0)
    out = net.forward(x, train=True).detach()
    flat = x.reshape(200, -1)
    for j, p in enumerate(rates):
        dropped = out[j] == 0
        assert dropped.float().mean().item() == pytest.approx(p, abs=0.01)
        torch.testing.assert_close(out[j][~dropped], (flat / (1 - p))[~dropped])
    torch.testing.assert_close(net.forward(x, train=False), flat.expand(3, -1, -1))


def test_models_that_are_not_plain_sequences_are_refused():
    assert sequential_layers(build_model("resnet20", num_classes=10, in_channels=1)) is None  # BatchNorm

    class Skip(nn.Module):  # supported layer types, but not their plain composition
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.flat = nn.Flatten()
            self.fc = nn.Linear(4 * 8 * 8, 3)

        def forward(self, x):
            return self.fc(self.flat(self.conv(x) + x))

    assert sequential_layers(Skip()) is not None
    with pytest.raises(ValueError, match="Skip.*cannot train it grouped"):
        GroupedSequential([Skip(), Skip()], [0.0, 0.0], example=torch.randn(2, 1, 8, 8))


def test_grouped_sweep_trains_like_one_run_at_a_time(tmp_path):
    # dropout 0: same initial weights (seed), same batches (seed), same SGD rule -> same weights
    cfg = SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.01, 0.05),
        dropouts=(0.0,),
        seeds=1,
        epochs=1,
        checkpoint_every=10,
        checkpoint_unit="step",
    )
    a = run_sweep(cfg, tmp_path / "grouped", progress=False, device="cpu")
    b = run_sweep(cfg, tmp_path / "single", progress=False, device="cpu", group_size=1)
    for run in ("run-0000", "run-0001"):
        ma, mb = (json.loads((s / run / "run.json").read_text()) for s in (a, b))
        assert ma["trained_with"] == "grouped" and "trained_with" not in mb
        assert len(ma["checkpoints"]) == len(mb["checkpoints"]) == 2
        for ca, cb in zip(ma["checkpoints"], mb["checkpoints"]):
            assert ca["val_accuracy"] == pytest.approx(cb["val_accuracy"], abs=0.02)
            wa, wb = load_file(a / run / ca["file"]), load_file(b / run / cb["file"])
            for k in wb:
                torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-4)


def test_grouped_sweep_isolates_a_diverging_run(tmp_path):
    cfg = SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.05, 1e4),
        dropouts=(0.0, 0.5),
        seeds=1,
        epochs=1,
        checkpoint_every=10,
        checkpoint_unit="step",
    )
    out = run_sweep(cfg, tmp_path / "div", progress=False, device="cpu")
    metas = [json.loads((out / f"run-{i:04d}" / "run.json").read_text()) for i in range(4)]
    assert [m["status"] for m in metas] == ["complete", "complete", "diverged", "diverged"]
    assert all(m["trained_with"] == "grouped" for m in metas)
    # the healthy dropout-0 run trained as if alone
    alone = run_sweep(
        SweepConfig(**{**cfg.__dict__, "lrs": (0.05,), "dropouts": (0.0,)}),
        tmp_path / "alone",
        progress=False,
        device="cpu",
    )
    ref = json.loads((alone / "run-0000" / "run.json").read_text())
    for ca, cb in zip(metas[0]["checkpoints"], ref["checkpoints"]):
        wa, wb = load_file(out / "run-0000" / ca["file"]), load_file(alone / "run-0000" / cb["file"])
        assert all(torch.isfinite(v).all() for v in wa.values())
        for k in wb:
            torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-4)
