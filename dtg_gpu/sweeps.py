r"""Seed-model sweeps (method step 1): one architecture, one dataset, a grid of learning
rates × dropout rates × seeds, written in the on-disk format of docs/method.md.

Crash safety: every file is written to a hidden temporary beside it
(`.NAME.XXXXXXXX.tmp.SUFFIX`, see `atomic_write`) and renamed into place, and a run's
`run.json` is written last, so a folder without a complete `run.json` is unfinished.
A restarted sweep skips complete runs and redoes unfinished ones from scratch; killing it
at any moment loses no completed run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dtg_gpu._engine import resolve_device
from dtg_gpu._files import atomic_write, confined_path
from dtg_gpu._grouped import GroupedSequential, sequential_layers
from dtg_gpu.checkpoints import Run, read_manifest
from dtg_gpu.data import Dataset, load_dataset
from dtg_gpu.exceptions import CheckpointError, DTGWarning, SweepLockedError
from dtg_gpu.models import build_model
from dtg_gpu.sweep_config import LR_SCHEDULES, OPTIMIZERS, PRESETS, SUITE, SweepConfig, lr_factor

__all__ = [
    "SweepConfig",
    "SweepRuns",
    "run_sweep",
    "load_sweep",
    "atomic_write",
    "tune_cpu_malloc",
    "PRESETS",
    "SUITE",
    "OPTIMIZERS",
    "LR_SCHEDULES",
]


def _write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2))


def _save_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """Write a state dict as safetensors, atomically; returns its size and SHA-256, which
    `run.json` records so that a resumed sweep or a reader can tell a damaged file."""
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    atomic_write(path, lambda tmp: save_file(cpu, str(tmp)))
    return _file_identity(path)


def _file_identity(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": _sha256_of(path)}


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
    return {
        "name": name,
        "model": cfg.model,
        "model_kwargs": model_kwargs,
        "dataset": cfg.dataset,
        "lr": point["lr"],
        "dropout": point["dropout"],
        "seed": point["seed"],
        "epochs": int(cfg.epochs),
        "optimizer": cfg.optimizer,
        "momentum": cfg.momentum,
        "weight_decay": cfg.weight_decay,
        "lr_schedule": cfg.lr_schedule,
        "batch_size": int(cfg.batch_size),
        "checkpoint_every": cfg.checkpoint_every,
        "checkpoint_unit": cfg.checkpoint_unit,
        "checkpoints": checkpoints,
        "final_accuracy": test_acc,
        "test_loss": _finite_or_none(test_loss),
        "status": "diverged" if diverged else "complete",
        "complete": True,
        "seconds": round(seconds, 3),
    }


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


def _is_complete(folder: Path, verify: bool = False) -> bool:
    """A run folder is complete when its `run.json` says so and every checkpoint it lists
    is there, inside the folder, with the size (and with `verify`, the SHA-256) recorded."""
    return _state_of(folder, verify=verify) == "complete"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _state_of(folder: Path, verify: bool = False) -> str:
    """`"complete"`, `"unfinished"` (no `run.json` yet: training stopped before the end),
    or why a run is damaged: a `run.json` that cannot be read or does not say complete, a
    file missing, outside the folder, not of the size recorded, or (`verify`) not of the
    SHA-256 recorded."""
    manifest = folder / "run.json"
    if not manifest.exists() and not manifest.is_symlink():
        return "unfinished"
    try:
        meta = read_manifest(manifest)
    except CheckpointError as exc:
        return f"{exc} (damaged; dtg sweep moves it aside and trains the run again)"
    if not isinstance(meta, dict) or meta.get("complete") is not True:
        return f"{manifest}: does not say the run is complete (not a run dtg sweep finished)"
    cps = meta.get("checkpoints")
    if not isinstance(cps, list) or not cps:
        return f"{manifest}: complete but lists no checkpoints"
    for i, c in enumerate(cps):
        if not isinstance(c, dict):
            return f"{manifest}: checkpoints[{i}] is not an object"
        try:
            f = confined_path(folder, c.get("file"), what=f"{manifest}: checkpoints[{i}].file")
        except CheckpointError as exc:
            return str(exc)
        try:
            size = f.stat().st_size if f.is_file() else None
        except OSError:
            size = None
        if size is None:
            return f"{f}: checkpoint file missing"
        if "bytes" in c and c["bytes"] != size:
            return (
                f"{f}: {size} bytes, run.json recorded {c['bytes']} (damaged or truncated; "
                "rerun the sweep to retrain the run)"
            )
        if verify and isinstance(c.get("sha256"), str):
            try:
                digest = _sha256_of(f)
            except OSError as exc:
                return f"{f}: cannot be read: {exc.strerror or exc}"
            if digest != c["sha256"]:
                return f"{f}: its SHA-256 is not the one run.json recorded (the file changed since training)"
    return "complete"


#: The files `dtg sweep` writes into a run folder before its `run.json`: checkpoints and
#: the temporaries of their atomic writes. An unfinished folder holding only these is cleared.
_OWN_PARTIAL = re.compile(r"ckpt-\d{4,}\.safetensors|\.ckpt-\d{4,}\.safetensors\.[^/]*\.tmp\.safetensors")
ASIDE_DIRNAME = ".dtg-aside"


def _move_aside(out: Path, folder: Path, why: str) -> Path:
    """Rename `folder` (or a file or link in its place) into `out/.dtg-aside/` under a
    fresh name and say so: dtg never deletes what it cannot prove it wrote."""
    aside = out / ASIDE_DIRNAME
    aside.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        target = aside / f"{folder.name}-{stamp}" if n == 0 else aside / f"{folder.name}-{stamp}-{n}"
        if not target.exists() and not target.is_symlink():
            break
    os.rename(folder, target)
    warnings.warn(f"{folder}: {why}; moved aside to {target} and training the run again", DTGWarning, stacklevel=3)
    return target


def _clear_for_training(out: Path, folder: Path) -> None:
    """Make `folder` an empty run folder: an unfinished one that holds only dtg's own
    checkpoints is emptied; anything else (a `run.json`, a user's file, a damaged run, a
    link or file in its place) is moved aside whole."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        _move_aside(out, folder, "not a run folder dtg wrote")
    elif folder.is_dir():
        entries = list(folder.iterdir())
        own = all(e.is_file() and not e.is_symlink() and _OWN_PARTIAL.fullmatch(e.name) for e in entries)
        if own and _state_of(folder) == "unfinished":
            for e in entries:
                e.unlink()
        else:
            state = _state_of(folder, verify=True)
            _move_aside(out, folder, "unfinished, with files dtg did not write" if state == "unfinished" else state)
    folder.mkdir(exist_ok=True)


