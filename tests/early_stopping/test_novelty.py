"""The stopping rule's novelty guard: the online model does not stop a run unlike every
finished run it was fitted on (a logistic regression extrapolates with confidence)."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from dtg_gpu.early_stopping import StoppingRule, rule_options
from dtg_gpu.early_stopping.rule import _novelty_reference


def _rec(x0: float, seed: int) -> list[dict]:
    """One checkpoint record: statistic 0 is `x0`, the others small noise."""
    rng = np.random.default_rng(seed)
    return [{"dtg": [x0, *(0.1 * rng.normal(size=4)).tolist()], "log_eigenvalue": 0.0, "layers": []}]


def _finished(n: int = 20) -> list[tuple]:
    """Sufficient runs have statistic 0 near +1, the others near -1."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        good = i % 2 == 0
        out.append((f"r{i}", _rec((1.0 if good else -1.0) + 0.2 * rng.normal(), i), None, 0.9 if good else 0.2))
    return out


def test_the_bar_is_the_largest_nearest_neighbour_distance():
    rng = np.random.default_rng(1)
    for Z in (rng.normal(size=(12, 7)), np.vstack([np.ones((3, 4)), rng.normal(size=(5, 4))])):
        D = cdist(Z, Z)
        np.fill_diagonal(D, np.inf)
        assert _novelty_reference(Z)[1] == pytest.approx(D.min(axis=1).max(), abs=1e-9)
    assert _novelty_reference(np.zeros((1, 3)))[1] == float("inf")  # one run: nothing is novel


def test_a_run_unlike_every_finished_one_is_not_the_models_to_stop():
    guarded, plain = StoppingRule(features="dtg", covariates=None), StoppingRule(features="dtg", novelty_guard=False)
    assert guarded.novelty_guard and rule_options()["novelty_guard"] is True
    fin = _finished()
    # like the finished bad runs: the model is sure, and the guard does not interfere
    like_bad = _rec(-1.0, 99)
    p = guarded.probability(like_bad, None, fin)
    assert p < 0.3 and p == plain.probability(like_bad, None, fin) and guarded.should_stop([p])
    # far beyond them (statistic 0 at -40): the model extrapolates to P ~ 0 ...
    far = _rec(-40.0, 99)
    q = plain.probability(far, None, fin)
    assert q < 1e-6 and plain.should_stop([q])
    # ... and the guard keeps the run at this check
    assert guarded.probability(far, None, fin) == pytest.approx(0.3) and not guarded.should_stop([0.3])
    # a run the model thinks good is never touched
    good = _rec(+40.0, 99)
    assert guarded.probability(good, None, fin) == plain.probability(good, None, fin) > 0.99


def test_a_run_like_the_finished_ones_is_guarded_about_once_in_n_plus_one():
    """Exchangeable rows: the chance of being farther from the n finished rows than any of
    them is from its nearest other is about 1/(n+1)."""
    rng = np.random.default_rng(2)
    n, hits, draws = 30, 0, 400
    for _ in range(draws):
        Z = rng.normal(size=(n + 1, 6))
        ref, far = _novelty_reference(Z[:n])
        hits += np.sqrt(((ref - Z[n]) ** 2).sum(axis=1)).min() > far
    assert 0.005 < hits / draws < 0.1, hits


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_novelty_guard_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="novelty_guard must be True or False"):
        StoppingRule(novelty_guard=bad)
