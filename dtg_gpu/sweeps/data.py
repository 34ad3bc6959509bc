r"""Datasets for seed-model sweeps, as in-memory tensors of 32×32 images.

* `digits` (the offline default): scikit-learn's `load_digits` (1,797 8×8 images, no
  download), scaled to [0, 1] and resized to 32×32, with fixed seeded, stratified
  train / validation / test splits (70 / 15 / 15 %).
* `shapes` (offline, procedural): 32×32 colour images of ten classes of shapes and
  textures (disk, square, triangle, ring, cross, stripes, checkerboard, concentric rings, two
  dots, ellipse) at a random position, size, angle and colour over a noisy gradient
  background; generated from a fixed seed (nothing is downloaded), 3,000 / 600 / 600 images.
  CIFAR-shaped, so VGG and ResNet train on it as on CIFAR-10, at small width on a CPU.
* `mnist`, `cifar10`, `cifar100`: torchvision's datasets read from a local
  `root`; downloaded only when `download=True`. MNIST is padded from 28 to 32.
  Validation is a fixed seeded 10 % of the training set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dtg_gpu.exceptions import DatasetNotFoundError

__all__ = ["Dataset", "DATASETS", "SHAPES_CLASSES", "load_dataset", "make_shapes"]

DATASETS = ("digits", "shapes", "mnist", "cifar10", "cifar100")
# (number of classes, input channels) of each dataset, known without loading it
_SHAPES = {"digits": (10, 1), "shapes": (10, 3), "mnist": (10, 1), "cifar10": (10, 3), "cifar100": (100, 3)}
_SPLIT_SEED = 0


def _key(name: str) -> str:
    """`"CIFAR-10"`, `"cifar_10"` → `"cifar10"`."""
    return str(name).lower().replace("-", "").replace("_", "")


def dataset_shape(name: str) -> tuple[int, int] | None:
    """`(num_classes, in_channels)` of a known dataset name, without loading it; `None`
    for a name `load_dataset` does not know."""
    return _SHAPES.get(_key(name))


@dataclass
class Dataset:
    """Images `[n, C, 32, 32]` (float32) and labels `[n]` for each split."""

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


SHAPES_CLASSES = (
    "disk",
    "square",
    "triangle",
    "ring",
    "cross",
    "stripes",
    "checkerboard",
    "concentric",
    "two dots",
    "ellipse",
)


def make_shapes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""`n` procedural 32×32 RGB images in [-1, 1] and their labels (`n // 10` or one more
    of each class), the same bits for the same `(n, seed)` on every machine (NumPy's PCG64).

    Each image: a linear colour gradient background, one shape of its class (centre within
    the middle 12 pixels, radius 7–12, a random angle, a colour at least 0.5 away from
    the background in some channel), and Gaussian pixel noise (σ = 0.1).

    Examples
    --------
    >>> x, y = make_shapes(20, seed=0)
    >>> tuple(x.shape), sorted(set(y.tolist())) == list(range(10))
    ((20, 3, 32, 32), True)
    """
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 10
    rng.shuffle(y)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    cx, cy = rng.uniform(10, 22, (2, n, 1, 1)).astype(np.float32)
    r = rng.uniform(7, 12, (n, 1, 1)).astype(np.float32)
    theta = rng.uniform(0, np.pi, (n, 1, 1)).astype(np.float32)
    period = rng.uniform(3.5, 6.0, (n, 1, 1)).astype(np.float32)
    dx, dy = xx - cx, yy - cy
    u = dx * np.cos(theta) + dy * np.sin(theta)
    v = -dx * np.sin(theta) + dy * np.cos(theta)
    d = np.sqrt(dx * dx + dy * dy)
    au, av = np.abs(u), np.abs(v)
    window = d < r
    wave = 2 * np.pi / period
    masks = [
        d < r,
        np.maximum(au, av) < 0.75 * r,
        (v > -0.5 * r) & (np.sqrt(3) * au + v < r),
        np.abs(d - 0.75 * r) < 0.22 * r,
        ((au < 0.25 * r) | (av < 0.25 * r)) & (np.maximum(au, av) < r),
        window & (np.sin(u * wave) > 0),
        window & (np.sin(u * wave) * np.sin(v * wave) > 0),
        window & (np.sin(d * wave) > 0),
        (np.hypot(au - 0.5 * r, v) < 0.3 * r),
        (u / r) ** 2 + (v / (0.45 * r)) ** 2 < 1,
    ]
    mask = np.choose(y[:, None, None], masks).astype(np.float32)[:, None]
    bg0, bg1 = rng.uniform(0, 1, (2, n, 3, 1, 1)).astype(np.float32)
    ramp = rng.uniform(0, np.pi * 2, (n, 1, 1, 1)).astype(np.float32)
    t = ((xx * np.cos(ramp) + yy * np.sin(ramp)) / 44.0 + 0.5).astype(np.float32)
    bg = bg0 + (bg1 - bg0) * t
    fg = rng.uniform(0, 1, (n, 3, 1, 1)).astype(np.float32)
    gap = fg - bg.mean(axis=(2, 3), keepdims=True)
    weak = np.abs(gap).max(axis=1, keepdims=True) < 0.5
    fg = np.where(weak, np.clip(fg + np.sign(gap + 1e-6) * 0.6, 0, 1), fg)
    img = bg + (fg - bg) * mask + rng.normal(0, 0.1, (n, 3, 32, 32)).astype(np.float32)
    x = torch.from_numpy((np.clip(img, 0, 1) - 0.5) / 0.5).float()
    return x.contiguous(), torch.from_numpy(y.astype(np.int64))


def _shapes() -> Dataset:
    parts = [make_shapes(n, seed) for n, seed in ((3000, 1), (600, 2), (600, 3))]
    return Dataset("shapes", *_SHAPES["shapes"], parts[0], parts[1], parts[2])


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
    name : {"digits", "shapes", "mnist", "cifar10", "cifar100"}
    root : path, optional
        Where torchvision datasets live (default `./data`). Unused for `digits` and
        `shapes` (built in memory).
    download : bool, default False
        Let torchvision download a missing dataset (needs internet).

    Raises
    ------
    ValueError
        Unknown name.
    DatasetNotFoundError
        The dataset is not under `root`: the message says where we looked and how to
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
    if key == "shapes":
        return _shapes()
    if key in ("mnist", "cifar10", "cifar100"):
        return _torchvision(key, root if root is not None else "data", download)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
