"""Residual + batch-norm sweeps (issue #19): weight decay and presets in sweeps, batch norm
folded into the edges, known covariates, and the adaptive predictor."""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

import dtg_gpu
from dtg_gpu.cli.main import main
from dtg_gpu.exceptions import FailedRunsWarning
from dtg_gpu.features.covariates import covariate_matrix
from dtg_gpu.io import Run
from dtg_gpu.models import build_model
from dtg_gpu.predictor import PerformancePredictor
from dtg_gpu.sweeps import PRESETS, SweepConfig, load_sweep, run_sweep


# ------------------------------------------------------------------ sweeps: weight decay, presets
def test_weight_decay_grouped_trains_like_one_run_at_a_time(tmp_path):
    cfg = SweepConfig(
        model="lenet5",
        lrs=(0.05, 0.02),
        dropouts=(0.0,),
        epochs=1,
        checkpoint_every=10,
        checkpoint_unit="step",
        weight_decay=0.05,
    )
    a = run_sweep(cfg, tmp_path / "grouped", progress=False, device="cpu")
    b = run_sweep(cfg, tmp_path / "single", progress=False, device="cpu", group_size=1)
    c = run_sweep(SweepConfig(**{**cfg.__dict__, "weight_decay": 0.0}), tmp_path / "nowd", progress=False)
    ma, mb = (json.loads((s / "run-0000" / "run.json").read_text()) for s in (a, b))
    assert ma["trained_with"] == "grouped" and ma["weight_decay"] == mb["weight_decay"] == 0.05
    assert ma["momentum"] == 0.9
    last = ma["checkpoints"][-1]["file"]
    wa, wb, wc = (load_file(s / "run-0000" / last) for s in (a, b, c))
    for k in wb:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-4)
    # weight decay did something: the weights are smaller than without it
    norm = lambda w: sum(float(v.norm()) ** 2 for k, v in w.items() if k.endswith("weight"))  # noqa: E731
    assert norm(wa) < norm(wc)


def test_cosine_schedule_grouped_trains_like_one_run_at_a_time(tmp_path):
    from dtg_gpu.sweeps.training import _lr_factor

    cfg = SweepConfig(model="lenet5", lrs=(0.05, 0.02), dropouts=(0.0,), epochs=3, lr_schedule="cosine")
    assert [round(_lr_factor(cfg, e), 6) for e in (1, 2, 3)] == [1.0, 0.75, 0.25]
    a = run_sweep(cfg, tmp_path / "grouped", progress=False, device="cpu")
    b = run_sweep(cfg, tmp_path / "single", progress=False, device="cpu", group_size=1)
    c = run_sweep(SweepConfig(**{**cfg.__dict__, "lr_schedule": "constant"}), tmp_path / "const", progress=False)
    ma, mb = (json.loads((s / "run-0000" / "run.json").read_text()) for s in (a, b))
    assert ma["trained_with"] == "grouped" and ma["lr_schedule"] == mb["lr_schedule"] == "cosine"

    def rel(x: dict, y: dict) -> float:  # the largest relative (Frobenius) difference of a tensor
        return max(float((x[k] - y[k]).norm() / y[k].norm()) for k in y)

    for run in ("run-0000", "run-0001"):
        for ckpt in ("ckpt-0001.safetensors", "ckpt-0003.safetensors"):
            wa, wb, wc = (load_file(s / run / ckpt) for s in (a, b, c))
            # grouped and one-at-a-time sum in different orders: rounding that training at
            # lr 0.05 amplifies to ~1e-3 relative by epoch 3 (machine-dependent), while the
            # schedule itself moves the weights by ~0.5-1 relative there
            if ckpt.endswith("1.safetensors"):  # epoch 1 runs at the full rate either way
                assert rel(wa, wb) < 1e-5 and rel(wa, wc) == 0.0
            else:
                assert rel(wa, wb) < 1e-2 and rel(wa, wc) > 0.1
    with pytest.raises(ValueError, match="lr_schedule must be one of constant, cosine, step"):
        SweepConfig(lr_schedule="linear").validate()


