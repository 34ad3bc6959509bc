r"""The per-run feature cache: raw statistics of every solved run, kept beside the sweep.

A killed or failed featurisation resumes where it stopped, locally or on Ray: each unit of
work (`plan_units`, whole runs solved as one batch) writes one small
file per run, atomically, as soon as it is solved::

    SWEEP/.dtg-cache/<run name>/<key>.safetensors

The key is a SHA-256 of everything the numbers depend on:

- the library version, the solver's revision and the solver settings (`k`, dtype, `tol`, `max_iter`,
  `method`, the per-layer and eigenvalue options);
- the unit: its chunk size and, for every run in it, the name, the architecture's
  signature, the key prefix and each checkpoint file's identity: path relative to the sweep
  folder, size, modification time, inode and status-change time (ctime, in ns), and the
  SHA-256 that `run.json` records for it where there is one.

So a rewritten checkpoint, another architecture or other settings never read a stale entry,
and a hit is bit-identical to solving again (the same graphs in the same batch). A file
replaced by another of the same size with its timestamp restored (`cp -p`, `touch -r`,
`tar x`, `rsync -a`) still misses: restoring a timestamp sets the ctime to now, which no
user can set back. Entries are stored per run *folder* (two runs of one name in different
folders never share one). What a
hit does *not* depend on: the device (a cache written on GPUs is reused on a CPU, and the
other way round) and `alpha` (the entries hold the statistics before temporal smoothing).

Entries are untrusted files like any other: read with `safetensors` (no code runs),
size-checked first, and checked against the key, shape and dtype; anything else is a miss
and is solved again. Runs held in memory (state dicts, not files) are never cached. Delete
the folder to drop the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dtg_gpu.core.files import atomic_write
from dtg_gpu.exceptions import DTGWarning

__all__ = ["CACHE_DIRNAME", "CachedRun", "FeatureCache", "run_id", "unit_key"]

CACHE_DIRNAME = ".dtg-cache"
FORMAT = "dtg_gpu.features.temporal/1"
# Bumped whenever the solver's arithmetic changes (the last bits of a statistic can move), so
# that no entry solved before is mixed with fresh ones. 2: B x as xᵀBᵀ on the transposed view.
# 3: the moments of (x - mean) / max|x - mean| (no float32 underflow of a tiny layer's kurtosis).
SOLVER_REVISION = 3
MAX_ENTRY_BYTES = 64 << 20


@dataclass
class CachedRun:
    """One run's part of a solved unit: `[k, F]` statistics and `[k]` flags."""

    stats: torch.Tensor  # [k, F] in the solve dtype
    residual: torch.Tensor  # [k] float64
    finite: torch.Tensor  # [k] bool
    converged: torch.Tensor  # [k] bool
    connected: torch.Tensor  # [k] bool


def _stamp(st: os.stat_result) -> list[int]:
    """What a timestamp restore cannot forge: size, mtime, inode, ctime."""
    return [int(st.st_size), int(st.st_mtime_ns), int(st.st_ino), int(st.st_ctime_ns)]


def _identity(path: Any, root: Path | None) -> list | None:
    if isinstance(path, Mapping):
        return None
    try:
        p = Path(path).resolve()
        st = p.stat()
    except (OSError, TypeError, ValueError):
        return None
    try:
        name = p.relative_to(root).as_posix() if root is not None else p.as_posix()
    except ValueError:
        name = p.as_posix()
    if p.is_dir():  # a Hugging Face checkpoint-N/ folder: its files (a rewrite leaves the folder's mtime)
        try:
            files = sorted(f for f in p.iterdir() if f.is_file())
            return [name, [[f.name, *_stamp(f.stat())] for f in files]]
        except OSError:
            return None
    return [name, *_stamp(st)]


def _recorded_hashes(run: Any, k: int) -> list:
    """The SHA-256 `run.json` records for each of the first `k` checkpoints (None where absent)."""
    listed = run.meta.get("checkpoints") if isinstance(getattr(run, "meta", None), dict) else None
    if not isinstance(listed, list):
        return [None] * k
    out = [c.get("sha256") if isinstance(c, dict) and isinstance(c.get("sha256"), str) else None for c in listed[:k]]
    return out + [None] * (k - len(out))


def run_id(run: Any, root: Path | None) -> str:
    """Where a run's entries live: its folder relative to the cache's root (the folder of its
    first checkpoint), else its name (runs held in memory are never cached anyway)."""
    first = run.checkpoints[0] if len(run.checkpoints) else None
    if isinstance(first, (str, os.PathLike)):
        folder = Path(first).resolve().parent
        try:
            return folder.relative_to(root).as_posix() if root is not None else folder.as_posix()
        except ValueError:
            return folder.as_posix()
    return str(run.name)


