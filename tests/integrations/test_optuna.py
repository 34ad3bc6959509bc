"""dtg_gpu.integrations.optuna: report(), DTGPruner, a real study killed and resumed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

optuna = pytest.importorskip("optuna")

import dtg_gpu  # noqa: E402
from dtg_gpu.early_stopping import StoppingRule, checkpoint_record, feature_vector, peer_score  # noqa: E402
from dtg_gpu.features.statistics import timestep_statistics  # noqa: E402
from dtg_gpu.integrations.optuna import (  # noqa: E402
    DTGPruner,
    checkpoint_folder,
    report,
    set_checkpoint_folder,
    trial_records,
    trial_run,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
HERE = Path(__file__).resolve().parents[1]  # tests/: the helper optuna_study.py


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def test_report_in_memory_records_checkpoint_and_value():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    net = _net()
    report(trial, net, 0, value=0.5)
    with torch.no_grad():
        net[0].weight.mul_(3)
    report(trial, net, 3)
    frozen = study.trials[0]
    steps, recs = trial_records(frozen)
    assert steps == [0, 3]
    assert frozen.intermediate_values == {0: 0.5}
    assert checkpoint_folder(study) is None
    run = trial_run(study, frozen, _net())
    assert len(run) == 2
    torch.testing.assert_close(run.weights(1)["0.weight"], net[0].weight.detach())
    # the record is the SPEC's statistics of the checkpoint's centrality
    res = dtg_gpu.analyze(run, dtype=torch.float64)
    np.testing.assert_allclose(recs[1]["dtg"], timestep_statistics(res.centrality)[1].numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(recs[1]["log_eigenvalue"], float(res.eigenvalue[1].log()), rtol=1e-4)


def test_report_sqlite_writes_safetensors_beside_the_database(tmp_path):
    db = tmp_path / "study.db"
    study = optuna.create_study(study_name="my study/1", storage=f"sqlite:///{db}")
    trial = study.ask()
    report(trial, _net(), 7, value=0.25)
    folder = checkpoint_folder(study)
    assert folder == tmp_path / "study.db.dtg" / "my_study_1"
    files = sorted(p.name for p in (folder / "trial-000000").iterdir())
    assert files == ["step-000000007.safetensors"]  # no temporary left behind
    from safetensors.torch import load_file

    torch.testing.assert_close(load_file(folder / "trial-000000" / files[0])["2.weight"], _net()[2].weight.detach())
    # another process (a fresh load of the same storage) sees the same record and file
    again = optuna.load_study(study_name="my study/1", storage=f"sqlite:///{db}")
    run = trial_run(again, again.trials[0], _net())
    assert [Path(c).name for c in run.checkpoints] == files


def test_report_journal_storage_and_explicit_folder(tmp_path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(tmp_path / "j.log"))))
    report(study.ask(), _net(), 0)
    assert (tmp_path / "j.log.dtg" / study.study_name / "trial-000000" / "step-000000000.safetensors").is_file()
    set_checkpoint_folder(study, tmp_path / "shared")
    report(study.ask(), _net(), 0)
    assert (tmp_path / "shared" / "trial-000001" / "step-000000000.safetensors").is_file()


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_report_refuses_bad_steps(step):
    study = optuna.create_study()
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        report(study.ask(), _net(), step)


def test_report_refuses_bad_values_models_and_trials():
    study = optuna.create_study()
    with pytest.raises(ValueError, match="value must be a finite number"):
        report(study.ask(), _net(), 0, value=float("nan"))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        report(study.ask(), {"w": torch.ones(2)}, 0)
    with pytest.raises(TypeError, match="optuna.trial.Trial"):
        report(study.trials[0], _net(), 0)


def test_multi_objective_is_refused_clearly_but_checkpoints_record():
    study = optuna.create_study(directions=["maximize", "minimize"])
    trial = study.ask()
    with pytest.raises(ValueError, match="multi-objective"):
        report(trial, _net(), 0, value=0.3)
    report(trial, _net(), 0)  # no value: the checkpoint is still recorded
    assert trial_records(study.trials[0])[0] == [0]
    with pytest.raises(ValueError, match="multi-objective"):
        DTGPruner().probability(study, study.trials[0])


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"min_probability": 1.5}, "min_probability"),
        ({"patience": 0}, "patience"),
        ({"features": "nope"}, "features"),
        ({"threshold": "mean"}, "threshold"),
        ({"use_values": "yes"}, "use_values"),
        ({"n_startup_trials": -1}, "n_startup_trials"),
    ],
)
def test_pruner_parameters_checked_when_made(kw, match):
    with pytest.raises(ValueError, match=match):
        DTGPruner(**kw)


def _records(scale: float, steps: int, seed: int) -> list[dict]:
    """Checkpoint records of a small net whose first layer grows at ``scale`` per step."""
    net = _net(seed)
    out = []
    for _s in range(steps):
        with torch.no_grad():
            net[0].weight[0].mul_(scale)
        out.append(checkpoint_record(net))
    return out


def test_online_rule_learns_direction_and_prunes_the_bad_kind():
    good = [(f"g{i}", _records(1.0, 4, i), None, 0.9 + 0.001 * i) for i in range(6)]
    bad = [(f"b{i}", _records(2.5, 4, 10 + i), None, 0.1 + 0.001 * i) for i in range(6)]
    rule = StoppingRule(n_startup_trials=10, min_probability=0.3, patience=2)
    p_bad = [rule.probability(_records(2.5, 4, 99)[:k], None, good + bad) for k in range(1, 5)]
    p_good = [rule.probability(_records(1.0, 4, 98)[:k], None, good + bad) for k in range(1, 5)]
    assert p_bad[-1] < 0.3 < p_good[-1]
    assert rule.should_stop(p_bad[-2:]) and not rule.should_stop(p_good)
    # minimising: the same runs, the labels flip
    flipped = [(k, r, v, 1 - f) for k, r, v, f in good + bad]
    low = StoppingRule(direction="minimize", n_startup_trials=10)
    assert low.probability(_records(2.5, 4, 99), None, flipped) < 0.3
    # too few finished runs and no warm start: no decision
    cold = StoppingRule(n_startup_trials=10, warm_start=False)
    assert cold.probability(_records(2.5, 4, 99), None, good[:3] + bad[:3]) is None


def _lam(*logs: float) -> list[dict]:
    """Records whose graph's log λ₁ is ``logs`` (finite centrality statistics)."""
    return [{"dtg": [0.1] * 5, "log_eigenvalue": v} for v in logs]


