"""Training one run, or a group of runs as one grouped network, into run folders in the on-disk format (checkpoints, then run.json last)."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dtg_gpu.core.files import atomic_write
from dtg_gpu.io.manifest import RunManifest, sha256_of
from dtg_gpu.models import build_model
from dtg_gpu.sweeps.config import SweepConfig, lr_factor
from dtg_gpu.sweeps.data import Dataset
from dtg_gpu.sweeps.grouped import GroupedSequential, sequential_layers
from dtg_gpu.sweeps.state import _clear_for_training, _write_json

__all__ = ["train_run", "train_group", "train_batch", "tune_cpu_malloc"]


def _save_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """Write a state dict as safetensors, atomically; returns its size and SHA-256, which
    `run.json` records so that a resumed sweep or a reader can tell a damaged file."""
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    atomic_write(path, lambda tmp: save_file(cpu, str(tmp)))
    return _file_identity(path)


def _file_identity(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_of(path)}


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _run_meta(
    cfg: SweepConfig,
    name: str,
    model_kwargs: dict,
    point: dict[str, Any],
    checkpoints: list[dict[str, Any]],
    test_acc: float,
    test_loss: float,
    diverged: bool,
    seconds: float,
) -> dict[str, Any]:
    """The content of a finished run's `run.json`."""
    if not checkpoints:
        raise ValueError(
            f"{name}: training saved no checkpoint (checkpoint_every={cfg.checkpoint_every} "
            f"{cfg.checkpoint_unit}s is longer than the run); nothing is recorded as complete"
        )
    return RunManifest(
        name=name,
        model=cfg.model,
        model_kwargs=model_kwargs,
        dataset=cfg.dataset,
        lr=point["lr"],
        dropout=point["dropout"],
        seed=point["seed"],
        epochs=int(cfg.epochs),
        optimizer=cfg.optimizer,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        lr_schedule=cfg.lr_schedule,
        batch_size=int(cfg.batch_size),
        checkpoint_every=cfg.checkpoint_every,
        checkpoint_unit=cfg.checkpoint_unit,
        checkpoints=checkpoints,
        final_accuracy=test_acc,
        test_loss=_finite_or_none(test_loss),
        status="diverged" if diverged else "complete",
        complete=True,
        seconds=round(seconds, 3),
    ).to_dict()


def _checkpoint_record(
    name: str, epoch: int, step: int, val_acc: float, val_loss: float, train_loss: float, identity: dict[str, Any]
) -> dict[str, Any]:
    return {
        "file": name,
        "epoch": epoch,
        "step": step,
        "val_accuracy": val_acc,
        "val_loss": _finite_or_none(val_loss),
        "train_loss": _finite_or_none(train_loss),
        **identity,
    }


@torch.no_grad()
def _evaluate(model, x, y, batch: int = 1024) -> tuple[float, float]:
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), batch):
        out = model(x[i : i + batch])
        loss += float(F.cross_entropy(out, y[i : i + batch], reduction="sum"))
        correct += int((out.argmax(1) == y[i : i + batch]).sum())
    model.train()
    return correct / len(x), loss / len(x)


def _epochs(cfg: SweepConfig, progress: bool, desc: str):
    """Epochs `1 … cfg.epochs`, under a tqdm bar with `progress`."""
    epochs = range(1, int(cfg.epochs) + 1)
    if not progress:
        return epochs
    from tqdm.auto import tqdm

    return tqdm(epochs, desc=desc, leave=False, unit="epoch")


_lr_factor = lr_factor  # the name the tests and older callers use


def _minibatches(n: int, batch_size: int, gen: torch.Generator, device: torch.device):
    """One epoch's mini-batch indices: a permutation drawn from `gen` (the seed's batch
    order, shared by every run of the seed), cut into `batch_size` pieces."""
    order = torch.randperm(n, generator=gen).to(device)
    for i in range(0, n, batch_size):
        yield order[i : i + batch_size]


def _due(cfg: SweepConfig, unit: str, count: int) -> bool:
    """Whether a checkpoint is due after `count` steps (`unit="step"`) or epochs."""
    return cfg.checkpoint_unit == unit and count % cfg.checkpoint_every == 0