def unit_key(
    runs: Sequence, k: int, chunk: int, settings: Mapping[str, Any], signature: str, root: Path | None
) -> str | None:
    """The cache key of a unit (hex SHA-256), or `None` when a checkpoint of it is not a
    file that can be identified (in memory, missing): such a unit is always solved."""
    from dtg_gpu.core.version import __version__

    members = []
    for run in runs:
        ids = [_identity(c, root) for c in run.checkpoints[:k]]
        if any(i is None for i in ids):
            return None
        members.append([str(run.name), run.prefix, ids, _recorded_hashes(run, k)])
    blob = json.dumps(
        {
            "format": FORMAT,
            "version": __version__,
            "solver": SOLVER_REVISION,
            "settings": dict(settings),
            "k": int(k),
            "chunk": int(chunk),
            "architecture": signature,
            "runs": members,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def cache_architecture_key(topology, model) -> str:
    """A short hash of the channel graph's layout and the model's class."""
    text = repr(
        (
            type(model).__module__,
            type(model).__qualname__,
            topology.signature(),
            tuple(l.effective is not None for l in topology.layers),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _folder_name(name: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}", name):
        return name
    if "/" in name and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._/-]{0,99}", name) and ".." not in name.split("/"):
        return name.replace("/", "__")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:60].lstrip(".") or "run"
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


class FeatureCache:
    """Per-run entries under `folder` (see the module's description).

    Parameters
    ----------
    folder : path-like
        Created on the first write. A folder that cannot be written is reported once
        ([`DTGWarning`][dtg_gpu.exceptions.DTGWarning]) and the featurisation goes on uncached.
    root : path-like, optional
        Checkpoint paths are identified relative to it (default: `folder`'s parent, the
        sweep folder), so a sweep moved or mounted elsewhere keeps its cache.
    """

    def __init__(self, folder: str | os.PathLike, root: str | os.PathLike | None = None, confine: bool = False):
        self.folder = Path(folder)
        self.root = Path(root if root is not None else self.folder.parent).resolve()
        self.confine = confine
        self._warned = False
        self._cleaned = False

    def usable(self) -> bool:
        """With `confine` (the sweep's own `.dtg-cache`): a cache folder that resolves
        outside the sweep (a symlink out of it) is never written or read."""
        if not self.confine:
            return True
        real = self.folder.resolve()
        if real.is_relative_to(self.root) and real != self.root:
            return True
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"feature cache {self.folder} leads outside the sweep folder ({real}); going on "
                "without it (make it a plain folder inside the sweep, or pass cache=False / --no-cache)",
                DTGWarning,
                stacklevel=4,
            )
        return False

    def _clean_stale(self, age_s: float = 60.0) -> None:
        """Remove temporaries a killed writer left (older than `age_s`), once per cache."""
        if self._cleaned:
            return
        self._cleaned = True
        import time

        now = time.time()
        try:
            for tmp in self.folder.glob("*/.*.tmp.safetensors"):
                try:
                    if not tmp.is_symlink() and tmp.is_file() and now - tmp.stat().st_mtime > age_s:
                        tmp.unlink()
                except OSError:
                    pass
        except OSError:
            pass

    def _path(self, run_name: str, key: str) -> Path:
        return self.folder / _folder_name(str(run_name)) / f"{key[:40]}.safetensors"

    def load(self, run_name: str, key: str, k: int, width: int, dtype: torch.dtype) -> CachedRun | None:
        """The entry of `run_name` under `key`, or `None` (absent, damaged, or another key)."""
        from safetensors import safe_open

        path = self._path(run_name, key)
        try:
            if not self.usable() or not path.is_file() or path.stat().st_size > MAX_ENTRY_BYTES:
                return None
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("format") != FORMAT or meta.get("key") != key or meta.get("run") != str(run_name):
                    return None
                t = {name: f.get_tensor(name) for name in f.keys()}
        except Exception:  # an untrusted file that is not a valid entry: solve again
            return None
        try:
            entry = CachedRun(
                stats=t["stats"],
                residual=t["residual"],
                finite=t["finite"].bool(),
                converged=t["converged"].bool(),
                connected=t["connected"].bool(),
            )
        except KeyError:
            return None
        if (
            entry.stats.shape != (k, width)
            or entry.stats.dtype != dtype
            or any(getattr(entry, f).shape != (k,) for f in ("residual", "finite", "converged", "connected"))
        ):
            return None
        return entry

    def store(self, run_name: str, key: str, entry: CachedRun) -> None:
        """Write one run's entry atomically; a write that fails warns once and is skipped."""
        from safetensors.torch import save_file

        path = self._path(run_name, key)
        tensors = {
            "stats": entry.stats.contiguous(),
            "residual": entry.residual.double().contiguous(),
            "finite": entry.finite.to(torch.uint8),
            "converged": entry.converged.to(torch.uint8),
            "connected": entry.connected.to(torch.uint8),
        }
        meta = {"format": FORMAT, "key": key, "run": str(run_name)}
        try:
            if not self.usable():
                return
            self._clean_stale()
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.parent.resolve().is_relative_to(self.folder.resolve()):
                raise OSError(f"{path.parent} leads outside the cache folder")
            atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
        except Exception as exc:  # OSError, safetensors' SafetensorError on a full disk, ...
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"feature cache {self.folder} cannot be written ({exc}); going on "
                    "without it (pass cache=False or --no-cache to silence this)",
                    DTGWarning,
                    stacklevel=3,
                )
