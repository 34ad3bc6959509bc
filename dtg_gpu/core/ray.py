"""Ray plumbing shared by the engine's and the sweeps' Ray executors: connect (or start a
local instance), per-task resources, draining tasks as they end.

The sweep folder must be on storage every node sees at the same path (NFS, Lustre, a
mounted bucket) and `dtg_gpu` installed on every node. A task whose worker dies is retried
by Ray (`max_retries`); since a task's output is a pure function of its inputs and every
file is written atomically, a retry gives the same rows, never a duplicated or missing one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dtg_gpu.core.failures import cause

try:
    import ray
except ImportError:  # pragma: no cover - the extra is installed by make test
    raise ImportError("executor='ray' (--ray) needs Ray: pip install 'dtg_gpu[ray]'") from None

# `ray` is re-exported: modules that need Ray import it from here, which says how to install it
__all__ = ["ray", "ray_session", "check_reachable", "task_resources", "drain", "cause", "progress_bar", "MAX_RETRIES"]

MAX_RETRIES = 3


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[bool]:
    """Connected to Ray for the block: the instance this process already has; else the
    cluster at `address` (or `$RAY_ADDRESS`); else a fresh local instance, shut down
    at the end. Yields whether this call started the connection."""
    if ray.is_initialized():
        yield False
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address)
        ray.init(address=address, configure_logging=False)
    else:  # workers import dtg_gpu from where this process does (also from a source tree)
        here = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    try:
        yield True
    finally:
        ray.shutdown()


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail within `timeout` seconds, naming `address`, when nothing listens there (Ray's
    own client retries a dead address for ever). `"auto"`, `"local"` and addresses
    without a port are left to Ray.

    Raises
    ------
    ConnectionError
        Nothing accepts a connection at the address's host and port.
    """
    import socket

    text = address.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise ConnectionError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one there "
            "(ray start --head) or pass the address it printed"
        ) from None


def task_resources(device: torch.device | None) -> dict[str, float]:
    """One GPU per task when the cluster has GPUs and `device` allows it, else one CPU.

    Raises
    ------
    ValueError
        `device` is CUDA and the cluster has no GPU.
    """
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if device is not None and device.type == "cuda" and gpus < 1:
        raise ValueError(f"device={str(device)!r} was asked for but the Ray cluster has no GPU")
    if gpus >= 1 and (device is None or device.type == "cuda"):
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": 1}


def drain(
    pending: dict, handle: Callable[[Any, Any, BaseException | None], tuple[int, int]], bar=None, k: int = 0
) -> None:
    """Wait for every task of `pending` (`ref -> item`), calling `handle(item, value,
    error)` as each ends (`error`: what `ray.get` raised, after Ray's retries); it
    returns `(runs, bar steps)`. The bar shows runs (and graphs, `k` per run) per second.
    Tasks still pending when the driver stops (an error, Ctrl-C) are cancelled."""
    start, runs = time.perf_counter(), 0
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                item = pending.pop(ref)
                try:
                    value, error = ray.get(ref), None
                except (ray.exceptions.RayError, ray.exceptions.RayTaskError) as exc:
                    value, error = None, exc
                done, steps = handle(item, value, error)
                runs += done
                if bar is not None:
                    rate = runs / max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix_str(f"{rate:.2f} runs/s" + (f", {rate * k:.1f} graphs/s" if k else ""))
                    bar.update(steps)
    finally:
        if bar is not None:
            bar.close()
        for ref in pending:
            ray.cancel(ref, force=True)


def progress_bar(progress: bool, total: int, desc: str, unit: str, initial: int = 0):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit)