def test_a_sweep_written_before_weight_decay_resumes(tmp_path):
    cfg = SweepConfig(
        model="lenet5", lrs=(0.01,), dropouts=(0.0,), epochs=1, checkpoint_every=20, checkpoint_unit="step"
    )
    out = run_sweep(cfg, tmp_path / "sw", progress=False, device="cpu")
    manifest = json.loads((out / "sweep.json").read_text())
    del manifest["config"]["weight_decay"]  # as an older dtg_gpu wrote it
    del manifest["config"]["lr_schedule"]
    (out / "sweep.json").write_text(json.dumps(manifest))
    run_sweep(cfg, out, progress=False)  # no "different sweep"
    with pytest.raises(ValueError, match="different sweep"):
        run_sweep(SweepConfig(**{**cfg.__dict__, "weight_decay": 1e-4}), out, progress=False)
    with pytest.raises(ValueError, match="weight_decay"):
        SweepConfig(weight_decay=-1.0).validate()


def test_presets_are_the_benchmark_sweeps():
    for name, cfg in PRESETS.items():
        cfg.validate()
        assert len(cfg.grid()) == 96, name
    res = SweepConfig.preset("resnet20-digits")
    assert res.model == "resnet20" and res.weight_decay > 0 and res.optimizer == "sgd" and res.momentum > 0
    assert SweepConfig.preset("resnet20-digits", seeds=1).seeds == 1
    with pytest.raises(ValueError, match="unknown preset 'resnet'.*resnet20-digits"):
        SweepConfig.preset("resnet")


def test_sweep_command_preset_with_overrides(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["sweep", "--preset", "resnet20-digits", "--lr", "0.05", "--dropout", "0", "--seeds", "1"]
    args += ["--epochs", "1", "--checkpoint-every", "10", "--checkpoint-unit", "step", "--quiet", "--out", str(out)]
    assert main(args + ["--lr-schedule", "cosine"]) == 0
    meta = json.loads((out / "run-0000" / "run.json").read_text())
    assert meta["model"] == "resnet20" and meta["model_kwargs"]["width"] == 4 and meta["lr_schedule"] == "cosine"
    assert meta["weight_decay"] == 5e-4 and meta["lr"] == 0.05 and len(meta["checkpoints"]) == 2
    assert json.loads((out / "sweep.json").read_text())["config"]["weight_decay"] == 5e-4
    # another model drops the preset's width; flags alone still make a plain sweep
    assert (
        main(
            ["sweep", "--preset", "vgg11-digits", "--model", "lenet5", "--lr", "0.01", "--dropout", "0"]
            + ["--epochs", "1", "--checkpoint-every", "20", "--checkpoint-unit", "step", "--quiet"]
            + ["--out", str(tmp_path / "le")]
        )
        == 0
    )
    assert json.loads((tmp_path / "le" / "sweep.json").read_text())["config"]["model_kwargs"] == {}


# ------------------------------------------------------------------------------ batch norm folding
def _randomise_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 3 + 0.05)
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
            if m.affine:
                m.weight.data.copy_(torch.randn(m.weight.shape, generator=g))
    return model


@pytest.mark.parametrize("name", ["resnet20", "resnet18"])
def test_folded_weights_equal_torch_fusion(name):
    kw = {"width": 4} if name == "resnet20" else {}
    model = _randomise_batchnorm(build_model(name, num_classes=10, in_channels=3, **kw))
    topo = dtg_gpu.channel_topology(model)
    folded = topo.fold_batchnorm()
    assert folded is topo.fold_batchnorm() is folded.fold_batchnorm()  # made once; idempotent
    assert [(l.name, l.in_nodes.tolist()) for l in folded.layers] == [
        (l.name, l.in_nodes.tolist()) for l in topo.layers
    ]
    w = Run(model, [model.state_dict()]).weights(0, folded)
    mods = dict(model.named_modules())
    n_folded = 0
    for layer in folded.layers:
        if layer.effective is None:
            assert isinstance(mods[layer.name], nn.Linear)  # the classifier has no batch norm
            continue
        bn = mods[layer.sources[1].rsplit(".", 1)[0]]
        conv = mods[layer.name]
        ref, _ = fuse_conv_bn_weights(
            conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
        )
        torch.testing.assert_close(w[layer.param], ref.detach(), rtol=1e-6, atol=1e-7)
        n_folded += 1
    assert n_folded == len(topo.layers) - 1


def _conv_bn_net(bn: bool = True, affine: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(2, 5, 3, padding=1, bias=False)]
    layers += [nn.BatchNorm2d(5, affine=affine)] if bn else []
    layers += [nn.ReLU(), nn.Conv2d(5, 4, 3, padding=1, bias=False)]
    layers += [nn.BatchNorm2d(4, affine=affine)] if bn else []
    layers += [nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 6, bias=False)]
    layers += [nn.BatchNorm1d(6, affine=affine)] if bn else []
    layers += [nn.ReLU(), nn.Linear(6, 3)]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("affine", [True, False])
