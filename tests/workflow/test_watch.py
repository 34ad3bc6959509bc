"""dtg watch / SweepWatcher: verdicts on a sweep while it trains; dtg predict's verdict column."""

from __future__ import annotations

import json
import shutil

import pytest

from dtg_gpu.cli.main import main
from dtg_gpu.early_stopping import StoppingRule
from dtg_gpu.sweeps import SweepConfig, run_sweep
from dtg_gpu.workflow.watch import SweepWatcher

# 3 learning rates that train (0.05, 0.03, 0.02) and 3 that barely move (1e-5, 2e-5, 3e-5), 2 seeds
CFG = SweepConfig(
    model="lenet5", dataset="digits", lrs=(0.05, 1e-5, 0.03, 2e-5, 0.02, 3e-5), dropouts=(0.0,), seeds=2, epochs=4
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return run_sweep(CFG, tmp_path_factory.mktemp("watch") / "sweep", progress=False, device="cpu")


@pytest.fixture
def live(sweep, tmp_path):
    """A copy of the sweep where two runs are still training: a good one (lr 0.05, seed 1) and
    a bad one (lr 1e-5, seed 1) have their checkpoints but no run.json yet; one has no checkpoint."""
    out = tmp_path / "live"
    shutil.copytree(sweep, out)
    meta = json.loads((out / "sweep.json").read_text())
    names = meta["runs"]
    good, bad, empty = names[1], names[3], names[5]  # grid order: lr-major, then seed
    for n in (good, bad):
        (out / n / "run.json").unlink()
    for f in (out / empty).iterdir():
        f.unlink()
    for f in sorted((out / good).glob("ckpt-*"))[2:]:  # the good one has only 2 checkpoints so far
        f.unlink()
    return out, good, bad, empty


def test_watcher_judges_running_runs_from_the_finished_ones(live):
    out, good, bad, empty = live
    w = SweepWatcher(out, rule=StoppingRule(n_startup_trials=6, use_values=False))
    v = {x.run: x for x in w.poll()}
    assert v[empty].verdict == "wait" and v[empty].checkpoints == 0
    assert v[good].checkpoints == 2 and v[bad].checkpoints == 4
    assert v[bad].verdict == "stop" and v[bad].p_sufficient < 0.3
    assert v[good].verdict == "continue" and v[good].p_sufficient > 0.5
    assert sum(x.verdict == "finished" for x in v.values()) == 9
    # a new checkpoint lands: only it is summarised, and the verdict is updated
    n_before = len(w._seen[good].records)
    shutil.copy(sorted((out / bad).glob("ckpt-*"))[0], out / good / "ckpt-0003.safetensors")
    v2 = {x.run: x for x in w.poll()}
    assert v2[good].checkpoints == 3 and len(w._seen[good].records) == n_before + 1


def test_watcher_warm_start_judges_before_any_run_finished(sweep, tmp_path):
    """No run.json anywhere (all twelve runs still training): the runs that do not move are
    behind their peers and stopped, the ones that learn continue; with warm_start=False
    nothing is decided."""
    out = tmp_path / "cold"
    shutil.copytree(sweep, out)
    names = json.loads((out / "sweep.json").read_text())["runs"]
    for n in names:
        (out / n / "run.json").unlink()
    v = {x.run: x for x in SweepWatcher(out, rule=StoppingRule(use_values=False)).poll()}
    assert all(x.verdict != "finished" for x in v.values())
    lr = {n: CFG.grid()[i]["lr"] for i, n in enumerate(names)}
    slow = min(lr.values())
    assert all(v[n].verdict == "stop" for n in names if lr[n] == slow)
    assert all(v[n].verdict == "continue" for n in names if lr[n] >= 0.02)
    cold = SweepWatcher(out, rule=StoppingRule(use_values=False, warm_start=False)).poll()
    assert all(x.verdict == "wait" for x in cold)


def test_dtg_watch_cli_json_lines(live, capsys):
    out, good, bad, empty = live
    assert main(["watch", str(out), "--once", "--json", "--n-startup", "6"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by = {d["run"]: d for d in lines}
    assert by[bad]["verdict"] == "stop" and by[good]["verdict"] == "continue"
    assert set(by[good]) == {"run", "checkpoints", "p_sufficient", "verdict", "final_accuracy", "error"}
    # LeNet-5 has no batch norm: folding leaves every verdict and probability as it was
    assert main(["watch", str(out), "--once", "--json", "--n-startup", "6", "--fold-batchnorm"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == lines
    # n_startup 10 > 8 finished: the runs are compared with their peers at the same checkpoint
    assert main(["watch", str(out), "--once"]) == 0
    text = capsys.readouterr().out
    line = {t.split("\t")[0]: t for t in text.splitlines()}
    assert line[bad].startswith(f"{bad}\tk=4\tP(sufficient)=0.") and line[bad].endswith("\tstop")
    assert line[good].endswith("\tcontinue")
    assert main(["watch", str(out), "--once", "--no-warm-start"]) == 0  # as in 0.x: no decision yet
    text = capsys.readouterr().out
    assert f"{bad}\tk=4\tP(sufficient)=-\twait" in text


def test_dtg_watch_with_a_predictor_and_predict_verdicts(sweep, live, tmp_path, capsys):
    out, good, bad, empty = live
    pred = tmp_path / "p.safetensors"
    assert main(["train", str(sweep), "--out", str(pred), "-k", "2", "--per-layer", "--epochs", "150"]) == 0
    assert main(["watch", str(out), "--once", "--predictor", str(pred), "--json"]) == 0
    by = {d["run"]: d for d in map(json.loads, capsys.readouterr().out.splitlines()[-12:])}
    assert by[bad]["verdict"] == "stop" and by[good]["verdict"] == "continue"
    capsys.readouterr()
    assert main(["predict", str(pred), str(sweep / bad), str(sweep / good)]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows[0][-1] == "stop" and rows[1][-1] == "continue"


def test_watch_errors_are_clear(tmp_path, capsys):
    assert main(["watch", str(tmp_path / "nope"), "--once"]) == 1
    assert "sweep folder not found" in capsys.readouterr().err
    assert main(["watch", str(tmp_path), "--once", "--interval", "0"]) == 1
    assert "--interval must be a number of seconds in (0, 604800]" in capsys.readouterr().err


def test_watch_covariates_read_the_grid_for_running_runs(live, capsys):
    """A run still training has no run.json: its hyper-parameters come from sweep.json's grid."""
    out, good, bad, empty = live
    w = SweepWatcher(out, rule=StoppingRule(n_startup_trials=6, use_values=False, covariates=["lr", "dropout"]))
    v = {x.run: x for x in w.poll()}
    assert v[bad].verdict == "stop" and v[good].verdict == "continue"
    names = json.loads((out / "sweep.json").read_text())["runs"]
    grid = dict(zip(names, CFG.grid()))
    run_bad, _ = w._run_of(out / bad)
    assert run_bad.meta.get("lr") is None and w._params(bad, run_bad)["lr"] == grid[bad]["lr"] == 1e-5
    seen = []
    probability = w.rule.probability
    w.rule.probability = lambda *a, **k: seen.append(k["params"]) or probability(*a, **k)
    shutil.copy(sorted((out / bad).glob("ckpt-*"))[0], out / good / "ckpt-0003.safetensors")
    w.poll()
    assert seen and seen[0]["lr"] == grid[good]["lr"] == 0.05
    assert main(["watch", str(out), "--once", "--json", "--n-startup", "6", "--covariates", "lr", "dropout"]) == 0
    by = {d["run"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert by[bad]["verdict"] == "stop" and by[good]["verdict"] == "continue"


def test_watch_auto_covariates_read_the_grid_point_never_run_json_results(live, capsys):
    """The default, covariates="auto": a finished run's hyper-parameters are its grid point in
    sweep.json (lr, dropout; the seed is not read), never run.json, which holds its results."""
    out, good, bad, empty = live
    w = SweepWatcher(out, rule=StoppingRule(n_startup_trials=6, use_values=False))
    assert w.rule.covariates == "auto"
    names = json.loads((out / "sweep.json").read_text())["runs"]
    finished = names[0]
    run, done = w._run_of(out / finished)
    assert done and "final_accuracy" in run.meta  # run.json has the result ...
    params = w._params(finished, run)
    assert params == dict(zip(names, CFG.grid()))[finished]  # ... the rule is given the grid point alone
    assert w.rule.covariate_names([params]) == ("lr", "dropout")
    v = {x.run: x for x in w.poll()}
    assert v[bad].verdict == "stop" and v[good].verdict == "continue"
    # the CLI: auto by default; none or names
    assert main(["watch", str(out), "--once", "--json", "--n-startup", "6"]) == 0
    by = {d["run"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert by[bad]["verdict"] == "stop"
    assert main(["watch", str(out), "--once", "--json", "--n-startup", "6", "--covariates", "none"]) == 0
    capsys.readouterr()
    assert main(["watch", str(out), "--once", "--n-startup", "6", "--covariates", "auto", "lr"]) != 0
    assert "--covariates takes auto, none or hyper-parameter names" in capsys.readouterr().err


def test_watch_novelty_guard_is_on_by_default_and_one_flag_away(live, monkeypatch):
    import dtg_gpu.workflow.watch as workflow_watch

    out, *_ = live
    rules = []

    class Spy(SweepWatcher):
        def __init__(self, *a, **k):
            rules.append(k["rule"])
            super().__init__(*a, **k)

    monkeypatch.setattr(workflow_watch, "SweepWatcher", Spy)  # the CLI imports it when it runs
    assert main(["watch", str(out), "--once", "--n-startup", "6"]) == 0
    assert main(["watch", str(out), "--once", "--n-startup", "6", "--no-novelty-guard"]) == 0
    assert [r.novelty_guard for r in rules] == [True, False]
