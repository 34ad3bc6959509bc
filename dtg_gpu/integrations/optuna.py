r"""Prune Optuna trials from their checkpoints: [`DTGPruner`][dtg_gpu.integrations.optuna.DTGPruner] and [`report`][dtg_gpu.integrations.optuna.report].

In the objective, call [`report`][dtg_gpu.integrations.optuna.report] where you would call `trial.report`::

    import optuna
    from dtg_gpu.integrations.optuna import DTGPruner, report

    def objective(trial):
        model = build(trial.suggest_float("lr", 1e-4, 1e-1, log=True))
        for epoch in range(20):
            train_one_epoch(model)
            report(trial, model, epoch, value=validate(model))   # value is optional
            if trial.should_prune():
                raise optuna.TrialPruned()
        return test(model)

    study = optuna.create_study(direction="maximize", pruner=DTGPruner(),
                                storage="sqlite:///sweep.db")
    study.optimize(objective, n_trials=100)

[`report`][dtg_gpu.integrations.optuna.report] saves the model's weights as the trial's checkpoint at `step`
(safetensors, written atomically to `<storage file>.dtg/<study>/trial-<number>/`, beside a
SQLite or Journal-file storage; in memory for an in-memory study), stores the checkpoint's
[`checkpoint_record`][dtg_gpu.early_stopping.records.checkpoint_record] in the trial's system attributes
(`dtg:step:<step>`) and calls `trial.report(value, step)` when a value is given. The pruner
reads only what the trials stored, so several worker processes on one RDB or Journal storage
see the same thing, and a study resumed on the same storage makes the same decisions (each
decision's probability is stored too, `dtg:p:<step>`).

Multi-objective studies: Optuna supports no pruning there (`trial.report` and
`should_prune` raise); [`report`][dtg_gpu.integrations.optuna.report] still records checkpoints when called without a value.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

try:
    import optuna
except ImportError:  # pragma: no cover - the extra is installed by make test
    raise ImportError("dtg_gpu.integrations.optuna needs Optuna: pip install 'dtg_gpu[optuna]'") from None

from dtg_gpu.core.validation import check_number, is_int
from dtg_gpu.early_stopping.records import checkpoint_record, is_diverged
from dtg_gpu.early_stopping.rule import StoppingRule, rule_options

__all__ = ["DTGPruner", "report", "checkpoint_folder", "set_checkpoint_folder", "trial_records", "trial_run"]

_STEP = "dtg:step:"
_PROB = "dtg:p:"
_FOLDER = "dtg:checkpoint_folder"
_MEMORY: dict[tuple[int, int], dict[int, dict[str, torch.Tensor]]] = {}
_LOCK = threading.Lock()

_MULTI = (
    "Optuna does not support pruning in multi-objective studies (trial.report and "
    "trial.should_prune raise there); dtg's report() still records checkpoints when called "
    "without a value"
)


def _backend(storage):
    return getattr(storage, "_backend", storage) if type(storage).__name__ == "_CachedStorage" else storage


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100] or "study"


def set_checkpoint_folder(study, folder: str | os.PathLike) -> None:
    """Record where [`report`][dtg_gpu.integrations.optuna.report] writes the study's checkpoints (stored in the study, so
    every worker uses it). Needed for storages without a local file (PostgreSQL, MySQL,
    Redis, gRPC); `folder` must be on storage every worker sees."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    study._storage.set_study_system_attr(study._study_id, _FOLDER, str(folder))


def checkpoint_folder(study) -> Path | None:
    """Where the study's checkpoints are written: the folder set with
    [`set_checkpoint_folder`][dtg_gpu.integrations.optuna.set_checkpoint_folder], else `<file>.dtg/<study name>` beside a SQLite database
    or a Journal file; `None` for an in-memory study (checkpoints kept in this process).

    Raises
    ------
    ValueError
        A storage without a local file and no folder set (the message says how to set one).
    """
    storage = study._storage
    set_ = storage.get_study_system_attrs(study._study_id).get(_FOLDER)
    if set_:
        return Path(set_)
    b = _backend(storage)
    base: str | None = None
    kind = type(b).__name__
    if kind == "InMemoryStorage":
        return None
    if kind == "RDBStorage":
        url = str(b.url)
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///") :].split("?")[0]
            if path in ("", ":memory:"):
                return None
            base = path
    elif kind == "JournalStorage":
        base = getattr(getattr(b, "_backend", None), "_file_path", None)
    if base is None:
        raise ValueError(
            f"{kind} has no local file to keep checkpoints beside: call "
            "dtg_gpu.integrations.optuna.set_checkpoint_folder(study, folder) once, with a "
            "folder every worker sees"
        )
    base_path = Path(base)
    return base_path.with_name(base_path.name + ".dtg") / _safe(study.study_name)


