import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.utils.estimator_checks import parametrize_with_checks

import dtg_gpu
from dtg_gpu import PerformancePredictor, evaluate, label_runs, split_runs


@parametrize_with_checks(
    [
        PerformancePredictor(epochs=60, random_state=0),
        PerformancePredictor(epochs=60, random_state=0, scaling="quantile"),
        PerformancePredictor(epochs=60, random_state=0, scaling="quantile", select=2),
    ]
)
def test_sklearn_estimator_contract(estimator, check):
    check(estimator)


def test_label_runs_thresholds_and_errors():
    acc = [0.2, 0.5, 0.9, 0.95, float("nan")]
    assert label_runs(acc, 0.9).tolist() == [0, 0, 1, 1, 0]
    assert label_runs(acc, "median").tolist() == [0, 0, 1, 1, 0]  # median of finite = 0.7
    assert label_runs(acc, "q0.75").tolist() == [0, 0, 0, 1, 0]
    with pytest.raises(ValueError, match=r"every one of the 5 runs is labelled insufficient.*threshold='median'"):
        label_runs(acc, 0.99)
    with pytest.raises(ValueError, match="threshold must be"):
        label_runs(acc, "mean")
    with pytest.raises(ValueError, match="empty"):
        label_runs([], 0.5)


def test_split_is_stratified_90_10_and_seeded():
    y = np.array([0] * 60 + [1] * 40)
    tr, te = split_runs(y, seed=3)
    assert len(te) == 10 and (y[te] == 1).sum() == 4 and (y[te] == 0).sum() == 6
    assert np.array_equal(te, split_runs(y, seed=3)[1])
    assert not np.array_equal(te, split_runs(y, seed=4)[1])


def _synthetic(n=120, d=10, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] + 0.5 * X[:, 3] > 0).astype(int)
    return X, y


def test_learns_a_known_rule_and_is_reproducible():
    X, y = _synthetic()
    clf = PerformancePredictor.spec(random_state=0).fit(X[:100], y[:100])  # the seed's MLP
    assert clf.score(X[100:], y[100:]) >= 0.85
    again = PerformancePredictor.spec(random_state=0).fit(X[:100], y[:100])
    np.testing.assert_array_equal(clf.predict_proba(X), again.predict_proba(X))
    # the default, a logistic regression with an L2 penalty: scikit-learn's coefficients
    from sklearn.linear_model import LogisticRegression

    from dtg_gpu.predictor import quantile_normal, training_quantiles

    lin = PerformancePredictor(random_state=0).fit(X[:100], y[:100])
    q = training_quantiles(X[:100])
    ref = LogisticRegression(C=1 / (0.1 * 100)).fit(quantile_normal(X[:100], q), y[:100])
    np.testing.assert_allclose(lin.network_[0].weight.detach().numpy()[0], ref.coef_[0], atol=0.08)
    sgd = PerformancePredictor(optimizer="sgd", learning_rate=0.05, hidden_sizes=(16, 8), random_state=1)
    assert sgd.fit(X[:100], y[:100]).score(X[100:], y[100:]) >= 0.8


@pytest.mark.parametrize("n_quantiles", [1000, 86, 10, 2])
def test_quantile_normal_matches_scikit_learn(n_quantiles):
    from sklearn.preprocessing import QuantileTransformer

    from dtg_gpu.predictor import quantile_normal, training_quantiles

    rng = np.random.default_rng(0)
    X = rng.standard_cauchy((86, 6))  # heavy tails, like centrality kurtosis across a sweep
    X[:, 3] = np.round(X[:, 3])  # ties
    X[:, 5] = 1.0  # a constant feature
    Y = np.vstack([X, 10 * rng.standard_cauchy((30, 6)), X[:5] + 1e-9, X[:5] - 1e-3])  # beyond, at the edges
    qt = QuantileTransformer(n_quantiles=min(n_quantiles, 86), output_distribution="normal").fit(X)
    q = training_quantiles(X, n_quantiles)
    np.testing.assert_array_equal(q, qt.quantiles_)
    np.testing.assert_allclose(quantile_normal(Y, q), qt.transform(Y), rtol=0, atol=1e-12)


def test_quantile_scaling_depends_on_ranks_only(tmp_path):
    X, y = _synthetic()
    X[:, 0] = X[:, 0] ** 3 * 1e4  # a heavy-tailed informative feature
    clf = PerformancePredictor(random_state=0, scaling="quantile").fit(X, y)
    assert clf.score(X, y) >= 0.9
    # a strictly increasing map of any feature leaves the training ranks, so the fit, unchanged
    Z = X.copy()
    Z[:, 0] = np.sinh(Z[:, 0] / 1e4)
    Z[:, 1] = np.exp(Z[:, 1])
    same = PerformancePredictor(random_state=0, scaling="quantile").fit(Z, y)
    np.testing.assert_allclose(same.predict_proba(Z), clf.predict_proba(X), atol=1e-6)
    clf.save(tmp_path / "q.safetensors")
    back = PerformancePredictor.load(tmp_path / "q.safetensors")
    assert back.scaling == "quantile"
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    with pytest.raises(ValueError, match="scaling must be one of"):
        PerformancePredictor(scaling="minmax").fit(X, y)