def _grid_mismatch(folder: Path, cfg: SweepConfig, point: dict[str, Any]) -> str | None:
    """Why a complete run is not the one the grid puts there (model, data, lr, dropout or
    seed differ), or `None`."""
    try:
        meta = read_manifest(folder / "run.json")
    except CheckpointError as exc:
        return str(exc)
    want = {"model": cfg.model, "dataset": cfg.dataset, **point}
    got = {k: meta.get(k) if isinstance(meta, dict) else None for k in want}
    if got == want:
        return None
    diff = ", ".join(f"{k}={got[k]!r} where the grid has {want[k]!r}" for k in want if got[k] != want[k])
    return f"{folder / 'run.json'}: a run of another sweep ({diff})"


def _sweep_grid(meta: Any) -> tuple[SweepConfig, list[dict[str, Any]]] | None:
    """The config and grid a `sweep.json` records, when it is one dtg can rebuild."""
    config = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(config, dict):
        return None
    try:
        cfg = SweepConfig(**config)
        cfg.validate()
        return cfg, cfg.grid()
    except (TypeError, ValueError):
        return None


def run_sweep(
    cfg: SweepConfig,
    out: str | os.PathLike,
    *,
    data_root: str | None = None,
    download: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
    dataset: Dataset | None = None,
    group_size: int = 32,
    executor: str = "local",
    address: str | None = None,
) -> Path:
    r"""Train every run of the grid into `out` (resumable).

    Parameters
    ----------
    cfg : SweepConfig
    out : path
        Sweep folder: `sweep.json` and `run-0000/`, `run-0001/`, ...
    data_root, download
        Where torchvision datasets live, and whether they may be downloaded.
    device : optional
        `None`: CUDA when available.
    progress : bool, default True
        tqdm bars over runs and epochs.
    group_size : int, default 32
        Up to this many runs of one seed are trained at once as one grouped network (plain
        SGD, sequential CNNs such as LeNet-5 and VGG without batch norm; see
        `dtg_gpu._grouped`); `1` trains one run at a time.
    executor : {"local", "ray"}, default "local"
        `"ray"`: each batch of runs is one Ray task (`num_gpus=1` when the cluster has
        GPUs), which loads the dataset on its node (`data_root` must be readable there),
        trains and writes its run folders into `out` (storage every node sees). A batch
        whose task fails is named in a [`SweepFailedError`][dtg_gpu.exceptions.SweepFailedError] after
        the others finish; rerunning trains only what is not complete. Needs
        `pip install 'dtg_gpu[ray]'`.
    address : str, optional
        The Ray cluster (as in [`featurize_sweep`][dtg_gpu.workflow.featurize_sweep]); default: the one
        this process is connected to, else a local instance for this call.

    Returns
    -------
    Path of the sweep folder.

    Raises
    ------
    ValueError
        A bad config, or `out` holds a different sweep.
    DatasetNotFoundError
        The dataset is not under `data_root`.
    """
    cfg.validate()
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    out = Path(out)
    grid = cfg.grid()
    names = [f"run-{i:04d}" for i in range(len(grid))]
    manifest: dict[str, Any] = {
        "format": "dtg_gpu.sweep/1",
        "config": asdict(cfg),
        "runs": names,
        "grid": {"lr": list(map(float, cfg.lrs)), "dropout": list(map(float, cfg.dropouts)), "seeds": int(cfg.seeds)},
    }
    manifest["config"]["lrs"] = list(map(float, cfg.lrs))
    manifest["config"]["dropouts"] = list(map(float, cfg.dropouts))
    path = out / "sweep.json"
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    if path.is_file():
        _check_same_sweep(out, path, manifest)
        if all(_is_complete(out / name, verify=True) for name in names):
            _warn_foreign(out, cfg, names, grid)
            return out
    elif out.is_dir():
        _check_empty(out)
    ds = dataset or load_dataset(cfg.dataset, data_root, download)
    _check_trainable(cfg, ds)
    dev = resolve_device(device) if executor == "local" else torch.device("cpu")
    out.mkdir(parents=True, exist_ok=True)
    with _sweep_lock(out):
        if path.is_file():  # another process may have written it since
            _check_same_sweep(out, path, manifest)
        else:
            _check_empty(out)
            _write_json(path, manifest)
        # under the lock: what is complete (the recorded SHA-256 of every checkpoint checked)
        # is final; other folders are cleared or moved aside and trained again
        todo = [(name, point) for name, point in zip(names, grid) if not _is_complete(out / name, verify=True)]
        _warn_foreign(out, cfg, names, grid)
        if todo and executor == "ray":
            from dtg_gpu.integrations.ray_cluster import train_batches

            train_batches(
                cfg,
                _batches(cfg, ds, todo, group_size),
                out,
                device=device,
                data_root=data_root,
                download=download,
                dataset=dataset,
                progress=progress,
                address=address,
                done=len(grid) - len(todo),
                total=len(grid),
            )
        elif todo:
            _train_todo(cfg, ds, todo, grid, out, dev, progress, group_size)
    return out


