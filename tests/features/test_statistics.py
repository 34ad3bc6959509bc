import numpy as np
import pytest
import scipy.stats
import torch

from dtg_gpu import STATISTICS, temporal_features, temporal_reinforcement, timestep_statistics


def _numpy_stats(x):
    with np.errstate(all="ignore"):
        return [np.mean(x), np.std(x), np.median(x), scipy.stats.skew(x), scipy.stats.kurtosis(x)]


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 2e-4)])
def test_statistics_match_numpy_scipy(dtype, rtol, device):
    rng = np.random.default_rng(0)
    x = rng.gamma(2.0, size=(7, 33)) / 10
    x[3, :] = 0.25  # constant row: skewness and kurtosis are NaN
    x[4, :] = np.sort(x[4, :])[::-1]
    out = timestep_statistics(torch.tensor(x, dtype=dtype, device=device)).cpu().double().numpy()
    for i in range(7):
        ref = np.array(_numpy_stats(x[i].astype(np.float32) if dtype == torch.float32 else x[i]), dtype=float)
        np.testing.assert_allclose(out[i], ref, rtol=rtol, atol=1e-7, equal_nan=True)
    assert np.isnan(out[3, 3:]).all() and out[3, 1] == 0


def test_tiny_vectors_keep_finite_skewness_and_kurtosis_in_float32():
    """A depthwise layer's centrality can be ~1e-20 (MobileNet): its second moment squared
    underflows float32, which once gave an infinite kurtosis and marked good runs diverged."""
    rng = np.random.default_rng(2)
    x = rng.gamma(2.0, size=(3, 40))
    tiny = timestep_statistics(torch.tensor(x * 1e-20, dtype=torch.float32)).double().numpy()
    assert np.isfinite(tiny).all()
    for i in range(3):  # skewness and kurtosis are scale-free: scipy's on the unscaled vector
        ref = np.array(_numpy_stats(x[i]), dtype=float)
        np.testing.assert_allclose(tiny[i, 3:], ref[3:], rtol=2e-4)
        np.testing.assert_allclose(tiny[i, :3], ref[:3] * 1e-20, rtol=2e-4)


def test_ragged_statistics_with_ptr_and_even_median():
    rng = np.random.default_rng(1)
    parts = [rng.random(n) for n in (4, 9, 1, 16)]
    ptr = torch.tensor(np.cumsum([0] + [len(p) for p in parts]))
    out = timestep_statistics(torch.tensor(np.concatenate(parts)), ptr=ptr).numpy()
    for i, p in enumerate(parts):
        np.testing.assert_allclose(out[i], _numpy_stats(p), rtol=1e-10, equal_nan=True)
    assert out[0, 2] == pytest.approx(np.median(parts[0]))  # mean of the two middle values
    with pytest.raises(ValueError, match="at least one entry"):
        timestep_statistics(torch.zeros(3), ptr=torch.tensor([0, 0, 3]))


def test_nan_row_is_all_nan():
    x = torch.rand(2, 5)
    x[1, 2] = float("nan")
    out = timestep_statistics(x)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()


def _loop_smoothing(s, alpha):
    out = np.empty_like(s)
    out[0] = s[0]
    for t in range(1, len(s)):
        out[t] = alpha * s[t] + (1 - alpha) * out[t - 1]
    return out


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9, 1.0])
def test_reinforcement_matches_the_recursion(alpha):
    s = np.random.default_rng(2).normal(size=(3, 12, 5))
    got = temporal_reinforcement(torch.tensor(s), alpha).numpy()
    for r in range(3):
        np.testing.assert_allclose(got[r], _loop_smoothing(s[r], alpha), rtol=1e-12)
    if alpha == 1.0:
        np.testing.assert_array_equal(got, s)
    f = temporal_features(torch.tensor(s), alpha, timesteps=4)
    assert f.shape == (3, 20)
    np.testing.assert_allclose(f[1].numpy(), _loop_smoothing(s[1, :4], alpha).reshape(-1), rtol=1e-12)


def test_reinforcement_errors():
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        temporal_reinforcement(torch.zeros(3, 5), 0.0)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        temporal_reinforcement(torch.zeros(3, 5), 1.5)
    with pytest.raises(ValueError, match=r"timesteps must be in \[1, 3\]"):
        temporal_features(torch.zeros(3, 5), 0.5, timesteps=4)
    assert STATISTICS == ("mean", "std", "median", "skewness", "kurtosis")
