r"""What a sweep trains ([`SweepConfig`][dtg_gpu.sweeps.runner.SweepConfig]), the named presets and the benchmark suite.

Torch-free, so the CLI can list the presets (`dtg sweep --preset`) without importing torch;
`dtg_gpu.sweeps.runner` trains them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dtg_gpu.core.validation import is_int, is_number

__all__ = ["SweepConfig", "PRESETS", "SUITE", "CHECKS", "OPTIMIZERS", "LR_SCHEDULES", "lr_factor"]

#: Optimisers a sweep trains with (`torch.optim.SGD` with momentum, `Adam`, `AdamW`).
OPTIMIZERS = ("sgd", "adam", "adamw")
#: Per-epoch learning-rate schedules: see `lr_factor`.
LR_SCHEDULES = ("constant", "cosine", "step")


@dataclass
class SweepConfig:
    """What to train. `checkpoint_every` counts `checkpoint_unit` ("epoch" or "step").

    `optimizer`: `"sgd"` (with `momentum`), `"adam"` or `"adamw"` (decoupled
    `weight_decay`). `lr_schedule`: `"constant"`, `"cosine"` or `"step"`
    (`lr_factor`).
    """

    model: str = "lenet5"
    dataset: str = "digits"
    lrs: Sequence[float] = (0.001, 0.01, 0.1)
    dropouts: Sequence[float] = (0.0, 0.3, 0.6)
    seeds: int = 1
    epochs: int = 20
    checkpoint_every: int = 1
    checkpoint_unit: str = "epoch"
    batch_size: int = 64
    optimizer: str = "sgd"
    momentum: float = 0.9
    model_kwargs: dict = field(default_factory=dict)
    weight_decay: float = 0.0
    lr_schedule: str = "constant"

    def validate(self) -> None:
        """Check every field before anything is written (a typo never touches the folder).

        Raises
        ------
        ValueError
            The field and the value that is wrong.
        """
        from dtg_gpu.models import MODELS
        from dtg_gpu.sweeps.data import DATASETS

        def real(x) -> bool:
            return is_number(x) and math.isfinite(x)

        if not isinstance(self.model, str) or self.model.lower().replace("-", "").replace("_", "") not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        if not isinstance(self.dataset, str) or self.dataset.lower().replace("-", "").replace("_", "") not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        if not self.lrs or any(not (real(lr) and lr > 0) for lr in self.lrs):
            raise ValueError(f"learning rates must be positive finite numbers, got {list(self.lrs)}")
        if not self.dropouts or any(not (real(d) and 0 <= d < 1) for d in self.dropouts):
            raise ValueError(f"dropout rates must be in [0, 1), got {list(self.dropouts)}")
        for name in ("seeds", "epochs", "checkpoint_every", "batch_size"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (real(self.momentum) and 0 <= self.momentum < 1):
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not (real(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a non-negative number, got {self.weight_decay!r}")
        if not isinstance(self.model_kwargs, dict):
            raise ValueError(f"model_kwargs must be a dict, got {type(self.model_kwargs).__name__}")
        if self.checkpoint_unit == "epoch" and self.checkpoint_every > self.epochs:
            raise ValueError(
                f"checkpoint_every={self.checkpoint_every} epochs is longer than the run "
                f"({self.epochs} epochs): no checkpoint would be saved"
            )
        if self.checkpoint_unit not in ("epoch", "step"):
            raise ValueError(f"checkpoint_unit must be 'epoch' or 'step', got {self.checkpoint_unit!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")

    @classmethod
    def preset(cls, name: str, **changes: Any) -> "SweepConfig":
        """A named sweep of the benchmark set (`PRESETS`), with `changes` applied.

        Raises
        ------
        ValueError
            An unknown name (the message lists the presets).
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return replace(PRESETS[name], **changes)

    def grid(self) -> list[dict[str, Any]]:
        return [
            {"lr": float(lr), "dropout": float(d), "seed": s}
            for lr in self.lrs
            for d in self.dropouts
            for s in range(int(self.seeds))
        ]


