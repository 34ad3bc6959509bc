r"""A local sweep on several worker processes (`workers` of [`run_sweep`][dtg_gpu.sweeps.runner.run_sweep], `dtg sweep --workers`).

Networks that cannot train grouped (batch norm, residual blocks, depthwise convolutions,
Adam/AdamW) train one run at a time, and a small network does not keep several CPU cores
busy: most of a step is memory-bound elementwise work and per-operator overhead, which a
second thread barely shortens. `W` worker processes on `⌊threads / W⌋` threads each train
`W` runs at once. On 2 cores two single-threaded runs side by side trained 1.17–1.32× faster
than one process on both threads (ResNet-20 and MobileNet presets,
`benchmarks/bench_sweep.py --preset`; docs/howto/sweeps.md).

Every worker trains its batch with the same code as a local sweep (`train_batch`) and
writes its run folders the same way (checkpoints, then `run.json` last, atomically); the
parent process holds the sweep's lock throughout. A batch whose worker fails or dies is
named in a [`SweepFailedError`][dtg_gpu.exceptions.SweepFailedError] after every other batch has finished. On Linux a worker
is killed when the parent dies, so a killed sweep leaves no orphan writing into a folder
that its restart trains again.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from dtg_gpu.core.failures import cause
from dtg_gpu.sweeps.config import SweepConfig
from dtg_gpu.sweeps.data import Dataset

__all__ = ["train_in_processes", "worker_threads"]

_DATASET: Dataset | None = None  # set in each worker by _init_worker


def worker_threads(workers: int, threads: int | None = None) -> int:
    """Torch threads for each of `workers` processes sharing `threads` (default: this
    process's `torch.get_num_threads()`): an equal share, at least one."""
    total = torch.get_num_threads() if threads is None else int(threads)
    return max(1, total // max(1, int(workers)))


def _die_with_parent() -> None:
    """Linux: ask the kernel to kill this process when its parent exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass


def _init_worker(dataset: Dataset, threads: int, device: str) -> None:
    global _DATASET
    _die_with_parent()
    torch.set_num_threads(threads)
    if torch.device(device).type == "cpu":
        from dtg_gpu.sweeps.training import tune_cpu_malloc

        tune_cpu_malloc()
    _DATASET = dataset


def _train_in_worker(cfg: SweepConfig, batch: list, out: str, device: str) -> list[str]:
    from dtg_gpu.sweeps.training import train_batch

    assert _DATASET is not None, "worker not initialised"
    return train_batch(cfg, _DATASET, batch, Path(out), torch.device(device), progress=False)


def train_in_processes(
    cfg: SweepConfig,
    ds: Dataset,
    batches: Sequence[list],
    out: Path,
    device: torch.device,
    workers: int,
    *,
    bar=None,
) -> dict[str, str]:
    """Train each batch of `(name, point)` runs into `out` on `workers` processes.

    Parameters
    ----------
    cfg, ds
        The sweep and its dataset (sent to each worker once).
    batches : sequence of list
        As `_batches` makes them: one grouped network or one run each.
    out : Path
    device : torch.device
        Every worker trains on it (several processes can share one GPU).
    workers : int
        Processes, each with `worker_threads(workers)` torch threads.
    bar : tqdm, optional
        Advanced by a batch's runs as it finishes.

    Returns
    -------
    dict
        Run name → why its batch failed (empty when every batch was trained).
    """
    failures: dict[str, str] = {}
    ctx = multiprocessing.get_context("spawn")  # CUDA and OpenMP do not survive a fork
    threads = worker_threads(workers)
    with ProcessPoolExecutor(
        max_workers=min(workers, max(1, len(batches))),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(ds, threads, str(device)),
    ) as pool:
        pending: dict[Future, list] = {
            pool.submit(_train_in_worker, cfg, batch, str(out), str(device)): batch for batch in batches
        }
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    batch = pending.pop(fut)
                    error = fut.exception()
                    if error is not None:
                        for name, _ in batch:
                            failures[name] = cause(error)
                    if bar is not None:
                        bar.update(len(batch))
        except BaseException:  # Ctrl-C or an error here: nothing new starts
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return failures
