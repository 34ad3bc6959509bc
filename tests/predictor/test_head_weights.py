"""`PerformancePredictor(head_weights="stacked")` (the default since 2026-12-07): the blocks'
probabilities weighted by out-of-fold stacking on the training data, and `mixture_weights`, the
convex problem under it; `head_weights="equal"`, their plain mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from predictor_files import file_parts, write_file
from scipy.optimize import minimize

from dtg_gpu.exceptions import CheckpointError
from dtg_gpu.predictor import PerformancePredictor
from dtg_gpu.predictor.estimator import mixture_weights


def _loglik(w, P, y):
    q = np.where(y[:, None] == 1, P, 1 - P)
    return float(np.log(q @ w).sum())


@pytest.mark.parametrize("seed", range(5))
def test_mixture_weights_maximise_the_likelihood_over_the_simplex(seed):
    rng = np.random.default_rng(seed)
    n, h = 80, 1 + seed % 4
    y = rng.integers(0, 2, n)
    # heads of different quality: the first follows the label, the others less so or not at all
    P = np.clip(0.5 + (y[:, None] - 0.5) * rng.uniform(0, 0.8, h) + rng.normal(0, 0.15, (n, h)), 0.02, 0.98)
    w = mixture_weights(P, y)
    assert w.shape == (h,) and (w >= 0).all() and w.sum() == pytest.approx(1.0)
    ref = minimize(  # SciPy's SLSQP on the simplex, an independent solver of the same problem
        lambda v: -_loglik(v, P, y),
        np.full(h, 1 / h),
        method="SLSQP",
        bounds=[(0, 1)] * h,
        constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1}],
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert _loglik(w, P, y) >= -ref.fun - 1e-5  # EM creeps to a boundary: a likelihood 1e-5 short at most
    np.testing.assert_allclose(w, ref.x, atol=2e-3)


def test_a_useless_head_gets_no_weight_and_a_perfect_one_all():
    y = np.array([0, 0, 1, 1])
    P = np.array([[0.1, 0.5], [0.2, 0.5], [0.9, 0.5], [0.8, 0.5]])
    np.testing.assert_allclose(mixture_weights(P, y), [1.0, 0.0], atol=1e-6)


def _data(n=120, seed=0):
    """Three blocks: the signal in the second, noise in the first and third."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 9))
    y = (X[:, 4] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y


def test_stacked_weights_favour_the_block_with_the_signal_and_are_what_predictions_use(tmp_path):
    X, y = _data()
    kw = dict(random_state=0, blocks=(3, 3, 3), block_models=("linear", "linear", "mlp"), epochs=60)
    eq = PerformancePredictor(**kw, head_weights="equal").fit(X, y)
    st = PerformancePredictor(**kw).fit(X, y)
    assert st.head_weights == "stacked"  # the default
    np.testing.assert_allclose(eq.block_weights_, [1 / 3] * 3)
    w = st.block_weights_
    assert w.sum() == pytest.approx(1.0) and w.argmax() == 1
    assert (w >= 1 / 6 - 1e-12).all()  # halfway to equal: no block drops below 1 / (2h)
    # the same heads (the final fit does not depend on the weights), combined with the weights
    heads = st._block_probabilities(X)
    np.testing.assert_allclose(heads, eq._block_probabilities(X))
    np.testing.assert_allclose(st.predict_proba(X)[:, 1], heads @ w)
    np.testing.assert_allclose(eq.predict_proba(X)[:, 1], heads.mean(1))
    # the weights are (w* + 1/h) / 2, w* from the training data's out-of-fold probabilities
    from sklearn.model_selection import StratifiedKFold

    oof = np.empty((len(y), 3))
    for tr, te in StratifiedKFold(3, shuffle=True, random_state=0).split(X, y):
        oof[te] = PerformancePredictor(**kw, head_weights="equal").fit(X[tr], y[tr])._block_probabilities(X[te])
    np.testing.assert_allclose(w, (mixture_weights(oof, y) + 1 / 3) / 2, rtol=1e-6)
    # saved (format /3) and read back as it was
    st.save(tmp_path / "s.safetensors")
    back = PerformancePredictor.load(tmp_path / "s.safetensors")
    np.testing.assert_allclose(back.block_weights_, w)
    np.testing.assert_allclose(back.predict_proba(X), st.predict_proba(X))
    assert file_parts(tmp_path / "s.safetensors")[1]["format"] == "dtg_gpu.PerformancePredictor/3"


def test_stacking_falls_back_to_equal_weights_when_a_class_is_too_small_for_folds():
    X, y = _data(40)
    y = np.zeros_like(y)
    y[0] = 1  # one sufficient run: no two folds can each hold one
    st = PerformancePredictor(random_state=0, blocks=(3, 6), head_weights="stacked", epochs=5).fit(X, y)
    np.testing.assert_allclose(st.block_weights_, [0.5, 0.5])


def test_head_weights_are_validated_and_need_blocks_to_matter():
    X, y = _data(40)
    with pytest.raises(ValueError, match="head_weights"):
        PerformancePredictor(head_weights="learned").fit(X, y)
    plain = PerformancePredictor(random_state=0, head_weights="stacked", epochs=5).fit(X, y)
    assert plain.blocks_ is None and plain.block_weights_ is None


@pytest.mark.parametrize(
    "tamper, field",
    [
        (lambda t, m: t.update(block_weights=torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)), "block_weights"),
        (lambda t, m: t.update(block_weights=torch.tensor([1.5, -0.5], dtype=torch.float64)), "block_weights"),
        (lambda t, m: t.update(block_weights=torch.tensor([float("nan"), 1.0], dtype=torch.float64)), "block_weights"),
        (lambda t, m: t.update(block_weights=torch.tensor([0, 1], dtype=torch.int64)), "block_weights"),
        (lambda t, m: t.pop("block_weights"), "go together"),
        (lambda t, m: m["params"].update(head_weights="equal"), "go together"),
        (lambda t, m: m["params"].pop("head_weights"), "go together"),  # a file without it means equal
        (lambda t, m: m.update(format="dtg_gpu.PerformancePredictor/1"), "go together"),
        (lambda t, m: m["params"].update(head_weights="learned"), "head_weights"),
    ],
)
def test_a_tampered_stacked_file_is_refused_naming_the_field(tmp_path, tamper, field):
    X, y = _data(60)
    clf = PerformancePredictor(random_state=0, blocks=(4, 5), head_weights="stacked", epochs=5)
    clf.fit(X, y).save(tmp_path / "ok.safetensors")
    tensors, meta = file_parts(tmp_path / "ok.safetensors")
    tamper(tensors, meta)
    write_file(tmp_path / "bad.safetensors", tensors, meta)
    with pytest.raises(CheckpointError, match=f"bad.safetensors: not a valid dtg_gpu predictor file: .*{field}"):
        PerformancePredictor.load(tmp_path / "bad.safetensors")


