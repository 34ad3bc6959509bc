r"""The one compiled kernel: row norms on CPU at memory bandwidth (optional, built on first use).

`torch.linalg.vector_norm(w, dim=-1)` and `torch.cdist` reduce a short inner dimension (the
9 weights of a 3×3 kernel slice) one row at a time, each row ending in a horizontal sum; on
CPU that takes 2.0–4.9× the time of a plain read of the weights
(`benchmarks/bench_filter_norms.py`). `csrc/row_norms.c` squares and sums eight rows at
once in vector registers and takes their horizontal sums together (1.1–1.6× a read for 3×3
slices). It is plain C99 with AVX2 intrinsics, no Python or torch headers, so it compiles in
under a second with the system's C compiler; the library uses it when it can and otherwise
keeps torch's kernels, whose results agree to rounding (both sum the squares in the input's
precision).

How it is built and trusted
---------------------------
* Compiled on the first CPU norm of a process (`cc -O3 -shared -fPIC`; `$CC` overrides),
  at most once per process, never with `-march=native`: the vector code is selected at run
  time from the CPU's flags, so a build shared between machines (a home directory on NFS, a
  Ray cluster) runs on each of them or reports itself unsupported.
* Cached as `<cache>/row_norms-<hash>.so`, the hash covering the source, the compile flags
  and the platform; `<cache>` is `$DTG_GPU_NATIVE_CACHE`, else
  `$XDG_CACHE_HOME/dtg_gpu`, else `~/.cache/dtg_gpu`. The library is compiled under a
  temporary name and renamed, so concurrent processes never load half a file. A cache folder
  or library that another user owns or can write is not loaded (a shared library is code):
  the kernel is then compiled into a private temporary folder for this process only.
* `DTG_GPU_NATIVE=0` turns it off (torch's kernels everywhere). No compiler, a failed
  compile, a CPU without AVX2/FMA or another architecture all fall back silently;
  [`native_status`][dtg_gpu.native_status] says which kernel runs and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import cast

import torch

__all__ = ["native_row_norms", "native_status", "ELEMENTS_PER_THREAD"]

ENV_SWITCH = "DTG_GPU_NATIVE"
ENV_CACHE = "DTG_GPU_NATIVE_CACHE"
SOURCE = Path(__file__).resolve().parent / "csrc" / "row_norms.c"
FLAGS = ("-O3", "-shared", "-fPIC")
ABI = 1
ELEMENTS_PER_THREAD = 1 << 18  # a call is split over threads in parts of at least this many weights (1 MiB f32)
COMPILE_TIMEOUT_S = 120

Kernel = Callable[[int, int, int, int], None]  # (x pointer, out pointer, rows, k)
_lock = threading.Lock()
_kernels: dict[torch.dtype, Kernel] | None = None
_status = "not loaded yet"
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own


def _cache_dir() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dtg_gpu"


def _private(path: Path) -> bool:
    """True when `path` is ours and nobody else can write it (always true off POSIX)."""
    if not hasattr(os, "getuid"):
        return True
    st = os.stat(path, follow_symlinks=False)
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode)


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC")
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def _compile(cc: list[str], folder: Path, name: str) -> Path:
    """Compile the kernel to `folder/name` via a temporary name and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run(
            [*cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
        if done.returncode != 0:
            raise OSError(f"{shlex.join(cc)} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        os.chmod(tmp, 0o700)
        os.replace(tmp, folder / name)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder / name


def _bind(path: Path) -> dict[torch.dtype, Kernel]:
    lib = ctypes.CDLL(str(path))
    if lib.dtg_row_norms_abi() != ABI:
        raise OSError(f"{path}: kernel ABI {lib.dtg_row_norms_abi()}, expected {ABI}")
    if not lib.dtg_row_norms_supported():
        raise RuntimeError("this CPU has no AVX2/FMA vector kernel (x86-64 only)")
    kernels: dict[torch.dtype, Kernel] = {}
    for dtype, sym in ((torch.float32, "dtg_row_norms_f32"), (torch.float64, "dtg_row_norms_f64")):
        f = getattr(lib, sym)
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        kernels[dtype] = cast(Kernel, f)
    _self_test(kernels)
    return kernels


def _self_test(kernels: dict[torch.dtype, Kernel]) -> None:
    """Refuse a library that computes wrong norms (a miscompile, a foreign `$CC`): a few
    rows of every length class against sums of squares taken in Python."""
    for dtype, f in kernels.items():
        for k in (2, 9, 25, 37):
            rows = [[float((3 * r + 5 * c) % 11 - 5) for c in range(k)] for r in range(13)]
            x = torch.tensor(rows, dtype=dtype)
            out = torch.full((13,), -1.0, dtype=dtype)
            f(x.data_ptr(), out.data_ptr(), 13, k)
            want = torch.tensor([math.sqrt(sum(v * v for v in row)) for row in rows], dtype=torch.float64)
            if not torch.allclose(out.double(), want, rtol=1e-6, atol=0.0):
                raise RuntimeError(f"the compiled kernel failed its self-test ({dtype}, rows of {k})")


def library_name() -> str:
    """`row_norms-<hash>.so`: the hash covers the source, the flags and the platform."""
    parts = [SOURCE.read_bytes(), " ".join(FLAGS).encode(), platform.machine().encode(), sys.platform.encode()]
    key = hashlib.sha256(b"\0".join(parts))
    return f"row_norms-{key.hexdigest()[:16]}.so"


def _load() -> tuple[dict[torch.dtype, Kernel] | None, str]:
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"off ({ENV_SWITCH}=0): torch kernels"
    if not (platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32"):
        return None, f"no vector kernel for {platform.machine()} / {sys.platform}: torch kernels"
    name = library_name()
    folder = _cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        trusted = _private(folder)
    except OSError:
        trusted = False
    cached = folder / name
    if trusted and cached.exists() and _private(cached):
        try:
            return _bind(cached), f"native kernel ({cached})"
        except RuntimeError as e:
            return None, f"no native kernel ({e}): torch kernels"
        except OSError:
            pass  # unreadable or from a different build: compile it again below
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC): torch kernels"
    try:
        if trusted:
            built = _compile(cc, folder, name)
            return _bind(built), f"native kernel (compiled to {built})"
        with tempfile.TemporaryDirectory(prefix="dtg_gpu_native_") as private:
            built = _compile(cc, Path(private), name)
            kernels = _bind(built)  # the mapping outlives the file
        return kernels, f"native kernel (compiled for this process: {folder} is not private to this user)"
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"no native kernel ({e}): torch kernels"


def _kernels_loaded() -> dict[torch.dtype, Kernel] | None:
    global _kernels, _status
    if _status == "not loaded yet":
        with _lock:
            if _status == "not loaded yet":
                _kernels, _status = _load()
    return _kernels


def native_status() -> str:
    """Which kernel takes the filter norms on CPU in this process, and why.

    The first call loads (or compiles, see `dtg_gpu.graph.native` and `docs/trust.md`) the
    compiled kernel; later calls return the same answer. Benchmarks print it beside their
    numbers.

    Returns
    -------
    str
        `"native kernel (<library path>)"` when the compiled kernel is used, else the reason
        it is not (`DTG_GPU_NATIVE=0`, no compiler, a failed compile, a CPU without AVX2/FMA,
        another architecture) followed by `": torch kernels"`.

    Examples
    --------
    >>> import dtg_gpu
    >>> s = dtg_gpu.native_status()
    >>> s.startswith("native kernel (") or s.endswith("torch kernels")
    True
    """
    _kernels_loaded()
    return _status


def native_row_norms(m: torch.Tensor, out: torch.Tensor) -> bool:
    """Write `‖m[r, :]‖₂` into `out[r]` with the compiled kernel; False if it cannot.

    Parameters
    ----------
    m : Tensor `[rows, k]`
        Contiguous float32 or float64 on CPU, `k ≥ 1`.
    out : Tensor `[rows]`
        Contiguous, `m`'s dtype, on CPU; written in place.

    Returns
    -------
    bool
        False (and `out` untouched) when the kernel is off or unavailable here, or the
        tensors do not meet the above: the caller then uses torch's kernels.

    Notes
    -----
    Rows are split over `torch.get_num_threads()` threads (ctypes releases the GIL) in
    parts of at least `ELEMENTS_PER_THREAD` weights; a row's norm does not depend on the split.
    """
    if not (
        m.device.type == "cpu"
        and out.device.type == "cpu"
        and m.dim() == 2
        and m.dtype in (torch.float32, torch.float64)
        and out.dtype == m.dtype
        and m.is_contiguous()
        and out.is_contiguous()
        and out.shape == m.shape[:1]
        and m.shape[1] >= 1
    ):
        return False
    kernels = _kernels_loaded()
    if kernels is None:
        return False
    f = kernels[m.dtype]
    rows, k = m.shape
    if rows == 0:
        return True
    es = m.element_size()
    parts = max(1, min(torch.get_num_threads(), rows, rows * k // ELEMENTS_PER_THREAD))
    if parts == 1:
        f(m.data_ptr(), out.data_ptr(), rows, k)
        return True
    step = -(-rows // parts)
    x, y = m.data_ptr(), out.data_ptr()
    pool = _thread_pool()
    jobs: list[Future] = [
        pool.submit(f, x + s * k * es, y + s * es, min(rows, s + step) - s, k) for s in range(step, rows, step)
    ]
    f(x, y, step, k)
    for j in jobs:
        j.result()
    return True


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():  # a forked child inherits no threads
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="dtg_norms"))
        return _pool[1]
