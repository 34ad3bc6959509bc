"""`dtg sweep`: train a grid of runs (or a preset of the benchmark suite) into a sweep folder."""

from __future__ import annotations

import argparse

from dtg_gpu.cli.common import Command, _cluster, _device, _executor
from dtg_gpu.sweeps.config import LR_SCHEDULES, OPTIMIZERS, PRESETS


# ------------------------------------------------------------------------------ sweep
def _sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        default=None,
        choices=tuple(PRESETS),
        help="a sweep of the benchmark suite (or a check sweep held out of it); the flags below override its fields",
    )
    p.add_argument(
        "--model", default=None, help="lenet5, vgg11/13/16/19, resnet18/34, resnet20/32, mobilenet-s (default lenet5)"
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="digits (offline, default), shapes (offline, procedural), mnist, cifar10, cifar100",
    )
    p.add_argument("--lr", type=float, nargs="+", default=None, help="default 0.001 0.01 0.1")
    p.add_argument("--dropout", type=float, nargs="+", default=None, help="default 0 0.3 0.6")
    p.add_argument("--seeds", type=int, default=None, help="default 1")
    p.add_argument("--epochs", type=int, default=None, help="default 20")
    p.add_argument("--checkpoint-every", type=int, default=None, help="default 1")
    p.add_argument("--checkpoint-unit", choices=["epoch", "step"], default=None, help="default epoch")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="default sgd")
    p.add_argument("--momentum", type=float, default=None, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=None, help="L2 weight decay (default 0)")
    p.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default=None,
        help="per-epoch learning rate: constant, cosine, or step (x0.1 after 1/2 and 3/4 of the epochs); default constant",
    )
    p.add_argument(
        "--width",
        type=float,
        default=None,
        help="VGG: channel multiplier (e.g. 0.0625); resnet20/32: base width (16); mobilenet-s: base width (8)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=32,
        help="runs of one seed trained at once as one grouped network (1: one at a time)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="train this many runs (or grouped batches) at once in worker processes sharing "
        "the CPU threads (batch-norm / residual nets on a multi-core CPU); default 1",
    )
    p.add_argument("--data-root", default="data", help="where MNIST/CIFAR live (default ./data)")
    p.add_argument("--download", action="store_true", help="let torchvision download a missing dataset")
    p.add_argument("--out", required=True, help="sweep folder (resumable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _device(p)
    _cluster(p, cache=False)


def _width_kwargs(model: str, width: float | None) -> dict:
    if width is None:
        return {}
    if not width > 0:
        raise ValueError(f"--width must be positive, got {width}")
    if model.startswith("vgg"):
        return {"width": width}
    if model.replace("-", "") in ("resnet20", "resnet32", "mobilenets") and float(width).is_integer():
        return {"width": int(width)}
    raise ValueError(
        f"--width applies to vgg* (a multiplier) and resnet20/32, mobilenet-s (an integer base width), "
        f"not to {model} with {width}"
    )


def _sweep_run(a: argparse.Namespace) -> int:
    from dtg_gpu.sweeps.config import SweepConfig
    from dtg_gpu.sweeps.runner import run_sweep

    base = SweepConfig.preset(a.preset) if a.preset else SweepConfig()
    given = {
        "model": a.model,
        "dataset": a.dataset,
        "lrs": a.lr,
        "dropouts": a.dropout,
        "seeds": a.seeds,
        "epochs": a.epochs,
        "checkpoint_every": a.checkpoint_every,
        "checkpoint_unit": a.checkpoint_unit,
        "batch_size": a.batch_size,
        "optimizer": a.optimizer,
        "momentum": a.momentum,
        "weight_decay": a.weight_decay,
        "lr_schedule": a.lr_schedule,
    }
    changes: dict = {k: v for k, v in given.items() if v is not None}
    model = changes.get("model", base.model)
    if a.width is not None:  # other keywords of the preset's model (VGG's batch_norm) are kept
        same = model == base.model
        changes["model_kwargs"] = {**(base.model_kwargs if same else {}), **_width_kwargs(model, a.width)}
    elif "model" in changes and model != base.model:
        changes["model_kwargs"] = {}  # the preset's width belongs to the preset's model
    cfg = SweepConfig.preset(a.preset, **changes) if a.preset else SweepConfig(**changes)
    if a.group_size < 1:
        raise ValueError(f"--group-size must be >= 1, got {a.group_size}")
    if a.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {a.workers}")
    out = run_sweep(
        cfg,
        a.out,
        data_root=a.data_root,
        download=a.download,
        device=a.device,
        progress=not a.quiet,
        group_size=a.group_size,
        workers=a.workers,
        **_executor(a),
    )
    print(f"sweep complete: {out}")
    return 0


sweep = Command(
    "sweep", "train a lr x dropout x seed grid of one model (writes the on-disk format)", _sweep_args, _sweep_run
)