def _check_same_sweep(out: Path, path: Path, manifest: dict) -> None:
    """`out` may hold this sweep (resume) or nothing trained yet; never a different one."""
    old = read_manifest(path)
    # fields added since: a sweep written before them resumes
    defaults = {"weight_decay": 0.0, "lr_schedule": "constant"}
    if (
        isinstance(old, dict)
        and isinstance(old.get("config"), dict)
        and {**defaults, **old["config"]} == manifest["config"]
    ):
        return
    started = any(
        (out / n).exists()
        for n in (old.get("runs", []) if isinstance(old, dict) else [])
        if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")
    )
    if started:
        raise ValueError(f"{out} already holds a different sweep (sweep.json differs); choose another --out folder")


def _warn_foreign(out: Path, cfg: SweepConfig, names: list[str], grid: list[dict[str, Any]]) -> None:
    """Complete runs that are not the grid's are kept as they are (never trained over) and
    named; [`load_sweep`][dtg_gpu.sweeps.load_sweep] leaves them out as failed."""
    foreign = [why for n, p in zip(names, grid) if _is_complete(out / n) and (why := _grid_mismatch(out / n, cfg, p))]
    if foreign:
        warnings.warn(
            f"{out}: {len(foreign)} complete run(s) are not this sweep's and are left as they are "
            f"(load_sweep leaves them out): {foreign[0]}",
            DTGWarning,
            stacklevel=3,
        )


