r"""Stop Ray Tune trials from their checkpoints: [`DTGScheduler`][dtg_gpu.integrations.ray_tune.DTGScheduler] and [`DTGStopper`][dtg_gpu.integrations.ray_tune.DTGStopper].

The trainable reports a checkpoint with each result, as Tune users do already::

    def train_fn(config):
        model = build(config)
        for epoch in range(20):
            train_one_epoch(model)
            with tempfile.TemporaryDirectory() as d:
                safetensors.torch.save_file(model.state_dict(), f"{d}/model.safetensors")
                ray.tune.report({"val_acc": validate(model)}, checkpoint=ray.tune.Checkpoint.from_directory(d))

    tuner = ray.tune.Tuner(train_fn, param_space=...,
        tune_config=ray.tune.TuneConfig(metric="val_acc", mode="max",
                                        scheduler=DTGScheduler(model=build)))

At each result that carries a checkpoint (`checkpoint_dir_name`), the scheduler reads the
weights file in it (`*.safetensors` preferred, else `*.pt`/`*.pth`/`*.bin`/`*.ckpt`,
read with `weights_only=True`), summarises it with
[`checkpoint_record`][dtg_gpu.early_stopping.records.checkpoint_record] and applies the same
[`StoppingRule`][dtg_gpu.early_stopping.rule.StoppingRule] as the Optuna pruner: learn online from the trials
that finished, `STOP` a trial whose $P(\text{sufficient})$ stays below
`min_probability` for `patience` results. `metric`/`mode` is the final value that labels
finished trials (and, with `use_values`, one more feature).

Resuming: Tune does not keep a scheduler's state across `Tuner.restore`. This one needs none:
a restored trial that had finished is rebuilt from its checkpoints on storage and its last
result, and a trial this scheduler stopped leaves a `dtg-stopped.json` in its folder so it is
never learnt from as if it had finished.

[`DTGStopper`][dtg_gpu.integrations.ray_tune.DTGStopper] applies the rule as a `tune.Stopper` for users who keep ASHA or another
scheduler; a stopper is not told where a trial's folder is, so it takes `experiment_path`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

try:
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler
    from ray.tune.stopper import Stopper
except ImportError:  # pragma: no cover - the extra is installed by make test
    raise ImportError("dtg_gpu.integrations.ray_tune needs Ray Tune: pip install 'dtg_gpu[ray]'") from None

from dtg_gpu.core.validation import is_number
from dtg_gpu.early_stopping.records import checkpoint_record, is_diverged
from dtg_gpu.early_stopping.rule import StoppingRule, rule_options

__all__ = ["DTGScheduler", "DTGStopper", "checkpoint_weights"]

_MARKER = "dtg-stopped.json"


def checkpoint_weights(folder: str | os.PathLike, name: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict in a reported checkpoint folder: `name` if given, else the one
    `*.safetensors` file (else the one `.pt`/`.pth`/`.bin`/`.ckpt`), read safely.

    Raises
    ------
    CheckpointError
        No weights file, several candidates and no `name`, or an unreadable file.
    """
    from dtg_gpu.core.files import confined_path
    from dtg_gpu.exceptions import CheckpointError
    from dtg_gpu.io.checkpoints import CHECKPOINT_SUFFIXES, load_state_dict

    folder = Path(folder)
    if name is not None:
        return load_state_dict(confined_path(folder, name, what=f"checkpoint folder {folder}"))
    for suffix in CHECKPOINT_SUFFIXES:  # safetensors first
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffix))
        if len(files) == 1:
            return load_state_dict(files[0])
        if len(files) > 1:
            raise CheckpointError(
                f"{folder}: several {suffix} files ({', '.join(p.name for p in files[:4])}); "
                "pass checkpoint_file= to name the weights"
            )
    raise CheckpointError(f"{folder}: no weights file ({', '.join(CHECKPOINT_SUFFIXES)}) in the reported checkpoint")


