"""The rule's options are taken in one place: every front end gets the same checked,
completed set, and an unknown or bad option is refused before anything runs."""

import pytest

from dtg_gpu.early_stopping import RULE_PARAMS, StoppingRule, rule_options


def test_defaults_are_filled_and_match_the_rule():
    opts = rule_options()
    assert set(opts) == set(RULE_PARAMS)
    rule = StoppingRule(**opts)
    assert all(getattr(rule, k) == v for k, v in opts.items()) and opts["min_probability"] == 0.3


def test_unknown_and_bad_options_are_refused_by_name():
    with pytest.raises(TypeError, match=r"unknown stopping-rule option\(s\) \['min_prob'\]"):
        rule_options(min_prob=0.2)
    with pytest.raises(ValueError, match="features must be one of"):
        rule_options(features="nope")


def test_the_front_ends_share_the_options():
    pytest.importorskip("optuna")
    pytest.importorskip("ray")
    from torch import nn

    from dtg_gpu.integrations.optuna import DTGPruner
    from dtg_gpu.integrations.ray_tune import DTGScheduler

    pruner = DTGPruner(n_peers=3, use_values=False)
    scheduler = DTGScheduler(model=nn.Linear(2, 2), n_peers=3, use_values=False)
    assert pruner._params == rule_options(n_peers=3, use_values=False)
    assert scheduler._dtg.rule_kw == pruner._params
    with pytest.raises(TypeError, match="unknown stopping-rule option"):
        DTGScheduler(model=nn.Linear(2, 2), patiance=2)


def test_online_fits_run_on_one_blas_thread(monkeypatch):
    """The refits happen inside training processes: OpenBLAS must not contend for their cores."""
    import numpy as np
    from threadpoolctl import threadpool_info

    seen = []
    fit = StoppingRule._fit

    def spy(self, rows, k, use_values):
        seen.append([i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"])
        return fit(self, rows, k, use_values)

    monkeypatch.setattr(StoppingRule, "_fit", spy)
    rec = [{"dtg": [0.1, 0.2, 0.3, 0.4, 0.5], "log_eigenvalue": 1.0, "layers": []}]
    finished = [(f"r{i}", [{**rec[0], "dtg": list(np.arange(5) * (i % 2) + i)}], None, float(i % 2)) for i in range(12)]
    rule = StoppingRule(features="dtg", n_startup_trials=10)
    p = rule.probability(rec, None, finished)
    assert seen and all(n == 1 for threads in seen for n in threads) and 0 <= p <= 1