#: Grids the presets share (learning rates for SGD on LeNet-5, SGD on the batch-norm nets, Adam, AdamW;
#: four or three dropout rates).
_LENET_SGD_LRS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.03, 0.1, 0.3)
_SGD_LRS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
_ADAM_LRS = (0.0001, 0.0003, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
_ADAMW_LRS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
_DROPOUTS_4 = (0.0, 0.25, 0.5, 0.75)
_DROPOUTS_3 = (0.0, 0.25, 0.5)

#: Named sweeps, 96 runs each on offline data (`dtg sweep --preset NAME --out DIR`): the
#: benchmark suite `SUITE` every prediction and early-stopping claim is measured on.
PRESETS: dict[str, SweepConfig] = {
    # LeNet-5, plain SGD with momentum, 20 epochs
    "lenet5-digits": SweepConfig(
        model="lenet5",
        lrs=_LENET_SGD_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=20,
    ),
    # a plain (no batch norm) VGG-11 at width 1/16, where it trains at all
    "vgg11-digits": SweepConfig(
        model="vgg11",
        lrs=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1),
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=20,
        model_kwargs={"width": 1 / 16},
    ),
    # residual + batch norm under SGD with momentum and weight decay: CIFAR ResNet-20 at base
    # width 4, 16 epochs, 8 learning rates x 3 dropouts x 4 seeds
    "resnet20-digits": SweepConfig(
        model="resnet20",
        lrs=_SGD_LRS,
        dropouts=_DROPOUTS_3,
        seeds=4,
        epochs=16,
        momentum=0.9,
        weight_decay=5e-4,
        model_kwargs={"width": 4},
    ),
    # the same residual sweep with a cosine schedule (the label is decided early, not late)
    "resnet20-digits-cosine": SweepConfig(
        model="resnet20",
        lrs=_SGD_LRS,
        dropouts=_DROPOUTS_3,
        seeds=4,
        epochs=16,
        momentum=0.9,
        weight_decay=5e-4,
        lr_schedule="cosine",
        model_kwargs={"width": 4},
    ),
    # plain CNN under Adam on the procedural colour images
    "lenet5-shapes-adam": SweepConfig(
        model="lenet5",
        dataset="shapes",
        lrs=_ADAM_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=20,
        optimizer="adam",
    ),
    # VGG-11 with batch norm at width 1/16, SGD with a step schedule (x0.1 at 1/2 and 3/4)
    "vgg11bn-shapes-step": SweepConfig(
        model="vgg11",
        dataset="shapes",
        lrs=(0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=16,
        weight_decay=5e-4,
        lr_schedule="step",
        model_kwargs={"width": 1 / 16, "batch_norm": True},
    ),
    # residual + batch norm under AdamW
    "resnet20-shapes-adamw": SweepConfig(
        model="resnet20",
        dataset="shapes",
        lrs=_ADAMW_LRS,
        dropouts=_DROPOUTS_3,
        seeds=4,
        epochs=12,
        optimizer="adamw",
        weight_decay=0.05,
        model_kwargs={"width": 4},
    ),
    # depthwise-separable + batch norm, SGD with a cosine schedule
    "mobilenet-shapes-cosine": SweepConfig(
        model="mobilenets",
        dataset="shapes",
        lrs=_SGD_LRS,
        dropouts=_DROPOUTS_3,
        seeds=4,
        epochs=16,
        weight_decay=5e-4,
        lr_schedule="cosine",
        model_kwargs={"width": 8},
    ),
    # VGG-11 with batch norm on digits under Adam, constant rate (a check sweep until 2026-12-07)
    "vgg11bn-digits-adam": SweepConfig(
        model="vgg11",
        lrs=_ADAM_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=16,
        optimizer="adam",
        model_kwargs={"width": 1 / 16, "batch_norm": True},
    ),
    # LeNet-5 on digits under Adam, the method's strong case (a check sweep until 2026-12-07)
    "lenet5-digits-adam": SweepConfig(
        model="lenet5",
        lrs=_ADAM_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=20,
        optimizer="adam",
    ),
    # a check sweep, not in the suite: residual + batch norm under Adam, constant rate
    "resnet20-digits-adam": SweepConfig(
        model="resnet20",
        lrs=_ADAM_LRS,
        dropouts=_DROPOUTS_3,
        seeds=4,
        epochs=16,
        optimizer="adam",
        model_kwargs={"width": 4},
    ),
    # a check sweep, not in the suite: LeNet-5 on digits, SGD with a step schedule
    "lenet5-digits-step": SweepConfig(
        model="lenet5",
        lrs=_LENET_SGD_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=20,
        lr_schedule="step",
    ),
    # a check sweep, not in the suite (added 2026-12-07, after every choice so far): depthwise-separable
    # + batch norm under Adam on digits
    "mobilenet-digits-adam": SweepConfig(
        model="mobilenets",
        lrs=_ADAM_LRS,
        dropouts=_DROPOUTS_3,
        seeds=4,
        epochs=16,
        optimizer="adam",
        model_kwargs={"width": 8},
    ),
    # a check sweep, not in the suite (added 2026-12-07): LeNet-5 on the colour images, SGD with a
    # cosine schedule
    "lenet5-shapes-cosine": SweepConfig(
        model="lenet5",
        dataset="shapes",
        lrs=_LENET_SGD_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=20,
        lr_schedule="cosine",
    ),
    # a check sweep, not in the suite (added 2026-12-07): VGG-11 with batch norm under AdamW
    "vgg11bn-shapes-adamw": SweepConfig(
        model="vgg11",
        dataset="shapes",
        lrs=_ADAMW_LRS,
        dropouts=_DROPOUTS_4,
        seeds=3,
        epochs=16,
        optimizer="adamw",
        weight_decay=0.05,
        model_kwargs={"width": 1 / 16, "batch_norm": True},
    ),
}

#: Check sweeps: presets that no default or option was chosen on, held out of `SUITE`; the
#: default is scored on them afterwards (`bench_suite.py --sweeps NAME`). The first two check
#: sweeps (`vgg11bn-digits-adam`, `lenet5-digits-adam`) joined the suite when the default's head
#: weights were chosen on ten sweeps; these were trained before that choice and scored after it.
CHECKS: tuple[str, ...] = (
    "resnet20-digits-adam",
    "lenet5-digits-step",
    "mobilenet-digits-adam",
    "lenet5-shapes-cosine",
    "vgg11bn-shapes-adamw",
)

#: The benchmark suite: every other preset (plain / residual / batch-norm / depthwise nets; SGD
#: constant, step and cosine, Adam, AdamW; digits and shapes).
SUITE: tuple[str, ...] = tuple(n for n in PRESETS if n not in CHECKS)


def lr_factor(cfg: SweepConfig, epoch: int) -> float:
    r"""The learning rate of 1-based `epoch` of `E = cfg.epochs` as a share of the run's `lr`.

    * `"constant"`: 1.
    * `"cosine"`: $\tfrac12 (1 + \cos(\pi (e - 1) / E))$, the full rate first,
      about `lr/100` last at 16 epochs.
    * `"step"`: 1 up to epoch `E/2`, 0.1 up to `3E/4`, 0.01 after.

    Examples
    --------
    >>> cfg = SweepConfig(epochs=8, lr_schedule="step")
    >>> [lr_factor(cfg, e) for e in (1, 4, 5, 6, 7, 8)]
    [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    """
    e, total = int(epoch), int(cfg.epochs)
    if cfg.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * (e - 1) / total))
    if cfg.lr_schedule == "step":
        return 1.0 if 2 * e <= total else (0.1 if 4 * e <= 3 * total else 0.01)
    return 1.0