def test_peer_score_is_the_growth_of_log_lambda():
    assert peer_score(_lam(1.0, 1.25, 2.0), 3) == 1.0
    assert peer_score(_lam(1.0, 1.25, 2.0), 2) == 0.25
    assert peer_score(_lam(1.0), 1) is None  # nothing has grown at the first checkpoint
    assert peer_score(_lam(1.0, None), 2) == float("-inf")  # diverged: behind everyone


def test_warm_start_compares_with_peers_before_anything_finished():
    rule = StoppingRule(n_peers=4)
    peers = [(f"p{i}", _lam(0.0, g, g), None) for i, g in enumerate([0.1, 0.4, 0.5, 0.9, 2.0])]
    # growth 0.45 at checkpoint 3: two of five peers below it
    assert rule.probability(_lam(0.0, 0.2, 0.45), None, [], peers) == pytest.approx(2 / 5)
    # growth 0.05: below every peer: stopped, as MedianPruner would a value behind the others
    low = rule.probability(_lam(0.0, 0.0, 0.05), None, [], peers)
    assert low == 0.0 and rule.should_stop([low])
    # ties count half
    assert rule.probability(_lam(0.0, 0.0, 0.5), None, [], peers) == pytest.approx(2.5 / 5)
    # peers that have not reached checkpoint 3 do not count; too few peers: no decision
    short = [(f"s{i}", _lam(0.0, 9.0), None) for i in range(3)]
    assert rule.probability(_lam(0.0, 0.2, 0.45), None, [], peers[:3] + short) is None
    assert rule.probability(_lam(0.0), None, [], peers) is None  # first checkpoint: no growth yet
    # finished runs are peers too (once each, by key)
    fin = [(k, r, v, 0.5) for k, r, v in peers[:2]]
    assert rule.probability(_lam(0.0, 0.2, 0.45), None, fin, peers) == pytest.approx(2 / 5)
    # the reported value joins in: the mean of the two shares, in the study's direction
    vals = [(k, r, [0.1, 0.2, 0.1 * (i + 1)]) for i, (k, r, _) in enumerate(peers)]
    mine = _lam(0.0, 0.2, 0.45)
    assert rule.probability(mine, [0.1, 0.2, 0.45], [], vals) == pytest.approx((2 / 5 + 4 / 5) / 2)
    mini = StoppingRule(n_peers=4, direction="minimize")
    assert mini.probability(mine, [0.1, 0.2, 0.45], [], vals) == pytest.approx((2 / 5 + 1 / 5) / 2)
    assert StoppingRule(n_peers=4, use_values=False).probability(mine, [0.1, 0.2, 0.45], [], vals) == pytest.approx(
        2 / 5
    )
    # switched off: the rule of 0.x (nothing decided before the online model exists)
    assert StoppingRule(warm_start=False).probability(_lam(0.0, 0.0, 0.05), None, [], peers) is None