def test_featurize_folded_equals_a_network_without_batchnorm_holding_the_folded_weights(affine):
    torch.manual_seed(0)
    states, plain_states = [], []
    for t in range(4):
        net = _randomise_batchnorm(_conv_bn_net(affine=affine), seed=t)
        for p in net.parameters():
            p.data.normal_()
        states.append({k: v.clone() for k, v in net.state_dict().items()})
        convs = [m for m in net if isinstance(m, (nn.Conv2d, nn.Linear))]
        bns = [m for m in net if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        fused = []
        for c, b in zip(convs, bns):
            gamma = b.weight if affine else torch.ones_like(b.running_var)
            beta = b.bias if affine else torch.zeros_like(b.running_var)
            fuse = fuse_conv_bn_weights if isinstance(c, nn.Conv2d) else fuse_linear_bn_weights
            fused.append(fuse(c.weight, c.bias, b.running_mean, b.running_var, b.eps, gamma, beta)[0])
        plain = _conv_bn_net(bn=False)
        plain_convs = [m for m in plain if isinstance(m, (nn.Conv2d, nn.Linear))]
        for m, w in zip(plain_convs, fused + [convs[-1].weight]):
            m.weight.data.copy_(w.detach())
        plain_convs[-1].bias.data.copy_(convs[-1].bias.data)
        plain_states.append(plain.state_dict())
    run = Run(_conv_bn_net(affine=affine), states, name="bn")
    ref = Run(_conv_bn_net(bn=False), plain_states, name="plain")
    solver = dtg_gpu.SolverOptions(dtype=torch.float64, tol=1e-12)
    kw = dict(device="cpu", solver=solver, features="spec")  # the graph's features only
    got = dtg_gpu.featurize([run], **{**kw, "features": dtg_gpu.feature_recipe("spec", fold_batchnorm=True)})
    want = dtg_gpu.featurize([ref], **kw)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    # the default recipe folds too: its graph columns are the folded graph's
    default = dtg_gpu.featurize(
        [run], device="cpu", solver=solver, features=dtg_gpu.feature_recipe("default", weight_stats=False)
    )
    folded_rich = dtg_gpu.featurize(
        [ref], **{**kw, "features": dtg_gpu.feature_recipe("spec", per_layer=True, eigenvalue=True)}
    )
    torch.testing.assert_close(default, torch.cat([folded_rich, want], 1), rtol=1e-7, atol=1e-9)  # + the seed's
    unfolded = dtg_gpu.featurize([run], **kw)
    assert not torch.allclose(unfolded, want, atol=1e-3)
    res = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12, fold_batchnorm=True)
    torch.testing.assert_close(res.features, want[0], rtol=1e-7, atol=1e-9)
    assert res.settings["fold_batchnorm"] is True


def test_folded_features_ignore_the_scale_batch_norm_removes():
    """Scaling a conv's weight by c (and so its output's variance by c², as training would
    record it) changes nothing the network computes; folded features do not move either."""
    torch.manual_seed(1)
    net = _randomise_batchnorm(_conv_bn_net())
    base = {k: v.clone() for k, v in net.state_dict().items()}
    scaled = {k: v.clone() for k, v in base.items()}
    scaled["0.weight"] *= 7.0
    scaled["1.running_var"] = scaled["1.running_var"] * 49.0 + net[1].eps * 48.0  # (c²σ² + ε) = c²(σ² + ε)
    run = Run(_conv_bn_net(), [base, scaled])
    folded = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12, fold_batchnorm=True)
    # equal up to the float32 rounding of the stored running variance
    torch.testing.assert_close(folded.centrality[0], folded.centrality[1], rtol=1e-6, atol=1e-7)
    raw = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12)
    assert (raw.centrality[0] - raw.centrality[1]).abs().max() > 1e-2