@pytest.mark.parametrize("scaling", ["standard", "quantile"])
def test_select_keeps_the_features_that_separate_the_classes(tmp_path, scaling):
    from sklearn.feature_selection import f_classif

    X, _ = _synthetic(n=120, d=40)
    y = (X[:, 0] + X[:, 3] > 0).astype(int)  # the label depends on columns 0 and 3 only
    X[:, 0] = np.exp(X[:, 0])  # skewed, as centrality statistics are
    X[:, 7] = 2.0  # a constant column scores 0, not NaN
    clf = PerformancePredictor(random_state=0, scaling=scaling, select=2).fit(X[:100], y[:100])
    assert clf.selected_.tolist() == [0, 3] and clf.network_[0].in_features == 2
    scaled = clf._scale_all(X[:100])
    np.testing.assert_allclose(np.delete(clf.scores_, 7), np.delete(f_classif(scaled, y[:100])[0], 7))
    assert clf.scores_[7] == 0
    # the MLP sees the selected columns only: the other 38 cannot move a prediction
    noisy = X.copy()
    noisy[:, [c for c in range(40) if c not in (0, 3)]] = 1e6
    np.testing.assert_array_equal(clf.predict_proba(noisy), clf.predict_proba(X))
    assert clf.score(X[100:], y[100:]) >= 0.85
    clf.save(tmp_path / "s.safetensors")
    back = PerformancePredictor.load(tmp_path / "s.safetensors")
    assert back.select == 2 and back.selected_.tolist() == [0, 3]
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    # select at or above the number of features is the SPEC behaviour, to the bit
    np.testing.assert_array_equal(
        PerformancePredictor(random_state=0, scaling=scaling, select=40).fit(X, y).predict_proba(X),
        PerformancePredictor(random_state=0, scaling=scaling).fit(X, y).predict_proba(X),
    )
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="select must be None or a positive integer"):
            PerformancePredictor(select=bad).fit(X, y)


def test_diverged_rows_are_insufficient_and_never_reach_the_mlp():
    X, y = _synthetic()
    X[5] = np.nan
    y[5] = 1  # even if labelled sufficient, it cannot be learned from
    clf = PerformancePredictor(random_state=0).fit(X, y)
    Xt = X[:10].copy()
    Xt[2, 4] = np.inf
    p = clf.predict_proba(Xt)
    assert p[2].tolist() == [1.0, 0.0] and p[5].tolist() == [1.0, 0.0]
    assert np.isfinite(p).all()
    with pytest.raises(ValueError, match="only one class"):
        PerformancePredictor().fit(X, np.ones(len(y)))


def test_save_load_round_trip(tmp_path):
    X, y = _synthetic()
    settings = {"alpha": 0.5, "timesteps": 2, "threshold": "median", "statistics": list(dtg_gpu.STATISTICS)}
    clf = PerformancePredictor(random_state=0, hidden_sizes=(8, 4), feature_settings=settings).fit(X, y)
    clf.save(tmp_path / "p.safetensors")
    back = PerformancePredictor.load(tmp_path / "p.safetensors")
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    assert back.feature_settings == settings and back.get_params()["hidden_sizes"] == (8, 4)
    (tmp_path / "junk.safetensors").write_bytes(b"not a model")
    with pytest.raises(dtg_gpu.CheckpointError, match="junk.safetensors"):
        PerformancePredictor.load(tmp_path / "junk.safetensors")


def test_evaluate_reports_intervals():
    X, y = _synthetic(n=100)
    scores = evaluate(PerformancePredictor(epochs=100), X, y, repeats=5, seed=0)
    for m in ("precision", "recall", "f1", "accuracy", "roc_auc", "average_precision"):
        s = scores[m]
        assert len(s["values"]) == 5 and s["ci_low"] <= s["mean"] <= s["ci_high"]
    assert scores["precision"]["mean"] > 0.75 and scores["roc_auc"]["mean"] > 0.85
    # the threshold-free scores are scikit-learn's on the same split and the same fit
    sss = StratifiedShuffleSplit(n_splits=1, test_size=0.1, random_state=3)
    train, test = next(sss.split(X, y))
    p = PerformancePredictor(epochs=100, random_state=3).fit(X[train], y[train]).predict_proba(X[test])[:, 1]
    assert scores["average_precision"]["values"][3] == pytest.approx(average_precision_score(y[test], p))
    assert scores["roc_auc"]["values"][3] == pytest.approx(roc_auc_score(y[test], p))
    assert np.sum(scores["confusion_matrix"]) == 5 * 10
    with pytest.raises(ValueError, match="only 1 run"):
        evaluate(PerformancePredictor(), X[:11], np.array([1] + [0] * 10))


def test_fit_uses_one_cpu_thread_and_restores_the_callers_count(monkeypatch):
    X, y = _synthetic()
    seen = []
    step = torch.optim.Adam.step

    def spy(self, *a, **k):
        seen.append(torch.get_num_threads())
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        PerformancePredictor(random_state=0, epochs=2).fit(X, y)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