class _State:
    """What the rule needs, per trial: checkpoint records, reported values, finished runs."""

    def __init__(self, model, metric, mode, checkpoint_file, rule_kw):
        if model is None or not (isinstance(model, torch.nn.Module) or callable(model)):
            raise TypeError("model must be the trials' torch.nn.Module, or a callable config -> Module")
        self.model, self.metric, self.mode = model, metric, mode
        self.checkpoint_file = checkpoint_file
        self.rule_kw = rule_kw
        self.rule = self._make_rule()
        self.records: dict[str, list[dict]] = {}
        self.values: dict[str, list[float | None]] = {}
        self.history: dict[str, list[float | None]] = {}
        self.finished: dict[str, tuple] = {}
        self.configs: dict[str, dict] = {}
        self.stopped: set[str] = set()
        self._models: dict[str, torch.nn.Module] = {}

    def _make_rule(self) -> StoppingRule:
        direction = "minimize" if self.mode == "min" else "maximize"
        return StoppingRule(direction=direction, **self.rule_kw)

    def set_properties(self, metric, mode) -> None:
        if self.metric is None and metric is not None:
            self.metric = metric
        if self.mode is None and mode is not None:
            self.mode = mode
            self.rule = self._make_rule()

    def _model(self, trial_id: str, config: dict) -> torch.nn.Module:
        if trial_id not in self._models:
            m = self.model if isinstance(self.model, torch.nn.Module) else self.model(config)
            if not isinstance(m, torch.nn.Module):
                raise TypeError(f"model(config) returned {type(m).__name__}, not a torch.nn.Module")
            self._models[trial_id] = m
        return self._models[trial_id]

    def record_of(self, trial_id: str, config: dict, folder: Path) -> dict:
        return checkpoint_record(self._model(trial_id, config), checkpoint_weights(folder, self.checkpoint_file))

    def value_of(self, result: dict) -> float | None:
        v = result.get(self.metric) if self.metric else None
        return float(v) if is_number(v) and math.isfinite(v) else None

    def observe(self, trial_id: str, config: dict, folder: Path | None, result: dict) -> bool:
        """Take one result; True to stop the trial."""
        if folder is None:
            return False
        recs = self.records.setdefault(trial_id, [])
        recs.append(self.record_of(trial_id, config, folder))
        # the hyper-parameters for `covariates`: the trial's config (a stopper sees it in the result)
        params = config or result.get("config")
        self.configs[trial_id] = params if isinstance(params, dict) else {}
        self.values.setdefault(trial_id, []).append(self.value_of(result))
        finished = [(k, *v) for k, v in self.finished.items()]
        peers = [
            (k, r, self.values.get(k)) for k, r in self.records.items() if k != trial_id and k not in self.finished
        ]
        p = self.rule.probability(recs, self.values[trial_id], finished, peers, params=self.configs[trial_id])
        hist = self.history.setdefault(trial_id, [])
        hist.append(p)
        return self.rule.should_stop(hist, diverged=is_diverged(recs), values=self.values[trial_id])

    def complete(self, trial_id: str, result: dict | None) -> None:
        if trial_id in self.stopped or not self.records.get(trial_id):
            return
        final = self.value_of(result or {})
        if final is not None:
            self.finished[trial_id] = (
                self.records[trial_id],
                self.values[trial_id],
                final,
                self.configs.get(trial_id, {}),
            )


def _trial_folder(trial) -> Path | None:
    try:
        fs_path = trial.storage.trial_fs_path
    except Exception:  # a trial without a folder yet
        return None
    return Path(fs_path)


def _mark_stopped(folder: Path | None, trial_id: str) -> None:
    if folder is None or not folder.is_dir():
        return
    from dtg_gpu.core.files import atomic_write

    try:
        atomic_write(folder / _MARKER, json.dumps({"trial_id": trial_id, "stopped_by": "dtg_gpu"}))
    except OSError:  # remote storage: the marker is an optimisation for restores
        pass