def test_only_a_batch_norm_that_directly_and_solely_follows_a_layer_is_folded():
    class Shared(nn.Module):  # the conv's output is read by the batch norm and by the residual sum
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.bn = nn.BatchNorm2d(3)
            self.head = nn.Linear(3, 2)

        def forward(self, x):
            y = self.conv(x)
            return self.head((self.bn(y) + y).mean((2, 3)))

    class PreActivation(nn.Module):  # batch norm before the conv: nothing to fold into
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(3)
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(torch.relu(self.bn(x)))

    for model in (Shared(), PreActivation()):
        topo = dtg_gpu.channel_topology(model)
        assert topo.fold_batchnorm() is topo
    stats_free = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))
    assert dtg_gpu.channel_topology(stats_free).fold_batchnorm().layers[0].effective is None
    functional = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))
    assert [l.batchnorm is not None for l in dtg_gpu.channel_topology(functional).layers] == [True, False]


def test_fold_batchnorm_reads_the_running_variance_from_each_checkpoint():
    net = _randomise_batchnorm(_conv_bn_net())
    state = net.state_dict()
    broken = {k: v for k, v in state.items() if k != "1.running_var"}
    run = Run(_conv_bn_net(), [state, broken], name="r")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        X = dtg_gpu.featurize(
            [run], timesteps=2, features=dtg_gpu.feature_recipe("default", fold_batchnorm=True), device="cpu"
        )
    assert torch.isnan(X).all()  # one unreadable checkpoint fails its run, named
    msg = [str(w.message) for w in caught if issubclass(w.category, FailedRunsWarning)]
    assert msg and "1.running_var" in msg[0]
    assert torch.isfinite(dtg_gpu.featurize([run], timesteps=2, device="cpu", features="spec")).all()  # unfolded


# ------------------------------------------------------------------------------------ covariates
def _runs_with_meta(metas):
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    out = []
    for i, meta in enumerate(metas):
        torch.manual_seed(i)
        states = [{k: torch.randn_like(v) for k, v in net.state_dict().items()} for _ in range(3)]
        out.append(Run(net, states, name=f"run-{i}", meta=meta))
    return out


def test_covariates_are_appended_log_scaled_where_they_are_rates():
    runs = _runs_with_meta(
        [{"lr": 0.1, "dropout": 0.5, "weight_decay": 0.0}, {"lr": 0.001, "dropout": 0.0, "weight_decay": 1e-4}]
    )
    X = dtg_gpu.featurize(runs, device="cpu", covariates=["lr", "dropout", "weight_decay"])
    base = dtg_gpu.featurize(runs, device="cpu")
    assert X.shape == (2, base.shape[1] + 3)
    torch.testing.assert_close(X[:, : base.shape[1]], base)
    torch.testing.assert_close(
        X[:, -3:].double(), torch.tensor([[-1.0, 0.5, -10.0], [-3.0, 0.0, -4.0]], dtype=torch.float64)
    )


def test_a_run_without_a_covariate_is_named_and_left_out():
    runs = _runs_with_meta([{"lr": 0.1}, {"lr": "fast"}, {"lr": 0.01}])
    with pytest.warns(FailedRunsWarning, match=r"covariate 'lr'.*run-1"):
        X = dtg_gpu.featurize(runs, device="cpu", covariates=["lr"])
    assert torch.isnan(X[1]).all() and torch.isfinite(X[[0, 2]]).all()
    with pytest.raises(ValueError, match=r"covariate 'lr'.*run-1"):
        dtg_gpu.featurize(runs, device="cpu", covariates=["lr"], strict=True)
    with pytest.raises(ValueError, match="'momentum' is in no run's run.json"):
        covariate_matrix(runs, ["momentum"])
    with pytest.raises(ValueError, match="list of run.json field names"):
        covariate_matrix(runs, "lr")