def train_run(
    cfg: SweepConfig, ds: Dataset, point: dict[str, Any], folder: Path, device: torch.device, progress: bool = False
) -> dict[str, Any]:
    """Train one run of the grid into `folder`; returns its `run.json` content."""
    started = time.time()
    torch.manual_seed(point["seed"])
    kwargs = dict(num_classes=ds.num_classes, in_channels=ds.in_channels, dropout=point["dropout"], **cfg.model_kwargs)
    model = build_model(cfg.model, **kwargs).to(device)
    opt: torch.optim.Optimizer
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=point["lr"], momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=point["lr"], weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=point["lr"], weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(10_000 + point["seed"])
    xtr, ytr = (t.to(device) for t in ds.train)
    xva, yva = (t.to(device) for t in ds.val)
    n, bs = len(xtr), int(cfg.batch_size)
    checkpoints: list[dict[str, Any]] = []
    diverged, step, train_loss = False, 0, float("nan")

    def checkpoint(epoch: int) -> None:
        acc, vloss = _evaluate(model, xva, yva)
        name = f"ckpt-{len(checkpoints) + 1:04d}.safetensors"
        identity = _save_state(model.state_dict(), folder / name)
        checkpoints.append(_checkpoint_record(name, epoch, step, acc, vloss, train_loss, identity))

    model.train()
    for epoch in _epochs(cfg, progress, f"lr={point['lr']:g} drop={point['dropout']:g} seed={point['seed']}"):
        for group in opt.param_groups:
            group["lr"] = point["lr"] * _lr_factor(cfg, epoch)
        for idx in _minibatches(n, bs, gen, device):
            step += 1
            if not diverged:
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
                train_loss = float(loss.detach())
                if not math.isfinite(train_loss):
                    diverged = True  # keep going: later checkpoints record the state honestly
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if _due(cfg, "step", step):
                checkpoint(epoch)
        if _due(cfg, "epoch", epoch):
            checkpoint(epoch)
    if not diverged and any(not torch.isfinite(p).all() for p in model.parameters()):
        diverged = True
    xte, yte = (t.to(device) for t in ds.test)
    test_acc, test_loss = _evaluate(model, xte, yte)
    return _run_meta(cfg, folder.name, kwargs, point, checkpoints, test_acc, test_loss, diverged, time.time() - started)


def _groupable(cfg: SweepConfig, ds: Dataset) -> bool:
    """Runs can train together: plain SGD and a plain sequential CNN (see `._grouped`)."""
    probe = build_model(cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels, **cfg.model_kwargs)
    return cfg.optimizer == "sgd" and sequential_layers(probe) is not None


def train_group(
    cfg: SweepConfig,
    ds: Dataset,
    points: list[dict[str, Any]],
    folders: list[Path],
    device: torch.device,
    progress: bool = False,
) -> list[dict[str, Any]]:
    r"""Train runs that share a seed at once, as one grouped network (`.GroupedSequential`).

    As in `train_run`, the seed fixes the initial weights and the mini-batch order, so
    runs of one seed see the same batches; each run keeps its own learning rate, dropout
    rate and dropout masks. SGD with momentum is applied per run (`b ← μ b + g`,
    `θ ← θ − lr·b`, PyTorch's rule). The same algorithm as `train_run`; only the
    dropout masks come from a different random stream.
    """
    started = time.time()
    seeds = {pt["seed"] for pt in points}
    if len(seeds) != 1:
        raise ValueError(f"train_group needs runs of one seed, got seeds {sorted(seeds)}")
    seed = points[0]["seed"]
    kwargs_of = [
        dict(num_classes=ds.num_classes, in_channels=ds.in_channels, dropout=pt["dropout"], **cfg.model_kwargs)
        for pt in points
    ]
    models = []
    for kw in kwargs_of:
        torch.manual_seed(seed)
        models.append(build_model(cfg.model, **kw).to(device))
    xtr, ytr = (t.to(device) for t in ds.train)
    xva, yva = (t.to(device) for t in ds.val)
    net = GroupedSequential(models, [pt["dropout"] for pt in points], example=xva[:2])
    del models
    params = net.params
    m = len(points)
    lr = torch.tensor([pt["lr"] for pt in points], device=device)
    momentum = {k: torch.zeros_like(v) for k, v in params.items()}
    torch.manual_seed(seed)  # dropout masks
    gen = torch.Generator().manual_seed(10_000 + seed)
    n, bs = len(xtr), int(cfg.batch_size)
    records: list[list[dict[str, Any]]] = [[] for _ in points]
    diverged = torch.zeros(m, dtype=torch.bool, device=device)  # stays on the device: no sync per step
    step = 0
    last_loss = torch.full((m,), float("nan"), device=device)

    @torch.no_grad()
    def evaluate(x, y):
        out = torch.cat([net.forward(x[i : i + 1024], train=False) for i in range(0, len(x), 1024)], 1)
        acc = (out.argmax(-1) == y).float().mean(1)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.repeat(m), reduction="none")
        return acc.tolist(), loss.view(m, -1).mean(1).tolist()

    def checkpoint(epoch: int) -> None:
        accs, losses = evaluate(xva, yva)
        train_losses = last_loss.tolist()
        for j in range(m):
            name = f"ckpt-{len(records[j]) + 1:04d}.safetensors"
            identity = _save_state(net.state(j), folders[j] / name)
            records[j].append(_checkpoint_record(name, epoch, step, accs[j], losses[j], train_losses[j], identity))

    keys = list(params)
    for epoch in _epochs(cfg, progress, f"{m} runs, seed={seed}"):
        lr_now = lr * _lr_factor(cfg, epoch)
        for idx in _minibatches(n, bs, gen, device):
            step += 1
            out = net.forward(xtr[idx])  # [m, B, classes]
            yb = ytr[idx]
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.repeat(m), reduction="none").view(m, -1).mean(1)
            grads = torch.autograd.grad(loss.sum(), [params[k] for k in keys])
            with torch.no_grad():
                for k, g in zip(keys, grads):
                    if cfg.weight_decay:  # PyTorch's SGD: g ← g + λ θ before momentum
                        g = g.add(params[k], alpha=cfg.weight_decay)
                    buf = momentum[k].mul_(cfg.momentum).add_(g)
                    params[k].sub_(lr_now.view(-1, *([1] * (g.dim() - 1))) * buf)
            last_loss = loss.detach()
            diverged |= ~torch.isfinite(last_loss)
            if _due(cfg, "step", step):
                checkpoint(epoch)
        if _due(cfg, "epoch", epoch):
            checkpoint(epoch)
    for v in params.values():
        diverged |= ~torch.isfinite(v.detach().reshape(m, -1)).all(1)
    diverged_of = diverged.tolist()
    test_acc, test_loss = evaluate(*(t.to(device) for t in ds.test))
    seconds = (time.time() - started) / m
    return [
        {
            **_run_meta(
                cfg, folders[j].name, kwargs_of[j], pt, records[j], test_acc[j], test_loss[j], diverged_of[j], seconds
            ),
            "trained_with": "grouped",
        }
        for j, pt in enumerate(points)
    ]