def _check_empty(out: Path) -> None:
    """A folder without `sweep.json` must be empty (a crashed start may leave the lock file):
    dtg never adopts, or deletes, what it did not write."""
    others = sorted(e.name for e in out.iterdir() if e.name != ".dtg-sweep.lock")
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise ValueError(
            f"{out}: not empty and has no sweep.json of dtg ({shown}); dtg sweep trains into a new or "
            "empty folder, or resumes its own: choose another --out"
        )


def _check_trainable(cfg: SweepConfig, ds: Dataset) -> None:
    """What needs the dataset: the model builds with these kwargs, and a run saves a checkpoint."""
    try:
        with torch.device("meta"):
            build_model(
                cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels, dropout=0.0, **cfg.model_kwargs
            )
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"cannot build {cfg.model!r} with model_kwargs {cfg.model_kwargs}: {exc}") from None
    steps = cfg.epochs * -(-len(ds.train[0]) // cfg.batch_size)
    total = steps if cfg.checkpoint_unit == "step" else cfg.epochs
    if cfg.checkpoint_every > total:
        raise ValueError(
            f"checkpoint_every={cfg.checkpoint_every} {cfg.checkpoint_unit}s is longer than "
            f"the run ({total} {cfg.checkpoint_unit}s): no checkpoint would be saved"
        )


@contextmanager
def _sweep_lock(out: Path):
    """An exclusive OS lock on the sweep folder for the whole training: it dies with the
    process (a killed sweep never blocks its restart), and a second `dtg sweep` on the
    same folder is refused instead of deleting the first one's runs."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    lock = out / ".dtg-sweep.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepLockedError(
                f"{out}: another process is training this sweep (it holds {lock.name}); "
                "wait for it to finish, or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)


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


def _train_todo(cfg, ds, todo, grid, out, dev, progress, group_size) -> None:
    if dev.type == "cpu":
        tune_cpu_malloc()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(grid), initial=len(grid) - len(todo), desc="sweep", unit="run")
    try:
        for batch in _batches(cfg, ds, todo, group_size):
            train_batch(cfg, ds, batch, out, dev, progress)
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()


class SweepRuns(list):
    """The runs of a sweep (a `list` of [`Run`][dtg_gpu.Run]), in `failed` the run
    folders that could not be read, each with the reason, and in `path` the sweep folder
    (where [`featurize_sweep`][dtg_gpu.workflow.featurize_sweep] keeps its feature cache)."""

    def __init__(self, runs=(), failed: dict[str, str] | None = None, path: str | os.PathLike | None = None):
        super().__init__(runs)
        self.failed: dict[str, str] = dict(failed or {})
        self.path: Path | None = Path(path) if path is not None else None


def load_sweep(
    path: str | os.PathLike,
    *,
    strict: bool = False,
    model: "torch.nn.Module | None" = None,
    prefix: str | None = None,
    pattern: str | None = None,
) -> SweepRuns:
    """The complete runs of a sweep folder, in grid order.

    Unfinished runs are skipped with a warning. A complete run whose folder cannot be read
    (corrupt `run.json`, missing or foreign checkpoint files, unknown model) is left out
    and named, with the reason, in the returned list's `failed` and in one
    [`FailedRunsWarning`][dtg_gpu.exceptions.FailedRunsWarning]; one bad run never stops the sweep.

    Parameters
    ----------
    path : path-like
        The sweep folder (`sweep.json` and one folder per run).
    strict : bool, default False
        Raise the first run's error instead.
    model : torch.nn.Module, optional
        The architecture of every run (your own class), instead of the one each `run.json`
        names. With a model, `path` may also be a plain folder of run folders without
        `sweep.json` (Lightning, Hugging Face or numbered checkpoint files, see
        [`from_dir`][dtg_gpu.Run.from_dir]): every sub-folder holding checkpoints is a run, in
        the natural order of the names; a `run.json` beside the checkpoints may give its
        `final_accuracy`.
    prefix : str, optional
        Key prefix of the weights in the checkpoints (as in [`Run`][dtg_gpu.Run]).
    pattern : str, optional
        In folders without `run.json`: which checkpoint files, as a glob (`"ema_*.pt"`;
        see [`from_dir`][dtg_gpu.Run.from_dir]).

    Raises
    ------
    FileNotFoundError
        No `sweep.json` in `path` (and no `model` given).
    CheckpointError
        `sweep.json` is not valid (not JSON, no `runs` list, a run name that leads
        outside the folder); the message names the file and the field.
    """
    from dtg_gpu._engine import READ_ERRORS
    from dtg_gpu.analysis import warn_failures

    path = Path(path)
    manifest = path / "sweep.json"
    if not manifest.is_file() and model is not None and path.is_dir():
        return _load_run_folders(path, model, prefix, strict, pattern)
    if not manifest.is_file():
        raise FileNotFoundError(
            f"{path}: no sweep.json here; is this a sweep folder (dtg sweep --out)? "
            "(a folder of your own run folders needs model=... / --model)"
        )
    meta = read_manifest(manifest)
    if not isinstance(meta, dict) or not isinstance(meta.get("runs"), list):
        raise CheckpointError(f"{manifest}: expected an object with a list 'runs' of run folder names")
    names = meta["runs"]
    for i, n in enumerate(names):  # every run folder inside the sweep folder, by name
        confined_path(path, n, what=f"{manifest}: runs[{i}]")
        if not isinstance(n, str) or "/" in n or "\\" in n or n in (".", ".."):
            raise CheckpointError(f"{manifest}: runs[{i}] must be a folder name inside {path}, got {n!r}")
    states = {n: _state_of(path / n) for n in names}
    rebuilt = _sweep_grid(meta)
    if rebuilt is not None and len(rebuilt[1]) == len(names):
        for n, point in zip(names, rebuilt[1]):
            if states[n] == "complete" and (why := _grid_mismatch(path / n, rebuilt[0], point)):
                states[n] = why
    done = [n for n in names if states[n] == "complete"]
    unfinished = [n for n in names if states[n] == "unfinished"]
    if unfinished:
        warnings.warn(
            f"{path}: {len(unfinished)} of {len(names)} runs are unfinished "
            "and skipped; rerun the sweep to complete them",
            DTGWarning,
            stacklevel=2,
        )
    runs = SweepRuns(failed={n: why for n, why in states.items() if why not in ("complete", "unfinished")}, path=path)
    if runs.failed and strict:
        raise CheckpointError(next(iter(runs.failed.values())))
    for n in done:
        try:
            runs.append(Run.from_dir(path / n, model=model, prefix=prefix, pattern=pattern))
        except READ_ERRORS as exc:
            if strict:
                raise
            runs.failed[n] = str(exc)
    warn_failures(runs.failed, stacklevel=2)
    return runs


def _load_run_folders(path: Path, model, prefix: str | None, strict: bool, pattern: str | None = None) -> SweepRuns:
    """Every sub-folder of `path` that holds checkpoints, as a run of `model`."""
    from dtg_gpu._engine import READ_ERRORS
    from dtg_gpu.analysis import warn_failures
    from dtg_gpu.checkpoints import _natural_key, _scan_checkpoints

    runs = SweepRuns(path=path)
    for sub in sorted(
        (d for d in path.iterdir() if d.is_dir() and not d.name.startswith(".")), key=lambda d: _natural_key(d.name)
    ):
        try:
            if not (sub / "run.json").is_file() and not _scan_checkpoints(sub, pattern):
                continue  # not a run folder
            runs.append(Run.from_dir(sub, model=model, prefix=prefix, pattern=pattern))
        except READ_ERRORS as exc:
            if strict:
                raise
            runs.failed[sub.name] = str(exc)
    if not runs and not runs.failed:
        raise CheckpointError(f"{path}: no sweep.json and no run folder with checkpoints in it")
    warn_failures(runs.failed, stacklevel=3)
    return runs
