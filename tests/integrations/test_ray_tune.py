"""dtg_gpu.integrations.ray_tune on a real local Ray instance: DTGScheduler and DTGStopper."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

ray = pytest.importorskip("ray")
tune = pytest.importorskip("ray.tune")

from dtg_gpu.exceptions import CheckpointError  # noqa: E402
from dtg_gpu.integrations.ray_tune import DTGScheduler, DTGStopper, checkpoint_weights  # noqa: E402

pytestmark = pytest.mark.slow


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def trainable(config):
    """Deterministic stand-in for training: 'bad' runs grow one row of the first layer each
    step (their centrality concentrates) and end at a low accuracy; 'nan' runs diverge."""
    from safetensors.torch import save_file

    torch.manual_seed(config["seed"])
    net = _net()
    for step in range(5):
        with torch.no_grad():
            if config["kind"] == "bad":
                net[0].weight[0].mul_(2.5)
            if config["kind"] == "nan" and step == 1:
                net[0].weight[0, 0] = float("nan")
        final = {"good": 0.9, "bad": 0.1, "nan": 0.0}[config["kind"]] + 0.001 * config["seed"]
        with tempfile.TemporaryDirectory() as d:
            save_file({k: v.contiguous() for k, v in net.state_dict().items()}, f"{d}/model.safetensors")
            tune.report({"acc": final if step == 4 else 0.5}, checkpoint=tune.Checkpoint.from_directory(d))


CONFIGS = (
    [{"kind": "good", "seed": i} for i in range(3)]
    + [{"kind": "bad", "seed": i} for i in range(3)]
    + [{"kind": "nan", "seed": 0}, {"kind": "bad", "seed": 7}, {"kind": "good", "seed": 7}]
)


def _run(tmp_path, name, scheduler=None, stopper=None):
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric="acc",
            mode="max",
            scheduler=scheduler,
            max_concurrent_trials=1,
            reuse_actors=True,
            num_samples=len(CONFIGS),
            search_alg=_Queue(CONFIGS),
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name=name, stop=stopper, verbose=0),
    )
    return tuner.fit()


class _Queue(tune.search.Searcher):
    """Trials in a fixed order (finished ones teach the rule before the later ones run)."""

    def __init__(self, configs):
        super().__init__(metric="acc", mode="max")
        self.configs = list(configs)

    def suggest(self, trial_id):
        return self.configs.pop(0) if self.configs else tune.search.Searcher.FINISHED

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


def _iterations(results) -> dict:
    return {(r.config["kind"], r.config["seed"]): r.metrics["training_iteration"] for r in results}


def test_scheduler_stops_the_bad_and_diverged_trials(local_ray, tmp_path):
    sched = DTGScheduler(model=_net(), n_startup_trials=6, min_probability=0.3, patience=2, use_values=False)
    results = _run(tmp_path, "sched", scheduler=sched)
    its = _iterations(results)
    assert all(its[("good", i)] == 5 and its[("bad", i)] == 5 for i in range(3))  # the startup trials
    assert its[("nan", 0)] == 2  # stopped at its first non-finite checkpoint
    assert its[("bad", 7)] < 5  # learnt from the finished trials
    assert its[("good", 7)] == 5
    folders = {
        json.loads((Path(r.path) / "params.json").read_text())["kind"] + str(r.config["seed"]): Path(r.path)
        for r in results
    }
    assert (folders["bad7"] / "dtg-stopped.json").is_file() and not (folders["good7"] / "dtg-stopped.json").exists()

    # a restore: Tune hands a fresh scheduler the trials that had finished; it rebuilds them from
    # their checkpoints on storage, leaves out the ones it had stopped, and decides as before
    from types import SimpleNamespace

    fresh = DTGScheduler(
        model=_net(), metric="acc", mode="max", n_startup_trials=6, min_probability=0.3, patience=2, use_values=False
    )
    for r in results:
        fresh.on_trial_add(
            None,
            SimpleNamespace(
                status="TERMINATED",
                trial_id=r.metrics["trial_id"],
                config=r.config,
                last_result=r.metrics,
                storage=SimpleNamespace(trial_fs_path=r.path),
            ),
        )
    assert len(fresh._dtg.finished) == 7  # 9 trials, 2 stopped
    assert sched._dtg.finished.keys() == fresh._dtg.finished.keys()
    for tid, (recs, _, final, config) in sched._dtg.finished.items():
        assert fresh._dtg.finished[tid][0] == recs and fresh._dtg.finished[tid][2] == final
        assert fresh._dtg.finished[tid][3] == config and "kind" in config  # the config, for `covariates`


def test_stopper_with_asha_style_scheduler(local_ray, tmp_path):
    stopper = DTGStopper(
        _net(),
        tmp_path / "stop",
        metric="acc",
        mode="max",
        n_startup_trials=6,
        min_probability=0.3,
        patience=2,
        use_values=False,
    )
    its = _iterations(_run(tmp_path, "stop", stopper=stopper))
    assert its[("nan", 0)] == 2 and its[("bad", 7)] < 5 and its[("good", 7)] == 5


def test_checkpoint_weights_finds_the_file_and_names_problems(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(CheckpointError, match="no weights file"):
        checkpoint_weights(tmp_path)
    save_file({"w": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    assert checkpoint_weights(tmp_path)["w"].tolist() == [1.0, 1.0]
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(CheckpointError, match="several"):
        checkpoint_weights(tmp_path)
    assert checkpoint_weights(tmp_path, "b.safetensors")["w"].tolist() == [0.0, 0.0]
    with pytest.raises(CheckpointError, match="outside"):
        checkpoint_weights(tmp_path, "../x.safetensors")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        DTGScheduler(model=None)


def restartable(config):
    """``trainable`` on ``config["cfg"]``; the one marked ``crash`` dies before its first report
    the first time it runs (a lost node), as in an interrupted experiment."""
    cfg = config["cfg"]
    marker = Path(config["marker"])
    if cfg.get("crash") and not marker.exists():
        marker.write_text("crashed once")
        raise RuntimeError("node lost")
    trainable({k: v for k, v in cfg.items() if k != "crash"})


def test_tuner_restore_end_to_end_rebuilds_the_rule_and_stops_the_restarted_trial(local_ray, tmp_path):
    configs = [dict(c) for c in CONFIGS if (c["kind"], c["seed"]) != ("good", 7)]
    for c in configs:
        c["crash"] = (c["kind"], c["seed"]) == ("bad", 7)
    sched = DTGScheduler(model=_net(), n_startup_trials=6, min_probability=0.3, patience=2, use_values=False)
    space = {"cfg": tune.grid_search(configs), "marker": str(tmp_path / "crashed")}
    tuner = tune.Tuner(
        restartable,
        param_space=space,
        tune_config=tune.TuneConfig(metric="acc", mode="max", scheduler=sched, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="exp", verbose=0),
    )
    first = tuner.fit()
    assert first.num_errors == 1  # the crashed trial; the others ran to their end (or were stopped)
    # a new driver: Tune restores the experiment (its scheduler starts empty) and reruns the errored trial
    restored = tune.Tuner.restore(str(tmp_path / "exp"), trainable=restartable, restart_errored=True)
    results = restored.fit()
    assert results.num_errors == 0
    by = {(r.config["cfg"]["kind"], r.config["cfg"]["seed"]): r for r in results}
    assert by[("bad", 7)].metrics["training_iteration"] < 5  # stopped by what the restored trials taught
    assert (Path(by[("bad", 7)].path) / "dtg-stopped.json").is_file()
    assert all(by[("good", i)].metrics["training_iteration"] == 5 for i in range(3))