_MALLOC_TUNED = False


def tune_cpu_malloc() -> bool:
    r"""Make glibc keep large freed buffers for reuse instead of unmapping them (Linux only).

    A training step on CPU allocates activations of tens of MB; glibc serves anything over
    its mmap threshold (at most 32 MB) with a fresh `mmap` that the kernel must zero page
    by page, and unmaps it on free. For the grouped digits sweep that was 40 % of the wall
    time in system calls. This raises the threshold to 1 GiB (and the trim threshold to 2 GiB)
    with `mallopt` for the whole process, once. It is what `run_sweep` does before
    training on CPU; set `DTG_NO_MALLOC_TUNING=1` to leave the allocator alone.

    Returns
    -------
    bool
        Whether the setting was applied (False off glibc or when opted out).
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return True
    if os.environ.get("DTG_NO_MALLOC_TUNING") or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 1 << 31))
    except (OSError, AttributeError):
        return False
    _MALLOC_TUNED = ok
    return ok


def _batches(cfg: SweepConfig, ds: Dataset, todo: list, group_size: int) -> list[list]:
    """The unfinished runs in training batches: up to `group_size` runs of one seed trained
    as one grouped network where the model allows, else one run each."""
    if group_size > 1 and _groupable(cfg, ds):
        by_seed: dict[int, list] = {}
        for item in todo:
            by_seed.setdefault(item[1]["seed"], []).append(item)
        return [g[i : i + group_size] for g in by_seed.values() for i in range(0, len(g), group_size)]
    return [[item] for item in todo]


def train_batch(
    cfg: SweepConfig, ds: Dataset, batch: list, out: Path, dev: torch.device, progress: bool = False
) -> list[str]:
    """Train one batch of `(name, point)` runs into `out/name` from scratch (an unfinished
    folder left by a killed attempt is cleared first) and write each `run.json` last,
    atomically: what a local sweep runs per batch, and a Ray task of `dtg sweep --ray`."""
    folders = [out / name for name, _ in batch]
    for folder in folders:
        _clear_for_training(out, folder)  # unfinished or damaged (checked under the lock): redo it
    if len(batch) > 1:
        metas = train_group(cfg, ds, [p for _, p in batch], folders, dev, progress=progress)
    else:
        metas = [train_run(cfg, ds, batch[0][1], folders[0], dev, progress=progress)]
    for folder, meta in zip(folders, metas):
        _write_json(folder / "run.json", meta)
    return [name for name, _ in batch]
