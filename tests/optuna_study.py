"""A real Optuna study for tests/integrations/test_optuna.py: LeNet-5 trained on the embedded digits data
for a few epochs per trial, pruned by DTGPruner, on a SQLite storage.

Usage: python optuna_study.py DB N_TRIALS [--kill-at NUMBER]

Trials take their (lr, seed) from the study's queue (enqueued once, on first use), so an
interrupted study resumes with the configurations it had not run. ``--kill-at N``: the process
SIGKILLs itself in trial N, after its second checkpoint (a half-written trial, as when a worker
dies); on restart that trial is marked failed and its configuration queued again.
"""

from __future__ import annotations

import os
import signal
import sys

import optuna
import torch

from dtg_gpu.integrations.optuna import DTGPruner, report
from dtg_gpu.models import LeNet5
from dtg_gpu.sweeps.data import load_dataset

CONFIGS = [{"lr": lr, "seed": s} for s in range(2) for lr in (0.05, 0.02, 0.1, 3.0, 1e-5, 0.01, 3e-5, 0.03)]
EPOCHS = 4


def objective(trial, kill_at: int | None):
    lr = trial.suggest_float("lr", 1e-6, 10.0, log=True)
    seed = trial.suggest_int("seed", 0, 10)
    torch.manual_seed(seed)
    ds = load_dataset("digits")
    x, y = ds.train
    xv, yv = ds.val
    model = LeNet5(num_classes=ds.num_classes, in_channels=ds.in_channels)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for epoch in range(EPOCHS):
        model.train()
        for idx in torch.randperm(len(x), generator=g).split(64):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = float((model(xv).argmax(1) == yv).float().mean())
        report(trial, model, epoch, value=acc)
        if kill_at is not None and trial.number == kill_at and epoch == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return acc


def main() -> None:
    db, n = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--kill-at" else None
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="lenet",
        storage=f"sqlite:///{db}",
        direction="maximize",
        load_if_exists=True,
        pruner=DTGPruner(
            n_startup_trials=4, use_values=False, features="dtg_per_layer", min_probability=0.3, patience=1
        ),
    )
    if not study.user_attrs.get("enqueued"):
        for c in CONFIGS:
            study.enqueue_trial(c)
        study.set_user_attr("enqueued", True)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        # a trial killed with its worker: failed, and its configuration queued again
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.system_attrs.get("fixed_params") or t.params)
    done = len(
        [
            t
            for t in study.get_trials(deepcopy=False)
            if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        ]
    )
    study.optimize(lambda t: objective(t, kill_at), n_trials=max(0, n - done))


if __name__ == "__main__":
    main()