# ----------------------------------------------------------------------------- auto predictor
def test_auto_chooses_the_informative_column_set_inside_the_training_data(tmp_path):
    rng = np.random.default_rng(0)
    n = 90
    y = np.arange(n) % 2
    signal = y[:, None] * 1.5 + rng.normal(size=(n, 3))
    noise = rng.normal(size=(n, 12))
    X = np.hstack([noise, signal])
    sets = {"noise": list(range(12)), "signal": [12, 13, 14], "both": list(range(15))}
    clf = PerformancePredictor(auto=True, column_sets=sets, random_state=0, epochs=60).fit(X, y)
    assert clf.columns_.tolist() in ([12, 13, 14], list(range(15)))
    tried = {(s["columns"], s["scaling"], s["select"]) for s in clf.auto_scores_}
    assert ("noise", "standard", None) in tried and ("both", "quantile", 5) in tried
    best = max(clf.auto_scores_, key=lambda s: s["auc"])
    noise_best = max(s["auc"] for s in clf.auto_scores_ if s["columns"] == "noise")
    assert best["auc"] > noise_best + 0.2
    assert clf.score(X, y) > 0.8
    # saved and loaded: the same choice and the same probabilities
    clf.save(tmp_path / "auto.safetensors")
    back = PerformancePredictor.load(tmp_path / "auto.safetensors")
    assert back.columns_.tolist() == clf.columns_.tolist() and back.scaling_ == clf.scaling_
    np.testing.assert_allclose(back.predict_proba(X), clf.predict_proba(X), rtol=1e-6, atol=1e-7)
    # the choice depends on the training rows only: fitting on a subset never reads the rest
    X2 = X.copy()
    X2[60:] = np.nan
    part = PerformancePredictor(auto=True, column_sets=sets, random_state=0, epochs=60).fit(X[:60], y[:60])
    again = PerformancePredictor(auto=True, column_sets=sets, random_state=0, epochs=60).fit(X2[:60], y[:60])
    assert part.auto_scores_ == again.auto_scores_


def test_auto_parameters_are_checked():
    X, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    for kw, match in [
        ({"auto_folds": 1}, "auto_folds"),
        ({"column_sets": {"a": []}}, "column_sets"),
        ({"column_sets": {"a": [0, 7]}}, "beyond"),
    ]:
        with pytest.raises(ValueError, match=match):
            PerformancePredictor(auto=True, **kw).fit(X, y)


