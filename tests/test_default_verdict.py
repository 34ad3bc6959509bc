"""The default verdict (issue #33): featurize's default recipe, the default classifier, and
the seed's method one argument away."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from predictor_files import file_parts, write_file

import dtg_gpu
from dtg_gpu.features import FEATURE_RECIPES, FeatureRecipe, feature_recipe, temporal_features
from dtg_gpu.features.baselines import weight_statistics
from dtg_gpu.predictor import PerformancePredictor
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep

CFG = SweepConfig(
    model="resnet20",
    lrs=(0.1, 0.03, 1e-5),
    dropouts=(0.0,),
    seeds=2,
    epochs=3,
    checkpoint_every=1,
    model_kwargs={"width": 4},
)


@pytest.fixture(scope="module")
def bn_runs(tmp_path_factory):
    return load_sweep(run_sweep(CFG, tmp_path_factory.mktemp("bn") / "s", progress=False, device="cpu"))


def test_the_default_recipe_is_folded_per_layer_eigenvalue_weight_statistics_and_the_seeds_block(bn_runs):
    k = 3
    X = dtg_gpu.featurize(bn_runs, timesteps=k, device="cpu")
    dtg = dtg_gpu.featurize(
        bn_runs,
        timesteps=k,
        device="cpu",
        features=FeatureRecipe(per_layer=True, eigenvalue=True, fold_batchnorm=True, weight_stats=False),
    )
    ws = torch.as_tensor(weight_statistics(list(bn_runs), k), dtype=X.dtype)
    seed = dtg_gpu.featurize(bn_runs, timesteps=k, device="cpu", features=feature_recipe("spec", fold_batchnorm=True))
    torch.testing.assert_close(X, torch.cat([dtg, ws, seed], 1))
    # chosen leave one sweep out at k = 25, 50 and 100 % (results/prediction_default_choice.md)
    assert FEATURE_RECIPES["default"] == FeatureRecipe(True, True, True, True, spec_block=True)
    assert X.column_block_models == ("linear", "linear", "mlp")
    # the fold matters on a batch-norm net: the unfolded graph gives other numbers
    unfolded = dtg_gpu.featurize(
        bn_runs, timesteps=k, device="cpu", features=feature_recipe("default", fold_batchnorm=False)
    )
    assert unfolded.shape == X.shape and not torch.allclose(unfolded, X)


def test_the_seeds_method_is_one_argument_away_and_exact(bn_runs):
    k = 3
    res = dtg_gpu.extract_features(bn_runs, k, device="cpu", features="spec")
    X, stats = res.features, res.statistics
    assert X.shape == (len(bn_runs), 5 * k) and stats.shape == (len(bn_runs), k, 5)
    torch.testing.assert_close(X, temporal_features(stats, 0.5))
    for i, run in enumerate(bn_runs):  # the five statistics of analyze, checkpoint by checkpoint
        torch.testing.assert_close(stats[i], dtg_gpu.analyze(run, device="cpu").stats[:k], rtol=1e-4, atol=1e-6)


def test_recipes_and_overrides_are_validated():
    assert feature_recipe("default", weight_stats=False).weight_stats is False
    assert feature_recipe("spec", eigenvalue=True) == FeatureRecipe(False, True, False, False)
    with pytest.raises(ValueError, match="features must be one of 'default', 'spec', got 'best'"):
        feature_recipe("best")
    with pytest.raises(ValueError, match="per_layer must be True, False or None"):
        feature_recipe("spec", per_layer=1)


def test_the_default_classifier_is_a_regularised_linear_model_and_spec_the_seeds_mlp():
    d, s = PerformancePredictor(), PerformancePredictor.spec(random_state=3)
    assert (d.hidden_sizes, d.scaling, d.weight_decay) == ((), "quantile", 0.1)
    assert (s.hidden_sizes, s.scaling, s.weight_decay, s.random_state) == ((32,), "standard", 1e-4, 3)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 20))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    clf = PerformancePredictor(random_state=0).fit(X[:100], y[:100])
    assert len(clf.network_) == 1 and isinstance(clf.network_[0], torch.nn.Linear)  # no hidden layer
    # a logistic regression: it agrees with scikit-learn's on the same scaled features, with
    # the same L2 penalty (Adam's weight_decay w adds w·θ to the gradient of the mean loss)
    from sklearn.linear_model import LogisticRegression

    from dtg_gpu.predictor import quantile_normal, training_quantiles

    q = training_quantiles(X[:100])
    ref = LogisticRegression(C=1 / (0.1 * 100)).fit(quantile_normal(X[:100], q), y[:100])
    ours = clf.predict(X[100:])
    assert (ours == ref.predict(quantile_normal(X[100:], q))).mean() >= 0.95 and (ours == y[100:]).mean() > 0.85


def test_a_default_predictor_file_reads_new_runs_with_its_own_recipe(bn_runs, tmp_path):
    from dtg_gpu.cli.main import main

    sweep = bn_runs.path
    pred = tmp_path / "p.safetensors"
    assert main(["train", str(sweep), "-k", "2", "--out", str(pred), "--threshold", "median"]) == 0
    clf = PerformancePredictor.load(pred)
    fs = clf.feature_settings
    assert fs["features"] == "default" and fs["weight_stats"] and fs["fold_batchnorm"] and fs["per_layer"]
    X = dtg_gpu.featurize(bn_runs, timesteps=2, device="cpu").double().numpy()
    np.testing.assert_allclose(clf.predict_runs(bn_runs, device="cpu"), clf.predict_proba(X), rtol=1e-5)
    spec = tmp_path / "s.safetensors"
    assert main(["train", str(sweep), "-k", "2", "--out", str(spec), "--spec"]) == 0
    clf = PerformancePredictor.load(spec)
    assert clf.feature_settings["features"] == "spec" and clf.hidden_sizes == (32,) and clf.n_features_in_ == 10


def test_cli_featurize_names_every_column(bn_runs, tmp_path):
    import pandas as pd

    from dtg_gpu.cli.main import main

    assert main(["featurize", str(bn_runs.path), "-k", "2", "--out", str(tmp_path / "d.csv")]) == 0
    assert main(["featurize", str(bn_runs.path), "-k", "2", "--out", str(tmp_path / "s.csv"), "--spec"]) == 0
    d, s = pd.read_csv(tmp_path / "d.csv"), pd.read_csv(tmp_path / "s.csv")
    assert list(s.columns[2:7]) == ["mean_t1", "std_t1", "median_t1", "skewness_t1", "kurtosis_t1"] and s.shape[1] == 12
    assert d.columns[-11] == "ws_fc_max" and any(c.startswith("ws_conv1_") for c in d.columns)  # then the seed's
    assert list(d.columns[-10:]) == [f"spec:{s}_t{t}" for t in (1, 2) for s in dtg_gpu.STATISTICS]
    X = dtg_gpu.featurize(bn_runs, timesteps=2, device="cpu").double().numpy()
    np.testing.assert_allclose(d.iloc[:, 2:].to_numpy(), X, rtol=1e-6)


def test_featurize_marks_its_feature_sets_and_the_default_gives_each_a_model(bn_runs, tmp_path):
    X = dtg_gpu.featurize(bn_runs, timesteps=2, device="cpu", covariates=["lr"])
    dtg = dtg_gpu.featurize(
        bn_runs, timesteps=2, device="cpu", features=feature_recipe("default", weight_stats=False, spec_block=False)
    )
    assert X.column_blocks == (dtg.shape[1], X.shape[1] - dtg.shape[1] - 10 - 1, 10, 1)
    assert sum(X.column_blocks) == X.shape[1]
    y = np.array([1, 0, 0, 1, 0, 1])[: len(bn_runs)]
    clf = PerformancePredictor(random_state=0).fit(X, y)
    assert clf.blocks_ == X.column_blocks and clf.network_(torch.zeros(1, X.shape[1])).shape == (1, 3)
    assert clf.block_models_ == ("linear", "linear", "mlp", "linear") and len(clf.block_mlps_) == 1
    # each linear head reads only its own columns: its probability is that block's logistic regression
    w = (clf.network_.linear.weight * clf.network_.mask).detach()
    a, b, s, _ = X.column_blocks
    assert w[0, a:].abs().sum() == 0 and w[1, :a].abs().sum() == 0 and w[1, a + b :].abs().sum() == 0
    assert w[:, a + b : a + b + s].abs().sum() == 0  # the seed's block is the MLP's alone
    # the four heads' probabilities weighted by the stacked weights, saved and read back as it was
    Xn = X.double().numpy()
    p = clf.predict_proba(Xn)[:, 1]
    z = torch.as_tensor(clf._scale(Xn), dtype=torch.float32)
    p_lin = torch.sigmoid(clf.network_(z)).detach().double().numpy()
    p_mlp = clf.block_mlps_[0].predict_proba(Xn[:, a + b : a + b + s])[:, 1]
    w = clf.block_weights_
    assert clf.head_weights == "stacked" and w.shape == (4,) and w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(p, np.c_[p_lin[:, :2], p_mlp, p_lin[:, 2]] @ w, rtol=1e-6)
    clf.save(tmp_path / "p.safetensors")
    back = PerformancePredictor.load(tmp_path / "p.safetensors")
    assert back.blocks_ == clf.blocks_
    np.testing.assert_allclose(back.predict_proba(Xn), clf.predict_proba(Xn))
    # a plain matrix has no sets: one model; the seed's MLP never splits
    assert PerformancePredictor(random_state=0).fit(Xn, y).blocks_ is None
    assert PerformancePredictor.spec(random_state=0).fit(X, y).blocks_ is None
    with pytest.raises(ValueError, match="must be positive widths that add up to"):
        PerformancePredictor(blocks=(1, 2)).fit(Xn, y)


def _attribute_at_each_fit(monkeypatch, clf, attribute: str, **marks) -> list:
    """`evaluate(clf, X, y, repeats=2)` on a marked tensor `X`: `attribute` of every predictor
    fitted along the way."""
    from dtg_gpu.predictor.evaluation import evaluate

    X = torch.as_tensor(np.random.default_rng(0).normal(size=(40, 6)))
    for name, value in marks.items():
        setattr(X, name, value)
    y = (X[:, 0] > 0).long().numpy()
    seen = []
    real = PerformancePredictor.fit

    def fit(self, X, y):
        out = real(self, X, y)
        seen.append(getattr(self, attribute))
        return out

    monkeypatch.setattr(PerformancePredictor, "fit", fit)
    evaluate(clf, X, y, repeats=2)
    return seen


def test_evaluate_passes_featurizes_sets_to_the_default_predictor(monkeypatch):
    seen = _attribute_at_each_fit(monkeypatch, PerformancePredictor(), "blocks_", column_blocks=(4, 2))
    assert seen == [(4, 2)] * 8  # each split's predictor, after its 3 inner fits for the stacked weights


# ---------------------------------------------------------------- the seed's block (spec_block)
def test_spec_block_appends_the_seeds_columns_of_the_solved_graph_marked_for_the_mlp(bn_runs):
    k = 2
    X = dtg_gpu.featurize(bn_runs, timesteps=k, device="cpu", covariates=["lr"])
    plain = dtg_gpu.featurize(
        bn_runs, timesteps=k, device="cpu", covariates=["lr"], features=feature_recipe("default", spec_block=False)
    )
    # the seed's five statistics of the graph the recipe solves (batch norm folded here), smoothed
    seed = dtg_gpu.featurize(bn_runs, timesteps=k, device="cpu", features=feature_recipe("spec", fold_batchnorm=True))
    torch.testing.assert_close(X, torch.cat([plain[:, :-1], seed, plain[:, -1:]], 1))  # covariates last
    a, b, c = plain.column_blocks
    assert X.column_blocks == (a, b, 5 * k, c)
    assert X.column_block_models == ("linear", "linear", "mlp", "linear")
    assert plain.column_block_models == ("linear", "linear", "linear")


def test_an_mlp_block_is_the_seeds_mlp_on_its_columns_averaged_with_the_linear_heads(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(90, 9))
    y = (X[:, 0] + X[:, 7] > 0).astype(int)
    clf = PerformancePredictor(
        random_state=4, blocks=(4, 2, 3), block_models=("linear", "mlp", "linear"), head_weights="equal"
    )
    clf.fit(X, y)
    assert clf.block_models_ == ("linear", "mlp", "linear") and clf.network_.linear.weight.shape == (2, 9)
    # the linear heads never read the MLP's block
    w = (clf.network_.linear.weight * clf.network_.mask).detach()
    assert w[:, 4:6].abs().sum() == 0 and w[0, 6:].abs().sum() == 0 and w[1, :6].abs().sum() == 0
    # the MLP head is exactly the seed's predictor fitted on the block alone, with the same seed
    ref = PerformancePredictor.spec(random_state=4).fit(X[:, 4:6], y)
    p_mlp = ref.predict_proba(X[:, 4:6])[:, 1]
    z = torch.as_tensor(clf._scale(X), dtype=torch.float32)
    p_lin = torch.sigmoid(clf.network_(z)).detach().double().numpy()
    np.testing.assert_allclose(clf.predict_proba(X)[:, 1], (p_lin.sum(1) + p_mlp) / 3, rtol=1e-6)
    # a diverged row is insufficient by rule, whatever the heads say
    Xn = X.copy()
    Xn[0, 5] = np.nan
    assert clf.predict_proba(Xn)[0].tolist() == [1.0, 0.0]
    # saved (format /2) and read back as it was
    clf.save(tmp_path / "m.safetensors")
    back = PerformancePredictor.load(tmp_path / "m.safetensors")
    assert back.block_models_ == clf.block_models_
    np.testing.assert_allclose(back.predict_proba(X), clf.predict_proba(X))


def test_block_models_are_validated():
    X = np.random.default_rng(0).normal(size=(40, 5))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="at least one 'linear'"):
        PerformancePredictor(blocks=(2, 3), block_models=("mlp", "mlp")).fit(X, y)
    with pytest.raises(ValueError, match="block_models must be 'auto' or a list"):
        PerformancePredictor(blocks=(2, 3), block_models=("linear", "tree")).fit(X, y)
    with pytest.raises(ValueError, match=r"for each of the 2 blocks"):
        PerformancePredictor(blocks=(2, 3), block_models=("linear", "mlp", "linear")).fit(X, y)
    # without blocks (a plain matrix) there is one model and block_models has nothing to name
    assert PerformancePredictor(random_state=0).fit(X, y).block_models_ is None


@pytest.mark.parametrize(
    "tamper, field",
    [
        (lambda t, m: t.pop("head1.mean"), "mean"),
        (lambda t, m: m["fitted"].update(block_models=["linear", "linear", "linear"]), "network.linear.weight"),
        (lambda t, m: m["fitted"].update(block_models=["mlp", "mlp", "mlp"]), "block_models"),
        (lambda t, m: m["fitted"]["block_mlps"][0].update(n_features_in=3), "block MLP 1"),
        (lambda t, m: m["fitted"]["block_mlps"][0].update(format="dtg_gpu.PerformancePredictor/2"), "plain predictor"),
        (lambda t, m: m.update(format="dtg_gpu.PerformancePredictor/1"), "format"),
        (lambda t, m: t.update({"head0.mean": torch.zeros(4)}), "do not match"),
    ],
)
def test_a_tampered_block_mlp_file_is_refused_naming_the_field(tmp_path, tamper, field):
    from dtg_gpu.exceptions import CheckpointError

    X = np.random.default_rng(2).normal(size=(60, 9))
    y = (X[:, 0] > 0).astype(int)
    models = ("linear", "mlp", "linear")
    clf = PerformancePredictor(random_state=0, blocks=(4, 2, 3), block_models=models, epochs=5, head_weights="equal")
    clf.fit(X, y).save(tmp_path / "ok.safetensors")
    tensors, meta = file_parts(tmp_path / "ok.safetensors")
    assert meta["format"] == "dtg_gpu.PerformancePredictor/2"
    tamper(tensors, meta)
    write_file(tmp_path / "bad.safetensors", tensors, meta)
    with pytest.raises(CheckpointError, match=f"bad.safetensors: not a valid dtg_gpu predictor file: .*{field}"):
        PerformancePredictor.load(tmp_path / "bad.safetensors")


def test_a_predictor_without_an_mlp_block_keeps_the_first_format(tmp_path):
    X = np.random.default_rng(0).normal(size=(40, 5))
    y = (X[:, 0] > 0).astype(int)
    clf = PerformancePredictor(random_state=0, blocks=(2, 3), epochs=5, head_weights="equal")
    clf.fit(X, y).save(tmp_path / "p.safetensors")
    assert file_parts(tmp_path / "p.safetensors")[1]["format"] == "dtg_gpu.PerformancePredictor/1"


def test_the_cli_trains_and_predicts_with_the_spec_block(bn_runs, tmp_path):
    import pandas as pd

    from dtg_gpu.cli.main import main

    pred = tmp_path / "p.safetensors"
    assert main(["train", str(bn_runs.path), "-k", "2", "--out", str(pred), "--spec-block", "--epochs", "20"]) == 0
    clf = PerformancePredictor.load(pred)
    assert clf.feature_settings["spec_block"] is True and clf.block_models_[-1] == "mlp"
    X = dtg_gpu.featurize(bn_runs, 2, device="cpu", features=feature_recipe("default", spec_block=True))
    np.testing.assert_allclose(
        clf.predict_runs(bn_runs, device="cpu"), clf.predict_proba(X.double().numpy()), rtol=1e-5
    )
    out = tmp_path / "f.csv"
    assert main(["featurize", str(bn_runs.path), "-k", "2", "--out", str(out), "--spec-block"]) == 0
    df = pd.read_csv(out)
    assert list(df.columns[-10:]) == [f"spec:{s}_t{t}" for t in (1, 2) for s in dtg_gpu.STATISTICS]
    np.testing.assert_allclose(df.iloc[:, 2:].to_numpy(), X.double().numpy(), rtol=1e-6)


def test_evaluate_passes_featurizes_block_models_to_the_predictor(monkeypatch):
    marks = {"column_blocks": (4, 2), "column_block_models": ("linear", "mlp")}
    clf = PerformancePredictor(epochs=5, head_weights="equal")  # no inner fits of stacking in between
    seen = _attribute_at_each_fit(monkeypatch, clf, "block_models_", **marks)
    # each split's predictor, and inside it the block's own MLP (no blocks of its own)
    assert seen == [None, ("linear", "mlp")] * 2


def test_the_reports_default_matrix_and_model_are_featurizes(bn_runs):
    """`dtg evaluate` / the report build the default row from the sweep's solved statistics:
    the same columns, blocks and block models as `featurize` (covariates last)."""
    from dtg_gpu.workflow import default_blocks, default_predictor, feature_sets, featurize_sweep

    cov = ["lr", "dropout"]
    sf = featurize_sweep(bn_runs, device="cpu")
    X = dtg_gpu.featurize(bn_runs, timesteps=2, device="cpu", covariates=cov)
    F = feature_sets(sf, 2, ["default"], covariates=cov)["default"]
    # every checkpoint solved in one batch there, the first k here: float32 solver tolerance apart
    np.testing.assert_allclose(F, X.double().numpy(), rtol=1e-4, atol=1e-5)
    assert default_blocks(sf, F.shape[1], cov) == X.column_blocks
    clf = default_predictor(sf, F.shape[1], cov, random_state=0)
    assert (clf.blocks, clf.block_models, clf.random_state) == (X.column_blocks, X.column_block_models, 0)


def test_the_cli_trains_with_stacked_head_weights_and_evaluate_passes_them_on(bn_runs, tmp_path, monkeypatch):
    from dtg_gpu.cli.main import main
    from dtg_gpu.workflow import verdicts

    pred = tmp_path / "p.safetensors"
    args = ["train", str(bn_runs.path), "-k", "2", "--out", str(pred), "--epochs", "20"]
    assert main([*args, "--head-weights", "equal"]) == 0
    eq = PerformancePredictor.load(pred)
    assert eq.head_weights == "equal" and file_parts(pred)[1]["format"] == "dtg_gpu.PerformancePredictor/2"
    np.testing.assert_allclose(eq.block_weights_, [1 / 3] * 3)
    assert main(args) == 0  # stacked: the default
    clf = PerformancePredictor.load(pred)
    assert clf.head_weights == "stacked" and clf.block_weights_.shape == (3,)
    assert clf.block_weights_.sum() == pytest.approx(1.0) and (clf.block_weights_ >= 1 / 6 - 1e-9).all()
    X = dtg_gpu.featurize(bn_runs, 2, device="cpu")
    heads = clf._block_probabilities(X.double().numpy())
    np.testing.assert_allclose(clf.predict_runs(bn_runs, device="cpu")[:, 1], heads @ clf.block_weights_, rtol=1e-5)
    seen = []

    def fake_evaluate(row_clf, X, y, **kw):
        seen.append(row_clf.get_params()["head_weights"])
        return {m: {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6} for m in ("precision", "roc_auc")}

    monkeypatch.setattr(verdicts, "evaluate", fake_evaluate)
    sf = verdicts.featurize_sweep(bn_runs, device="cpu")
    verdicts.compare(sf, [2], ["default", "weight_stats", "dtg"], repeats=2)
    assert seen == ["stacked", "stacked", "equal"]  # the seed's MLP of "dtg": one network, SPEC_PARAMS
    seen.clear()
    verdicts.compare(sf, [2], ["default", "weight_stats", "dtg"], repeats=2, predictor_params={"head_weights": "equal"})
    assert seen == ["equal", "equal", "equal"]