def test_the_learned_model_takes_over_once_runs_have_finished():
    good = [(f"g{i}", _records(1.0, 4, i), None, 0.9 + 0.001 * i) for i in range(6)]
    bad = [(f"b{i}", _records(2.5, 4, 10 + i), None, 0.1 + 0.001 * i) for i in range(6)]
    rule = StoppingRule(n_startup_trials=10)
    # the bad kind grows its first layer fastest: peers alone would rank it first
    peers = [(k, r, v) for k, r, v, _ in good + bad]
    assert rule.probability(_records(2.5, 4, 99), None, [], peers) > 0.5
    assert rule.probability(_records(2.5, 4, 99), None, good + bad, peers) < 0.3


def test_pruner_warm_start_prunes_a_trial_that_does_not_move_before_any_completes():
    study = optuna.create_study(direction="maximize", pruner=DTGPruner(n_peers=3))
    net = _net(0)
    running = []
    for i in range(4):  # four trials that learn (their first layer grows), none finished
        t = study.ask()
        for s in range(3):
            with torch.no_grad():
                net[0].weight.mul_(1.0 + 0.2 * (i + 1))
            report(t, net, s)
        running.append(t)
    still = study.ask()  # a trial whose weights do not move
    flat = _net(1)
    report(still, flat, 0)
    assert not still.should_prune()  # first checkpoint: nothing to compare yet
    report(still, flat, 1)
    assert still.should_prune()
    with pytest.raises(ValueError, match="n_peers"):
        DTGPruner(n_peers=0)


def test_diverged_weights_stop_at_once():
    net = _net()
    rec = checkpoint_record(net)
    with torch.no_grad():
        net[0].weight[0, 0] = float("nan")
    nan = checkpoint_record(net)
    assert nan["dtg"] == [None] * 5
    rule = StoppingRule()
    assert rule.probability([rec, nan], None, []) == 0.0
    assert rule.should_stop([None, 0.0], diverged=True)


def test_given_predictor_is_used_at_its_own_k():
    from dtg_gpu.predictor import PerformancePredictor

    runs = [(_records(1.0, 3, i), 1) for i in range(8)] + [(_records(2.5, 3, 20 + i), 0) for i in range(8)]
    X = np.stack([feature_vector(r, 2) for r, _ in runs])
    y = np.array([lab for _, lab in runs])
    clf = PerformancePredictor(random_state=0, epochs=200, feature_settings={"timesteps": 2, "alpha": 0.5}).fit(X, y)
    rule = StoppingRule(predictor=clf)
    recs = _records(2.5, 3, 77)
    assert rule.probability(recs[:1], None, []) is None  # before the predictor's k
    assert rule.probability(recs[:2], None, []) == pytest.approx(clf.predict_proba(feature_vector(recs, 2)[None])[0, 1])
    with pytest.raises(ValueError, match="fitted PerformancePredictor"):
        StoppingRule(predictor=PerformancePredictor())


