"""The benchmark suite's pieces: the procedural ``shapes`` data, the depthwise MobileNetS,
AdamW and the step schedule, and the presets every claim is measured on."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import dtg_gpu
from dtg_gpu.cli.main import main
from dtg_gpu.models import MobileNetS, build_model
from dtg_gpu.sweeps import run_sweep
from dtg_gpu.sweeps.config import CHECKS, LR_SCHEDULES, OPTIMIZERS, PRESETS, SUITE, SweepConfig, lr_factor
from dtg_gpu.sweeps.data import SHAPES_CLASSES, load_dataset, make_shapes


def test_shapes_are_deterministic_balanced_and_in_range():
    x, y = make_shapes(200, seed=5)
    x2, y2 = make_shapes(200, seed=5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == (200, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    assert np.bincount(y.numpy(), minlength=10).tolist() == [20] * 10
    x3, _ = make_shapes(200, seed=6)
    assert not torch.equal(x, x3)
    assert len(SHAPES_CLASSES) == 10


def test_shapes_classes_differ_in_what_a_shape_detector_sees():
    # the classes are separable by their images, not by their noise: the class-mean images of
    # the foreground-vs-background contrast differ, and a nearest-centroid rule on a 4x4
    # pooled gradient magnitude beats chance clearly
    x, y = make_shapes(2000, seed=0)
    g = (x[:, :, 1:, :-1] - x[:, :, :-1, :-1]).abs() + (x[:, :, :-1, 1:] - x[:, :, :-1, :-1]).abs()
    f = torch.nn.functional.adaptive_avg_pool2d(g.mean(1, keepdim=True), 4).flatten(1)
    f = (f - f.mean(0)) / f.std(0)
    tr, te = slice(0, 1500), slice(1500, None)
    cent = torch.stack([f[tr][y[tr] == c].mean(0) for c in range(10)])
    pred = torch.cdist(f[te], cent).argmin(1)
    assert float((pred == y[te]).float().mean()) > 0.2


def test_load_dataset_shapes_has_fixed_splits():
    ds = load_dataset("shapes")
    assert (ds.num_classes, ds.in_channels) == (10, 3)
    assert [len(s[1]) for s in (ds.train, ds.val, ds.test)] == [3000, 600, 600]
    assert not torch.equal(ds.train[0][:600], ds.val[0])
    assert torch.equal(load_dataset("SHAPES").test[0], ds.test[0])


def test_mobilenet_is_depthwise_separable_and_analyses():
    m = build_model("mobilenet-s", num_classes=10, in_channels=3, dropout=0.25, width=4)
    assert isinstance(m, MobileNetS)
    dw = [mod for mod in m.modules() if isinstance(mod, nn.Conv2d) and mod.groups > 1]
    assert len(dw) == 5 and all(mod.groups == mod.in_channels == mod.out_channels for mod in dw)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="width must be a positive integer"):
        MobileNetS(width=0)
    g = torch.Generator().manual_seed(0)
    ckpts = [
        {
            k: v + 0.01 * t * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in m.state_dict().items()
        }
        for t in range(3)
    ]
    res = dtg_gpu.analyze(dtg_gpu.Run(model=m, checkpoints=ckpts), device="cpu")
    # the input's 3 channels, then every conv/linear layer's output channels: stem 4, the
    # blocks' (depthwise, pointwise) outputs (4, 8), (8, 8), (8, 16), (16, 16), (16, 32), fc 10
    assert res.centrality.shape == (3, 3 + 4 + 4 + 8 + 8 + 8 + 8 + 16 + 16 + 16 + 16 + 32 + 10)
    assert bool(res.converged.all())


def test_step_schedule_and_optimizers_are_validated():
    cfg = SweepConfig(epochs=16, lr_schedule="step")
    assert [lr_factor(cfg, e) for e in (1, 8, 9, 12, 13, 16)] == [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    assert LR_SCHEDULES == ("constant", "cosine", "step") and OPTIMIZERS == ("sgd", "adam", "adamw")
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adam, adamw, got 'rmsprop'"):
        SweepConfig(optimizer="rmsprop").validate()


def test_adamw_step_sweep_trains_and_records_its_recipe(tmp_path):
    cfg = SweepConfig(
        model="lenet5", lrs=(0.001,), dropouts=(0.0,), epochs=4, optimizer="adamw", weight_decay=0.5, lr_schedule="step"
    )
    a = run_sweep(cfg, tmp_path / "adamw", progress=False, device="cpu")
    b = run_sweep(
        SweepConfig(**{**cfg.__dict__, "optimizer": "adam", "weight_decay": 0.0}), tmp_path / "adam", progress=False
    )
    meta = json.loads((a / "run-0000" / "run.json").read_text())
    assert meta["optimizer"] == "adamw" and meta["lr_schedule"] == "step" and len(meta["checkpoints"]) == 4
    wa, wb = (load_file(s / "run-0000" / "ckpt-0004.safetensors") for s in (a, b))
    norm = lambda w: sum(float(v.norm()) ** 2 for k, v in w.items() if k.endswith("weight"))  # noqa: E731
    assert norm(wa) < norm(wb)  # decoupled weight decay shrank the weights


def test_suite_covers_the_families_it_promises():
    assert SUITE == tuple(n for n in PRESETS if n not in CHECKS) and len(SUITE) >= 8
    assert CHECKS and set(CHECKS) <= set(PRESETS)  # check sweeps: presets held out of the suite
    for name in CHECKS:
        PRESETS[name].validate()
        assert len(PRESETS[name].grid()) >= 96
    cfgs = [PRESETS[n] for n in SUITE]
    for cfg in cfgs:
        cfg.validate()
        assert len(cfg.grid()) >= 96
    assert {c.optimizer for c in cfgs} == {"sgd", "adam", "adamw"}
    assert {c.lr_schedule for c in cfgs} == {"constant", "cosine", "step"}
    assert {c.dataset for c in cfgs} == {"digits", "shapes"}
    models = {c.model for c in cfgs}
    assert {"lenet5", "vgg11", "resnet20", "mobilenets"} <= models
    assert any(c.model_kwargs.get("batch_norm") for c in cfgs)  # a plain net with batch norm


def test_cli_lists_every_preset_without_a_copy(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in PRESETS)


def test_cli_width_keeps_the_presets_other_model_keywords(tmp_path, monkeypatch):
    seen = {}

    def fake_run_sweep(cfg, out, **kw):
        seen["cfg"] = cfg
        return tmp_path

    monkeypatch.setattr("dtg_gpu.sweeps.runner.run_sweep", fake_run_sweep)
    assert main(["sweep", "--preset", "vgg11bn-shapes-step", "--width", "0.125", "--out", str(tmp_path / "s")]) == 0
    assert seen["cfg"].model_kwargs == {"width": 0.125, "batch_norm": True}
    assert main(["sweep", "--preset", "mobilenet-shapes-cosine", "--width", "4", "--out", str(tmp_path / "m")]) == 0
    assert seen["cfg"].model_kwargs == {"width": 4}