class DTGScheduler(FIFOScheduler):
    r"""A FIFO `TrialScheduler` that stops trials whose checkpoints say they will not end
    sufficient (`TrialScheduler.STOP`), else `CONTINUE`.

    Parameters
    ----------
    model : torch.nn.Module or callable
        The trials' architecture, or `config -> Module` when it depends on the trial's
        config (built once per trial, on the meta device is fine).
    metric, mode : str, optional
        The value that labels finished trials (default: `TuneConfig`'s).
    checkpoint_file : str, optional
        The weights file's name inside each reported checkpoint folder (default: found).
    predictor : PerformancePredictor, optional
        Trained on an earlier sweep; used as is. Default: learn online.
    **rule
        The stopping rule's options ([`rule_options`][dtg_gpu.early_stopping.rule.rule_options]),
        as in [`DTGPruner`][dtg_gpu.integrations.optuna.DTGPruner]; `n_warmup_steps` counts
        checkpoints; `covariates="auto"` (the default) reads the top-level numbers of each
        trial's config but seeds.
    """

    def __init__(
        self,
        model: torch.nn.Module | Callable[[dict], torch.nn.Module],
        *,
        metric: str | None = None,
        mode: str | None = None,
        checkpoint_file: str | None = None,
        predictor=None,
        **rule: Any,
    ) -> None:
        super().__init__()
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._metric = metric
        self._dtg = _State(
            model,
            metric,
            mode,
            checkpoint_file,
            rule_options(predictor, **rule),
        )

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        self._dtg.set_properties(metric, mode)
        if self._metric is None:
            self._metric = metric
        return True

    def on_trial_add(self, tune_controller, trial) -> None:
        """A restored trial that had finished is rebuilt from its checkpoints on storage."""
        if getattr(trial, "status", None) != "TERMINATED" or trial.trial_id in self._dtg.finished:
            return
        folder = _trial_folder(trial)
        if folder is None or not folder.is_dir():
            return
        if (folder / _MARKER).exists():
            self._dtg.stopped.add(trial.trial_id)
            return
        ckpts = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("checkpoint_"))
        if not ckpts:
            return
        self._dtg.records[trial.trial_id] = [self._dtg.record_of(trial.trial_id, trial.config, c) for c in ckpts]
        self._dtg.values[trial.trial_id] = [None] * len(ckpts)  # values per checkpoint are not kept by Tune
        self._dtg.configs[trial.trial_id] = trial.config if isinstance(trial.config, dict) else {}
        self._dtg.complete(trial.trial_id, trial.last_result)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if result.get("done"):  # Tune repeats a finished trial's last result with done=True
            return TrialScheduler.CONTINUE
        name = result.get("checkpoint_dir_name")
        folder = _trial_folder(trial)
        where = folder / name if (folder is not None and name) else None
        if self._dtg.observe(trial.trial_id, trial.config, where, result):
            self._dtg.stopped.add(trial.trial_id)
            _mark_stopped(folder, trial.trial_id)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self._dtg.complete(trial.trial_id, result)

    def probability_history(self, trial_id: str) -> list[float | None]:
        r"""$P(\text{sufficient})$ at each checkpoint of a trial (None: no decision yet)."""
        return list(self._dtg.history.get(trial_id, []))

    def debug_string(self) -> str:
        return f"DTGScheduler: {len(self._dtg.finished)} finished trials learnt from, {len(self._dtg.stopped)} stopped"


class DTGStopper(Stopper):
    """The same rule as a `tune.Stopper` (keep ASHA or any scheduler).

    Parameters
    ----------
    model : torch.nn.Module
        The trials' architecture (one for all trials: a stopper is not given their config).
    experiment_path : str or path
        The experiment's folder (`RunConfig(storage_path=..., name=...)`:
        `storage_path/name`), where each trial's folder is found by its id.
    metric, mode : str
        The value that labels finished trials.
    checkpoint_file, predictor, **rule
        As in [`DTGScheduler`][dtg_gpu.integrations.ray_tune.DTGScheduler]; the
        hyper-parameters for `covariates` come from each result's `"config"` (Ray Tune puts
        the trial's config there).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        experiment_path: str | os.PathLike,
        *,
        metric: str,
        mode: str = "max",
        checkpoint_file: str | None = None,
        predictor=None,
        **rule: Any,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.experiment_path = Path(experiment_path)
        self._dtg = _State(
            model,
            metric,
            mode,
            checkpoint_file,
            rule_options(predictor, **rule),
        )

    def _folder(self, trial_id: str) -> Path | None:
        hits = [p for p in self.experiment_path.glob(f"*{trial_id}*") if p.is_dir()]
        return hits[0] if len(hits) == 1 else None

    def __call__(self, trial_id: str, result: dict) -> bool:
        if result.get("done"):
            self._dtg.complete(trial_id, result)
            return False
        name = result.get("checkpoint_dir_name")
        folder = self._folder(trial_id) if name else None
        stop = self._dtg.observe(trial_id, {}, folder / name if folder is not None and name else None, result)
        if stop:
            self._dtg.stopped.add(trial_id)
            _mark_stopped(folder, trial_id)
        return stop

    def stop_all(self) -> bool:
        return False
