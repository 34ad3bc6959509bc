"""The stopping rule's `covariates`: the runs' hyper-parameters beside their checkpoints, in
every front end (the rule, Optuna's trial.params, a run folder's run.json for dtg watch)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from dtg_gpu.early_stopping import StoppingRule, rule_options

LRS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def _noise(seed: int) -> list[dict]:
    """One checkpoint record that says nothing about the run (random statistics)."""
    rng = np.random.default_rng(seed)
    return [{"dtg": rng.normal(size=5).tolist(), "log_eigenvalue": float(rng.normal()), "layers": []}]


def _finished(n: int = 30) -> list[tuple]:
    """Runs whose checkpoints are noise; sufficient exactly when 1e-3 <= lr <= 0.1 (inside the range)."""
    return [
        (
            f"r{i}",
            _noise(i),
            None,
            0.9 if 1e-3 <= LRS[i % 5] <= 0.1 else 0.2,
            {"lr": LRS[i % 5], "dropout": 0.1 * (i % 3)},
        )
        for i in range(n)
    ]


def test_the_online_model_learns_an_optimum_inside_the_range_from_the_hyper_parameters():
    rule = StoppingRule(features="dtg", covariates=["lr", "dropout"])
    rec = _noise(1000)
    p = {lr: rule.probability(rec, None, _finished(), params={"lr": lr, "dropout": 0.1}) for lr in LRS}
    # the z^2 column: both ends below the cut, the middle far above it
    assert min(p[1e-3], p[1e-2], p[1e-1]) > 0.5 and max(p[1e-4], p[1.0]) < 0.3, p
    assert rule.should_stop([p[1e-4]]) and not rule.should_stop([p[1e-2]])
    # without covariates the same checkpoints give the same P whatever the learning rate
    plain = StoppingRule(features="dtg", covariates=None)
    q = {lr: plain.probability(rec, None, _finished(), params={"lr": lr}) for lr in LRS}
    assert len(set(q.values())) == 1 and 0.3 < q[1e-2] < 0.9
    # the default, "auto", reads every numeric hyper-parameter given: here lr and dropout, as named
    auto = StoppingRule(features="dtg")
    assert auto.covariates == "auto"
    assert {lr: auto.probability(rec, None, _finished(), params={"lr": lr, "dropout": 0.1}) for lr in LRS} == p


def test_missing_values_count_as_the_mean_and_nothing_breaks():
    rule = StoppingRule(features="dtg", covariates=["lr", "momentum"])  # no run has a momentum
    fin = _finished()
    fin[0] = fin[0][:4]  # a finished run given without params
    fin[1] = (*fin[1][:4], {"lr": "fast"})  # a value that is not a number
    p = rule.probability(_noise(7), None, fin, params=None)
    assert p is not None and 0 <= p <= 1 and math.isfinite(p)
    assert rule.probability(_noise(7), None, fin, params={"lr": 1e-2}) > 0.6


def test_learning_rates_are_taken_as_log10_as_featurize_takes_them():
    rule = StoppingRule(covariates=["lr", "dropout", "weight_decay"])
    H = rule._covariate_values(
        [{"lr": 0.01, "dropout": 0.5, "weight_decay": 0}, {"lr": "x", "dropout": True}, None], rule.covariates
    )
    assert H[0].tolist() == [-2.0, 0.5, -10.0]
    assert np.isnan(H[1]).all() and np.isnan(H[2]).all()  # a bool is not a number here
    from dtg_gpu.features.covariates import covariate_value

    # an int past what a float holds, or an infinity: not a finite number, so missing (not an error)
    assert all(math.isnan(covariate_value(n, v)) for n in ("lr", "dropout") for v in (10**400, float("inf")))


@pytest.mark.parametrize("bad", ["lr", [1, 2], [""], {"lr": 1}, np.array(["lr"])])
def test_covariates_must_be_a_list_of_names(bad):
    with pytest.raises(ValueError, match="covariates must be 'auto', None or a list of hyper-parameter names"):
        rule_options(covariates=bad)


def test_covariates_are_for_the_online_model_only():
    with pytest.raises(ValueError, match="covariates are read by the online model only"):
        StoppingRule(predictor=object(), covariates=["lr"])
    assert rule_options(covariates=["lr", "lr", "dropout"])["covariates"] == ("lr", "dropout")
    assert rule_options()["covariates"] == "auto"
    assert rule_options(covariates=None)["covariates"] is None
    # with a given predictor, "auto" reads nothing (and is no error)
    given = SimpleNamespace(feature_settings={"timesteps": 1}, classes_=[0, 1])
    assert StoppingRule(predictor=given).covariates is None


def test_the_optuna_pruner_reads_trial_params():
    optuna = pytest.importorskip("optuna")
    from dtg_gpu.integrations.optuna import _STEP, DTGPruner

    dist = {"lr": optuna.distributions.FloatDistribution(1e-5, 10, log=True)}
    pruner = DTGPruner(features="dtg", covariates=["lr"], use_values=False)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for _key, recs, _, final, params in _finished():
        study.enqueue_trial({"lr": params["lr"]})
        t = study.ask(dist)
        t.storage.set_trial_system_attr(t._trial_id, f"{_STEP}{0:09d}", recs[0])
        study.tell(t, final)
    verdicts = {}
    for lr in LRS:
        study.enqueue_trial({"lr": lr})
        t = study.ask(dist)
        t.storage.set_trial_system_attr(t._trial_id, f"{_STEP}{0:09d}", _noise(500)[0])
        verdicts[lr] = t.should_prune()
        study.tell(t, state=optuna.trial.TrialState.PRUNED if verdicts[lr] else optuna.trial.TrialState.FAIL)
    assert verdicts == {1e-4: True, 1e-3: False, 1e-2: False, 1e-1: False, 1.0: True}
    plain = DTGPruner(features="dtg", use_values=False, covariates=None)
    assert "covariates=('lr',)" in repr(pruner)
    assert "covariates=None" in repr(plain)
    assert "covariates='auto'" in repr(DTGPruner())


def test_ray_tune_front_end_reads_the_trial_config(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from torch import nn

    from dtg_gpu.integrations.ray_tune import _State

    state = _State(
        nn.Linear(2, 2), "acc", "max", None, rule_options(features="dtg", covariates=["lr"], use_values=False)
    )
    seeds = iter(range(10_000))
    monkeypatch.setattr(_State, "record_of", lambda self, tid, config, folder: _noise(next(seeds))[0])
    for key, _, _, final, params in _finished():
        state.observe(key, {"lr": params["lr"]}, tmp_path, {"acc": 0.5})  # stopped or not, it finishes here
        state.complete(key, {"acc": final})
    assert state.finished["r0"][3] == {"lr": 1e-4}
    # a stopper sees no config argument: the result's "config" is read
    stop = {lr: state.observe(f"new-{lr}", {}, tmp_path, {"acc": 0.5, "config": {"lr": lr}}) for lr in LRS}
    assert stop == {1e-4: True, 1e-3: False, 1e-2: False, 1e-1: False, 1.0: True}


def test_auto_reads_numeric_hyper_parameters_but_not_seeds_flags_or_words():
    from dtg_gpu.early_stopping import auto_covariates

    params = [
        {"lr": 0.1, "seed": 3, "data_seed": 1, "random_state": 0, "bn": True, "opt": "sgd"},
        None,
        {"momentum": 0.9, "lr": 0.01, "width": 4, "nan": float("nan")},
    ]
    assert auto_covariates(params) == ("lr", "momentum", "width")
    assert auto_covariates([]) == () and auto_covariates([None, {}]) == ()


def test_auto_ignores_a_seed_and_takes_a_rate_spanning_decades_as_log10():
    """A seed carries nothing; a rate under another name than lr (searched on a log scale,
    positive, spanning 100x) is taken as log10, so its optimum inside the range is learned
    as lr's is."""
    rule = StoppingRule(features="dtg")
    rec = _noise(1000)

    def renamed(fin):
        return [(*f[:4], {"step_size": f[4]["lr"], "seed": i % 7}) for i, f in enumerate(fin)]

    p = {lr: rule.probability(rec, None, renamed(_finished()), params={"step_size": lr, "seed": 5}) for lr in LRS}
    named = StoppingRule(features="dtg", covariates=["lr"])
    q = {
        lr: named.probability(rec, None, [(*f[:4], {"lr": f[4]["lr"]}) for f in _finished()], params={"lr": lr})
        for lr in LRS
    }
    assert p == pytest.approx(q, abs=1e-9)
    assert max(p[1e-4], p[1.0]) < 0.3 < min(p[1e-3], p[1e-2], p[1e-1])
    # nothing passed (a study without hyper-parameters): the checkpoints alone, as covariates=None
    none = StoppingRule(features="dtg", covariates=None)
    bare = StoppingRule(features="dtg")  # a fresh rule: a fit is cached by the finished runs' keys
    assert bare.probability(rec, None, [f[:4] for f in _finished()]) == none.probability(rec, None, _finished())