# ------------------------------------------------------------------------- CLI end to end
def test_cli_fold_batchnorm_and_covariates_train_then_predict(tmp_path, capsys):
    cfg = SweepConfig.preset(
        "resnet20-digits",
        lrs=(0.01, 0.1),
        dropouts=(0.0, 0.5),
        seeds=1,
        epochs=1,
        checkpoint_every=8,
        checkpoint_unit="step",
        model_kwargs={"width": 2},
    )
    sweep = run_sweep(cfg, tmp_path / "sw", progress=False, device="cpu")
    assert len(load_sweep(sweep)) == 4
    # one epoch of a width-2 ResNet ends near chance, where runs tie and a median label can
    # leave one class with a single run (machine-dependent): fix the outcomes, two per class
    for i, acc in enumerate((0.2, 0.8, 0.3, 0.9)):
        meta = json.loads((sweep / f"run-{i:04d}" / "run.json").read_text())
        (sweep / f"run-{i:04d}" / "run.json").write_text(json.dumps(meta | {"final_accuracy": acc}))
    csv = tmp_path / "f.csv"
    assert main(["featurize", str(sweep), "--fold-batchnorm", "--covariates", "lr", "dropout", "--out", str(csv)]) == 0
    header = csv.read_text().splitlines()[0].split(",")
    assert header[-2:] == ["lr", "dropout"] and header[2] == "mean_t1"
    pred = tmp_path / "p.safetensors"
    assert (
        main(
            ["train", str(sweep), "--fold-batchnorm", "--covariates", "lr", "dropout", "--epochs", "20"]
            + ["--auto", "--out", str(pred)]
        )
        == 0
    )
    loaded = PerformancePredictor.load(pred)
    fs = loaded.feature_settings
    assert loaded.auto and loaded.scaling_ in ("standard", "quantile")
    assert fs["fold_batchnorm"] is True and fs["covariates"] == ["lr", "dropout"]
    capsys.readouterr()
    assert main(["predict", str(pred), str(sweep / "run-0000"), str(sweep / "run-0003")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("P(sufficient)=" in line and "nan" not in line for line in lines)
    assert (
        main(
            ["evaluate", str(sweep), "--features", "dtg", "covariates", "--covariates", "lr", "--repeats", "2"]
            + ["--fold-batchnorm", "--json"]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["features"] for r in rows] == ["dtg", "covariates"]


def test_checkpoint_records_carry_the_folded_graph_for_batch_norm_nets():
    """Early stopping (issue #17) on residual + BN nets: a record holds the statistics of the
    folded graph too, equal to featurize(fold_batchnorm=True); the rule reads them when asked."""
    from dtg_gpu.early_stopping import StoppingRule, checkpoint_record, feature_vector, run_records

    torch.manual_seed(3)
    states = []
    for t in range(3):
        net = _randomise_batchnorm(_conv_bn_net(), seed=t)
        for p in net.parameters():
            p.data.normal_()
        states.append({k: v.clone() for k, v in net.state_dict().items()})
    run = Run(_conv_bn_net(), states, name="bn")
    recs = run_records(run, device="cpu")
    assert all(set(r) == {"dtg", "per_layer", "log_eigenvalue", "weight_stats", "folded", "architecture"} for r in recs)
    folded = dtg_gpu.extract_features(
        [run],
        features=dtg_gpu.feature_recipe("spec", fold_batchnorm=True, per_layer=True, eigenvalue=True),
        device="cpu",
    ).statistics
    got = torch.tensor(
        [r["folded"]["dtg"] + r["folded"]["per_layer"] + [r["folded"]["log_eigenvalue"]] for r in recs],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, folded[0].double(), rtol=1e-6, atol=1e-7)
    assert recs[0]["folded"]["dtg"] != recs[0]["dtg"]  # the folded graph is another graph
    # the rule's feature: the folded columns with fold_batchnorm, the plain ones without
    x_plain = feature_vector(recs, 3, "dtg_per_layer")
    x_fold = feature_vector(recs, 3, "dtg_per_layer", fold_batchnorm=True)
    assert not np.allclose(x_plain, x_fold)
    np.testing.assert_array_equal(
        x_fold, feature_vector([{**r, **r["folded"]} for r in recs], 3, "dtg_per_layer"), strict=True
    )
    # the records rebuild featurize's default row (a predictor file's features in dtg watch)
    x_default = feature_vector(recs, 3, "dtg_per_layer+eigenvalue+weight_stats+spec_block", fold_batchnorm=True)
    np.testing.assert_allclose(
        x_default, dtg_gpu.featurize([run], 3, device="cpu")[0].double().numpy(), rtol=1e-5, atol=1e-6
    )
    # a network without batch norm has no folded block, and folding changes nothing for it
    plain = checkpoint_record(_conv_bn_net(bn=False), device="cpu")
    assert "folded" not in plain
    np.testing.assert_array_equal(
        feature_vector([plain], 1, "dtg_per_layer+eigenvalue", fold_batchnorm=True),
        feature_vector([plain], 1, "dtg_per_layer+eigenvalue"),
    )
    with pytest.raises(ValueError, match="fold_batchnorm must be True or False"):
        StoppingRule(fold_batchnorm="yes")


def test_online_rule_with_folding_learns_from_the_folded_statistics():
    """Runs told apart only by their folded graph: the rule with fold_batchnorm separates them,
    the rule without cannot (their plain records are the same)."""
    from dtg_gpu.early_stopping import StoppingRule

    def recs(kind: float, seed: int) -> list[dict]:
        r = np.random.default_rng(seed)
        plain = {"dtg": [0.5] * 5, "per_layer": [0.1] * 10, "log_eigenvalue": 0.0, "weight_stats": [0.0] * 7}
        return [
            {
                **plain,
                "folded": {
                    "dtg": list(kind + 0.05 * r.standard_normal(5)),
                    "per_layer": [0.1] * 10,
                    "log_eigenvalue": 0.0,
                },
            }
            for _ in range(3)
        ]

    finished = [(f"g{i}", recs(1.0, i), None, 0.9 + 0.001 * i) for i in range(6)]
    finished += [(f"b{i}", recs(2.0, 10 + i), None, 0.2 + 0.001 * i) for i in range(6)]
    folded = StoppingRule(fold_batchnorm=True, n_startup_trials=10)
    plain = StoppingRule(n_startup_trials=10)
    bad, good = recs(2.0, 99), recs(1.0, 98)
    assert folded.probability(bad, None, finished) < 0.3 < folded.probability(good, None, finished)
    assert abs(plain.probability(bad, None, finished) - plain.probability(good, None, finished)) < 1e-9


def test_a_predictor_trained_with_covariates_is_refused_by_the_stopping_rule():
    from dtg_gpu.early_stopping import StoppingRule

    X = np.random.default_rng(0).standard_normal((16, 6))
    y = np.array([0, 1] * 8)
    clf = PerformancePredictor(
        random_state=0, epochs=5, feature_settings={"timesteps": 1, "alpha": 0.5, "covariates": ["lr"]}
    ).fit(X, y)
    with pytest.raises(ValueError, match=r"covariates \['lr'\].*checkpoints alone"):
        StoppingRule(predictor=clf)