def test_files_older_versions_could_write_name_no_newer_parameter(tmp_path):
    """A predictor with `block_models="auto"` and `head_weights="equal"` writes the parameters
    format /1 had (what dtg_gpu read before block models), so older readers still load it; a
    file that does not name `head_weights` was written with equal weights and reads back so,
    whatever the default is now."""
    before = {
        "hidden_sizes", "epochs", "batch_size", "optimizer", "learning_rate", "weight_decay", "random_state",
        "device", "feature_settings", "scaling", "select", "auto", "column_sets", "auto_folds", "blocks",
    }  # fmt: skip
    X, y = _data(40)
    eq = PerformancePredictor(random_state=0, blocks=(4, 5), head_weights="equal", epochs=5).fit(X, y)
    eq.save(tmp_path / "p.safetensors")
    meta = file_parts(tmp_path / "p.safetensors")[1]
    assert meta["format"] == "dtg_gpu.PerformancePredictor/1" and set(meta["params"]) <= before
    back = PerformancePredictor.load(tmp_path / "p.safetensors")
    assert back.block_models == "auto" and back.head_weights == "equal"
    np.testing.assert_allclose(back.predict_proba(X), eq.predict_proba(X))


def test_the_default_writes_its_fitted_weights_and_names_them(tmp_path):
    X, y = _data(60)
    clf = PerformancePredictor(random_state=0, blocks=(4, 5), epochs=5).fit(X, y)
    clf.save(tmp_path / "d.safetensors")
    meta = file_parts(tmp_path / "d.safetensors")[1]
    assert meta["format"] == "dtg_gpu.PerformancePredictor/3" and meta["params"]["head_weights"] == "stacked"
    back = PerformancePredictor.load(tmp_path / "d.safetensors")
    assert back.head_weights == "stacked"
    np.testing.assert_allclose(back.block_weights_, clf.block_weights_)
    np.testing.assert_allclose(back.predict_proba(X), clf.predict_proba(X))