@pytest.mark.slow
def test_real_study_prunes_keeps_the_best_and_resumes_with_the_same_decisions(tmp_path):
    """LeNet-5 on digits, 4 epochs a trial, SQLite: killed in trial 9, then resumed."""
    db = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]), "OMP_NUM_THREADS": "1"}
    script = [sys.executable, str(HERE / "optuna_study.py"), str(db), "16"]
    first = subprocess.run(script + ["--kill-at", "9"], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == -9, first.stderr
    before = optuna.load_study(study_name="lenet", storage=f"sqlite:///{db}")
    states_before = {t.number: (t.state, t.value, dict(t.system_attrs)) for t in before.trials}
    assert states_before[9][0] == optuna.trial.TrialState.RUNNING
    second = subprocess.run(script, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    study = optuna.load_study(study_name="lenet", storage=f"sqlite:///{db}")
    trials = study.trials
    # decisions made before the kill are kept as they were
    for t in trials:
        if t.number < 9:
            assert (t.state, t.value, dict(t.system_attrs)) == states_before[t.number]
    assert trials[9].state == optuna.trial.TrialState.FAIL
    done = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(done) == 16
    pruned = [t for t in done if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "no trial was pruned"
    # the best trial is intact: complete, every epoch's checkpoint on disk and readable
    best = study.best_trial
    assert best.state == optuna.trial.TrialState.COMPLETE and len(trial_records(best)[0]) == 4
    assert best.params["lr"] in (0.02, 0.03, 0.05, 0.1)
    from dtg_gpu.models import LeNet5

    res = dtg_gpu.analyze(trial_run(study, best, LeNet5()))
    assert res.converged.all()
    # every stored decision follows from the storage alone: a fresh rule, given the trials that
    # had completed before the trial started (with their params: covariates="auto" reads them),
    # recomputes each probability exactly
    rule = StoppingRule(n_startup_trials=4, use_values=False, features="dtg_per_layer", min_probability=0.3, patience=1)
    for t in done:
        steps, recs = trial_records(t)
        finished = [
            (u.number, trial_records(u)[1], None, u.value, u.params)
            for u in trials
            if u.state == optuna.trial.TrialState.COMPLETE and u.datetime_complete < t.datetime_start
        ]
        for s, step in enumerate(steps):
            stored = t.system_attrs[f"dtg:p:{step:09d}"]
            again = rule.probability(recs[: s + 1], None, finished, params=t.params)
            assert (stored is None and again is None) or stored == pytest.approx(again, abs=1e-9)
        assert (t.state == optuna.trial.TrialState.PRUNED) == rule.should_stop(
            [t.system_attrs[f"dtg:p:{st:09d}"] for st in steps]
        )


def test_the_value_median_test_stops_a_run_behind_the_finished_ones():
    """With the value, a run behind the finished runs' median value at its checkpoint gets P = 0
    (Optuna's MedianPruner test, its best value so far); otherwise the checkpoints stop it only
    below value_median, not min_probability."""
    fin = [(f"f{i}", _lam(0.0, 0.1 * i), [0.2, 0.5 + 0.1 * i], 0.5 + 0.1 * i) for i in range(5)]  # median at k=2: 0.7
    rule = StoppingRule(warm_start=False)  # P None from the checkpoints: only the value decides
    mine = _lam(0.0, 0.2)
    assert rule.probability(mine, [0.3, 0.6], fin) == 0.0 and rule.should_stop([None, 0.0], values=[0.3, 0.6])
    assert rule.probability(mine, [0.75, 0.6], fin) is None  # its best so far (0.75) is not behind
    assert rule.probability(mine, [0.3, 0.6], fin[:4]) is None  # fewer than 5 finished: no test
    mini = StoppingRule(warm_start=False, direction="minimize")
    assert mini.probability(mine, [0.3, 0.6], fin) is None and mini.probability(mine, [0.9, 0.8], fin) == 0.0
    assert StoppingRule(warm_start=False, value_median=None).probability(mine, [0.3, 0.6], fin) is None
    assert StoppingRule(warm_start=False, use_values=False).probability(mine, [0.3, 0.6], fin) is None
    assert rule.probability(mine, [0.3, None], fin) is None  # a value missing: decided from the weights alone
    # the cut: 0.2 stops a run without values (min_probability 0.3), not one that took the value's test
    assert rule.should_stop([0.2], values=None) and not rule.should_stop([0.2], values=[0.9])
    assert rule.should_stop([0.05], values=[0.9])
    assert StoppingRule(value_median=None).should_stop([0.2], values=[0.9])
    for bad in (0, 0.0, 1.5, True, "x"):
        with pytest.raises(ValueError, match="value_median must be in"):
            StoppingRule(value_median=bad)


def test_a_run_leading_by_value_is_not_the_checkpoints_to_stop():
    """value_leader=0.75 (the default of 2026-12-08; now 0.5): with the value's test on, a run
    whose best value so far is in the finished runs' top quarter at its checkpoint gets
    P >= value_median (the checkpoints alone cannot stop it); below that quantile, or with
    value_leader=None, the checkpoints' P stands."""
    # the checkpoints say "bad" for every run like `mine` (log lambda flat), "good" for growing ones;
    # the values (one per pair of a good and a bad run) say nothing
    fin = [
        (f"f{i}", _lam(0.0, 0.5 * (i % 2)), [0.2, 0.5 + 0.04 * (i // 2)], 0.9 if i % 2 else 0.2, {}) for i in range(12)
    ]
    values_at_2 = np.array([f[2][1] for f in fin])
    q75 = float(np.quantile(values_at_2, 0.75))
    rule = StoppingRule(
        warm_start=False, n_startup_trials=10, features="dtg+eigenvalue", covariates=None, C=100.0, value_leader=0.75
    )
    plain = StoppingRule(
        warm_start=False, n_startup_trials=10, features="dtg+eigenvalue", covariates=None, C=100.0, value_leader=None
    )
    mine = _lam(0.0, 0.0)
    low = plain.probability(mine, [0.3, q75], fin)
    assert low is not None and low < 0.1  # the checkpoints are sure ...
    assert plain.should_stop([low], values=[0.3, q75])  # ... and stop it without the guard
    lead = rule.probability(mine, [0.3, q75], fin)
    assert lead == pytest.approx(0.1) and not rule.should_stop([lead], values=[0.3, q75])  # at q75: kept
    below = q75 - 1e-6  # ahead of the median, just below the top quarter: the checkpoints decide
    assert float(np.median(values_at_2)) < below and rule.probability(mine, [0.3, below], fin) == low
    # minimize: leading means low values
    mini = StoppingRule(
        warm_start=False,
        n_startup_trials=10,
        features="dtg+eigenvalue",
        covariates=None,
        direction="minimize",
        threshold=0.5,
        value_leader=0.75,
    )
    q25 = float(np.quantile(values_at_2, 0.25))
    assert mini.probability(mine, [0.9, q25], fin) >= 0.1
    # the default (0.5): ahead of the median is enough
    default = StoppingRule(warm_start=False, n_startup_trials=10, features="dtg+eigenvalue", covariates=None, C=100.0)
    assert default.value_leader == 0.5 and default.probability(mine, [0.3, below], fin) == pytest.approx(0.1)
    for bad in (0, 1, 1.5, True, "x"):
        with pytest.raises(ValueError, match="value_leader must be in"):
            StoppingRule(value_leader=bad)


def _replay_values(pruner, curves: np.ndarray, finals: np.ndarray, grow: bool = False) -> list[tuple[int, int]]:
    """A study of `len(curves)` trials reporting `curves[i]` as values (and `_net(i)` as
    weights, scaled by 1 + finals[i] at every step with `grow`: log lambda then grows with the
    final accuracy); returns the (trial, step) pairs pruned."""
    study = optuna.create_study(direction="maximize", pruner=pruner)
    cut = []
    for i, curve in enumerate(curves):
        t, net = study.ask(), _net(i)
        for s, v in enumerate(curve):
            if grow:
                with torch.no_grad():
                    for p in net.parameters():
                        p.mul_(1.0 + finals[i])
            report(t, net, s, float(v))
            if t.should_prune():
                cut.append((i, s))
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(t, float(finals[i]))
    return cut


def test_with_the_value_the_pruner_prunes_what_median_pruner_prunes():
    """The value's test is Optuna's MedianPruner, decision for decision: replayed on one random
    study with the checkpoints unable to decide (no online model, no warm start)."""
    rng = np.random.default_rng(0)
    curves = np.cumsum(rng.uniform(-0.08, 0.1, size=(24, 5)), axis=1)  # not monotone: best so far matters
    finals = curves[:, -1] + rng.normal(0, 0.02, 24)
    ours = _replay_values(DTGPruner(use_values=True, warm_start=False, n_startup_trials=1000), curves, finals)
    assert ours == _replay_values(optuna.pruners.MedianPruner(), curves, finals) and len(ours) >= 5
    # value_median=None: the value is one input to P, nothing is cut without the online model
    plain = DTGPruner(use_values=True, warm_start=False, n_startup_trials=1000, value_median=None)
    assert _replay_values(plain, curves, finals) == []


def test_by_default_the_value_decides_once_five_trials_completed():
    """value_leader=0.5 (default): once 5 trials have completed, a trial at or above their median
    value is not the checkpoints' to prune and one below it is pruned by the value's test, so the
    pruner decides as MedianPruner does, even where the checkpoints' online model (which knows
    the final accuracy from the weights here) would prune more: with value_leader=None it does."""
    rng = np.random.default_rng(1)
    curves = np.cumsum(rng.uniform(-0.08, 0.1, size=(30, 5)), axis=1)
    finals = rng.uniform(0, 1, 30)  # the values say nothing of it; the weights do

    def replay(pruner) -> list[tuple[int, int]]:
        return _replay_values(pruner, curves, finals, grow=True)

    options = dict(use_values=True, warm_start=False, n_startup_trials=5, covariates=None)
    median = replay(optuna.pruners.MedianPruner())
    assert replay(DTGPruner(**options)) == median and len(median) >= 5
    more = replay(DTGPruner(**options, value_leader=None))
    assert set(more) - set(median)  # the checkpoints alone would prune trials the value keeps