def _check_step(step: Any) -> int:
    if not is_int(step) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return int(step)


def report(trial, model: torch.nn.Module, step: int, value: float | None = None) -> None:
    r"""Record `model`'s weights as `trial`'s checkpoint at `step`; report `value`.

    Parameters
    ----------
    trial : optuna.trial.Trial
        The running trial (the objective's argument).
    model : torch.nn.Module
        The network being trained (any device; its weights are copied to the CPU).
    step : int
        Non-negative, increasing within a trial (an epoch, a global step).
    value : float, optional
        The intermediate value (validation accuracy or loss) passed to
        `trial.report(value, step)`; the pruner may use it as one more feature.

    Raises
    ------
    ValueError
        A bad `step`, a non-finite `value`, a `value` in a multi-objective study, or a
        storage with no local file and no [`set_checkpoint_folder`][dtg_gpu.integrations.optuna.set_checkpoint_folder].
    TypeError
        `model` is not a `torch.nn.Module`.
    """
    if not isinstance(trial, optuna.trial.Trial):
        raise TypeError(f"trial must be the optuna.trial.Trial passed to the objective, got {type(trial).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    step = _check_step(step)
    study = trial.study
    if value is not None:
        if len(study.directions) > 1:
            raise ValueError(_MULTI)
        check_number("value", value)
    state = {
        k: v.detach().to("cpu", copy=True).contiguous()
        for k, v in model.state_dict().items()
        if isinstance(v, torch.Tensor)
    }
    folder = checkpoint_folder(study)
    if folder is None:
        with _LOCK:
            _MEMORY.setdefault((id(_backend(study._storage)), trial._trial_id), {})[step] = state
    else:
        from safetensors.torch import save_file

        from dtg_gpu.core.files import atomic_write

        where = folder / f"trial-{trial.number:06d}"
        where.mkdir(parents=True, exist_ok=True)
        atomic_write(where / f"step-{step:09d}.safetensors", lambda p: save_file(state, str(p)))
    record = checkpoint_record(model, state)
    trial.storage.set_trial_system_attr(trial._trial_id, f"{_STEP}{step:09d}", record)
    if value is not None:
        trial.report(float(value), step)


def trial_records(trial) -> tuple[list[int], list[dict]]:
    """`(steps, records)` a trial stored through [`report`][dtg_gpu.integrations.optuna.report], in step order."""
    attrs = trial.system_attrs
    steps = sorted(int(k[len(_STEP) :]) for k in attrs if k.startswith(_STEP))
    return steps, [attrs[f"{_STEP}{s:09d}"] for s in steps]


def trial_run(study, trial, model: torch.nn.Module):
    """The trial's recorded checkpoints as a [`Run`][dtg_gpu.Run], to analyse
    with the rest of the library (`dtg_gpu.analyze(trial_run(study, t, model))`)."""
    from dtg_gpu.io.run import Run

    steps, _ = trial_records(trial)
    folder = checkpoint_folder(study)
    if folder is None:
        mem = _MEMORY.get((id(_backend(study._storage)), trial._trial_id), {})
        ckpts: list = [mem[s] for s in steps if s in mem]
    else:
        ckpts = [folder / f"trial-{trial.number:06d}" / f"step-{s:09d}.safetensors" for s in steps]
    return Run(
        model=model,
        checkpoints=ckpts,
        name=f"trial-{trial.number}",
        meta={"final_accuracy": trial.value} if trial.value is not None else {},
    )


def _values(trial, steps: Sequence[int]) -> list[float | None]:
    iv = trial.intermediate_values
    return [iv.get(s) for s in steps]


class DTGPruner(optuna.pruners.BasePruner):
    r"""Prune a trial whose checkpoints say it will not end sufficient.

    An `optuna.pruners.BasePruner`: at each `trial.should_prune()`, the trial's
    checkpoint records so far (see [`report`][dtg_gpu.integrations.optuna.report]) give $P(\text{sufficient})$, from
    `predictor` or learned online from the study's completed trials; the trial is pruned
    when it stays below `min_probability` for `patience` consecutive checks, or at once
    when its weights are no longer finite. See [`StoppingRule`][dtg_gpu.early_stopping.rule.StoppingRule].

    Parameters
    ----------
    predictor : PerformancePredictor, optional
        Trained on an earlier sweep (`dtg train`); used as is. Default: learn online.
    **rule
        The stopping rule's options, as in
        [`StoppingRule`][dtg_gpu.early_stopping.rule.StoppingRule] (`min_probability=0.3`,
        `patience=1`, `n_startup_trials=10` completed trials, `n_warmup_steps=0`,
        `threshold="median"`, `features="dtg_per_layer"`, `use_values="auto"` (the values
        reported with [`report`][dtg_gpu.integrations.optuna.report]), `alpha=0.5`,
        `fold_batchnorm=False`, `warm_start=True` (before enough trials have completed,
        prune a trial that stays behind the others at the same step, as `MedianPruner` does
        with values), `n_peers=5`, `value_median=0.1` (with the values the trial reports: a
        trial whose best value is behind the completed trials' median at its step is pruned,
        as `MedianPruner` prunes it, and the checkpoints prune one only below 0.1),
        `value_leader=0.5` (with that test on, the checkpoints do not prune a trial whose
        best value so far is at or above the completed trials' median at its step: from 5
        completed trials on the value decides, as in `MedianPruner`),
        `covariates="auto"` (the trial's numeric `trial.params`, seeds left out, read by the
        online model beside the checkpoints; names such as `["lr", "dropout"]` read those,
        `None` the checkpoints alone), `novelty_guard=True` (the online model does not prune a
        trial unlike every completed trial it was fitted on)); the study's direction is respected.

    Notes
    -----
    `DTGPruner()` suits a study of ~100 trials; the replay benchmark
    (`benchmarks/bench_early_stopping.py`) measures these defaults against Optuna's
    pruners. Optuna refuses pruning in multi-objective studies, and so does this pruner.
    """

    def __init__(self, predictor=None, **rule: Any) -> None:
        self._params = rule_options(predictor, **rule)
        self._rules: dict[str, StoppingRule] = {}
        self._rule("maximize")  # validates the parameters now, not at the first prune

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._params.items() if k != "predictor")
        return f"DTGPruner({'predictor=..., ' if self._params['predictor'] is not None else ''}{shown})"

    def _rule(self, direction: str) -> StoppingRule:
        if direction not in self._rules:
            self._rules[direction] = StoppingRule(direction=direction, **self._params)
        return self._rules[direction]

    def probability(self, study, trial) -> float | None:
        r"""$P(\text{sufficient})$ of `trial` (a `FrozenTrial`) now; None when there
        is nothing to decide from yet."""
        if len(study.directions) > 1:
            raise ValueError(_MULTI)
        steps, records = trial_records(trial)
        if not steps or steps[-1] < self._params["n_warmup_steps"]:
            return None
        direction = "maximize" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "minimize"
        rule = self._rule(direction)
        finished, peers = [], []
        if rule.predictor is None or rule.value_test(
            _values(trial, steps), len(steps)
        ):  # the value's median test reads the finished runs too
            TS = optuna.trial.TrialState
            for t in study.get_trials(deepcopy=False, states=(TS.COMPLETE, TS.PRUNED, TS.RUNNING)):
                if t.number == trial.number:
                    continue
                s, r = trial_records(t)
                if not r:
                    continue
                key = (study.study_name, t.number)
                if t.state == TS.COMPLETE and t.value is not None:
                    finished.append((key, r, _values(t, s), t.value, t.params))
                elif rule.warm_start:
                    peers.append((key, r, _values(t, s)))
        return rule.probability(records, _values(trial, steps), finished, peers, params=trial.params)

    def prune(self, study, trial) -> bool:
        """Optuna's pruner interface: `True` to prune `trial` now."""
        steps, records = trial_records(trial)
        if not steps:
            return False
        p = self.probability(study, trial)
        study._storage.set_trial_system_attr(trial._trial_id, f"{_PROB}{steps[-1]:09d}", p)
        attrs = trial.system_attrs
        history = [attrs.get(f"{_PROB}{s:09d}") for s in steps[:-1]] + [p]
        return self._rule("maximize").should_stop(history, diverged=is_diverged(records), values=_values(trial, steps))
