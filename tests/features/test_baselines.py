import numpy as np
import pytest
import scipy.stats
import torch
from conftest import make_checkpoints

from dtg_gpu import Run
from dtg_gpu.exceptions import InsufficientCheckpointsError
from dtg_gpu.features.baselines import (
    layer_eigenvalues,
    learning_curve,
    powerlaw_alpha,
    powerlaw_fit,
    spectral_alpha,
    weight_statistics,
)
from dtg_gpu.models import LeNet5


def _runs(n=3, t=3):
    model = LeNet5()
    return [
        Run(
            model=model,
            checkpoints=make_checkpoints(model, t=t, seed=s),
            name=f"r{s}",
            meta={"checkpoints": [{"val_accuracy": 0.1 * (s + i)} for i in range(t)]},
        )
        for s in range(n)
    ]


def test_weight_statistics_match_numpy():
    runs = _runs()
    X = weight_statistics(runs, 2)
    params = runs[0].topology.params
    assert X.shape == (3, 7 * len(params))
    w = runs[1].checkpoints[1][params[2]].double().numpy().ravel()
    want = [w.mean(), w.std()] + np.quantile(w, [0, 0.25, 0.5, 0.75, 1]).tolist()
    np.testing.assert_allclose(X[1, 14:21], want, rtol=1e-12)


def test_layer_eigenvalues_pool_conv_slices_like_weightwatcher():
    w = torch.randn(16, 6, 5, 5)
    ev = layer_eigenvalues(w).numpy()
    want = np.concatenate(
        [np.linalg.svd(w[:, :, i, j].double().numpy(), compute_uv=False) ** 2 for i in range(5) for j in range(5)]
    )
    np.testing.assert_allclose(np.sort(ev), np.sort(want), rtol=1e-10)
    lin = torch.randn(84, 120)
    np.testing.assert_allclose(
        np.sort(layer_eigenvalues(lin).numpy()),
        np.sort(np.linalg.eigvalsh(lin.double().T @ lin.double()).clip(0))[-84:],
        rtol=1e-8,
        atol=1e-8,
    )


@pytest.mark.parametrize("alpha", [2.0, 3.5, 5.0])
def test_powerlaw_fit_recovers_alpha_and_xmin(alpha):
    rng = np.random.default_rng(1)
    tail = 2.0 * (1 - rng.random(4000)) ** (-1 / (alpha - 1))  # Pareto from x_min = 2
    body = rng.uniform(0.1, 2.0, 4000)  # not a power law
    a, xmin = powerlaw_fit(np.concatenate([tail, body]))
    assert a == pytest.approx(alpha, rel=0.06)
    assert xmin == pytest.approx(2.0, rel=0.15)  # KS choice of x_min is noisy where the body meets the tail


def test_powerlaw_mle_agrees_with_scipy_at_the_chosen_xmin():
    rng = np.random.default_rng(2)
    x = rng.lognormal(size=500)
    a, xmin = powerlaw_fit(x)
    tail = x[x >= xmin]
    b, _, _ = scipy.stats.pareto.fit(tail, floc=0, fscale=xmin)  # continuous MLE, alpha = 1 + b
    assert a == pytest.approx(1 + b, rel=1e-6)
    assert powerlaw_alpha(x) == a


def test_powerlaw_degenerate_inputs_are_nan():
    assert np.isnan(powerlaw_alpha(np.array([1.0, np.inf, 2.0])))
    assert np.isnan(powerlaw_alpha(np.array([3.0, 3.0, 3.0])))
    assert np.isnan(powerlaw_alpha(np.array([5.0])))


def test_spectral_alpha_per_layer_and_nan_for_diverged_weights():
    runs = _runs(2)
    X = spectral_alpha(runs, 3)
    assert X.shape == (2, len(runs[0].topology.params)) and np.isfinite(X).all() and (X > 1).all()
    p = runs[0].topology.params[1]
    want = powerlaw_alpha(layer_eigenvalues(runs[1].checkpoints[2][p]).numpy())
    assert X[1, 1] == want
    runs[0].checkpoints[2][p][0, 0, 0, 0] = float("nan")
    X = spectral_alpha(runs, 3)
    assert np.isnan(X[0, 1]) and np.isfinite(np.delete(X, 1, axis=1)).all()


def test_learning_curve_reads_run_json_and_checks_k():
    runs = _runs(2, t=3)
    np.testing.assert_allclose(learning_curve(runs, 2), [[0.0, 0.1], [0.1, 0.2]])
    with pytest.raises(InsufficientCheckpointsError, match="timesteps=4.*'r0'.*3 checkpoints"):
        learning_curve(runs, 4)
    runs[1].meta = {}
    with pytest.raises(ValueError, match="'r1' records no validation accuracy"):
        learning_curve(runs, 2)
