r"""Datasets for seed-model sweeps, as in-memory tensors of 32×32 images.

* ``digits`` (the offline default): scikit-learn's ``load_digits`` (1,797 8×8 images, no
  download), scaled to [0, 1] and resized to 32×32, with fixed seeded, stratified
  train / validation / test splits (70 / 15 / 15 %).
* ``mnist``, ``cifar10``, ``cifar100``: torchvision's datasets read from a local
  ``root``; downloaded only when ``download=True``. MNIST is padded from 28 to 32.
  Validation is a fixed seeded 10 % of the training set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .exceptions import DatasetNotFoundError

__all__ = ["Dataset", "DATASETS", "load_dataset"]

DATASETS = ("digits", "mnist", "cifar10", "cifar100")
# (number of classes, input channels) of each dataset, known without loading it
_SHAPES = {"digits": (10, 1), "mnist": (10, 1), "cifar10": (10, 3), "cifar100": (100, 3)}
_SPLIT_SEED = 0


def _key(name: str) -> str:
    """``"CIFAR-10"``, ``"cifar_10"`` → ``"cifar10"``."""
    return str(name).lower().replace("-", "").replace("_", "")


def _dataset_shape(name: str) -> tuple[int, int] | None:
    """``(num_classes, in_channels)`` of a known dataset name, without loading it; ``None``
    for a name :func:`load_dataset` does not know."""
    return _SHAPES.get(_key(name))


@dataclass
class Dataset:
    """Images ``[n, C, 32, 32]`` (float32) and labels ``[n]`` for each split."""

    name: str
    num_classes: int
    in_channels: int
    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


def _stratified_split(y: np.ndarray, fractions: tuple[float, ...], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in fractions]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cuts = np.cumsum([int(round(f * len(idx))) for f in fractions[:-1]])
        for i, chunk in enumerate(np.split(idx, cuts)):
            parts[i].extend(chunk.tolist())
    return [np.sort(np.array(p, dtype=int)) for p in parts]


def _digits() -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=32, mode="bilinear", align_corners=False)
    x = (x - 0.5) / 0.5
    y = torch.tensor(d.target, dtype=torch.long)
    tr, va, te = _stratified_split(d.target, (0.7, 0.15, 0.15), _SPLIT_SEED)
    return Dataset("digits", *_SHAPES["digits"], (x[tr], y[tr]), (x[va], y[va]), (x[te], y[te]))


def _torchvision(name: str, root: str | Path, download: bool) -> Dataset:
    import torchvision

    cls = {
        "mnist": torchvision.datasets.MNIST,
        "cifar10": torchvision.datasets.CIFAR10,
        "cifar100": torchvision.datasets.CIFAR100,
    }[name]
    root = Path(root).expanduser()
    try:
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False, download=download)
    except RuntimeError as exc:
        raise DatasetNotFoundError(
            f"{name} was not found under {root.resolve()} ({exc}). Put the torchvision "
            f"{cls.__name__} files there, or pass --download (dtg sweep) / download=True "
            "on a machine with internet access."
        ) from None

    def tensors(ds):
        data = torch.as_tensor(np.asarray(ds.data))
        if data.dim() == 3:  # MNIST: [n, 28, 28] uint8 → pad to 32
            x = F.pad(data.unsqueeze(1).float() / 255.0, (2, 2, 2, 2))
        else:  # CIFAR: [n, 32, 32, 3] uint8
            x = data.permute(0, 3, 1, 2).float() / 255.0
        return (x - 0.5) / 0.5, torch.as_tensor(np.asarray(ds.targets), dtype=torch.long)

    xtr, ytr = tensors(train)
    xte, yte = tensors(test)
    tr, va = _stratified_split(ytr.numpy(), (0.9, 0.1), _SPLIT_SEED)
    classes = _SHAPES[name][0]
    return Dataset(name, classes, xtr.shape[1], (xtr[tr], ytr[tr]), (xtr[va], ytr[va]), (xte, yte))


def load_dataset(name: str, root: str | Path | None = None, download: bool = False) -> Dataset:
    r"""Load a dataset by name.

    Parameters
    ----------
    name : {"digits", "mnist", "cifar10", "cifar100"}
    root : path, optional
        Where torchvision datasets live (default ``./data``). Unused for ``digits``.
    download : bool, default False
        Let torchvision download a missing dataset (needs internet).

    Raises
    ------
    ValueError
        Unknown name.
    DatasetNotFoundError
        The dataset is not under ``root``: the message says where we looked and how to
        get it.

    Examples
    --------
    >>> ds = load_dataset("digits")
    >>> ds.train[0].shape[1:], ds.num_classes, len(ds.test[1])
    (torch.Size([1, 32, 32]), 10, 270)
    """
    key = _key(name)
    if key == "digits":
        return _digits()
    if key in ("mnist", "cifar10", "cifar100"):
        return _torchvision(key, root if root is not None else "data", download)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