def test_the_optuna_pruner_reads_trial_params_by_default():
    optuna = pytest.importorskip("optuna")
    from dtg_gpu.integrations.optuna import _STEP, DTGPruner

    dist = {
        "lr": optuna.distributions.FloatDistribution(1e-5, 10, log=True),
        "seed": optuna.distributions.IntDistribution(0, 100),
    }
    study = optuna.create_study(direction="maximize", pruner=DTGPruner(features="dtg", use_values=False))
    for i, (_key, recs, _, final, params) in enumerate(_finished()):
        study.enqueue_trial({"lr": params["lr"], "seed": i})
        t = study.ask(dist)
        t.storage.set_trial_system_attr(t._trial_id, f"{_STEP}{0:09d}", recs[0])
        study.tell(t, final)
    verdicts = {}
    for lr in LRS:
        study.enqueue_trial({"lr": lr, "seed": 99})
        t = study.ask(dist)
        t.storage.set_trial_system_attr(t._trial_id, f"{_STEP}{0:09d}", _noise(500)[0])
        verdicts[lr] = t.should_prune()
        study.tell(t, state=optuna.trial.TrialState.PRUNED if verdicts[lr] else optuna.trial.TrialState.FAIL)
    assert verdicts == {1e-4: True, 1e-3: False, 1e-2: False, 1e-1: False, 1.0: True}


def test_auto_survives_whatever_a_front_end_passes():
    """Hyper-parameters come from user code (trial.params, a Ray config): any mix of numbers,
    NaN, infinities, huge or tiny values, bools, words, lists, dicts and None gives a P in
    [0, 1], never an exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    value = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**400), max_value=10**400),  # past what a float holds
        st.booleans(),
        st.text(max_size=3),
        st.none(),
        st.lists(st.floats(), max_size=2),
        st.dictionaries(st.text(max_size=2), st.floats(), max_size=2),
    )
    params = st.dictionaries(st.sampled_from(["lr", "dropout", "wd", "seed", "width", "x"]), value, max_size=5)

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(params, min_size=12, max_size=12), params)
    def check(finished, own):
        fin = [(f"r{i}", _noise(i), None, 0.9 if i % 2 else 0.2, p) for i, p in enumerate(finished)]
        p = StoppingRule(features="dtg").probability(_noise(99), None, fin, params=own)
        assert p is not None and 0.0 <= p <= 1.0

    check()
