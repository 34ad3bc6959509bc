"""Training sweeps that write the on-disk format, and loading them back.

`dtg_gpu.sweeps.config` is torch-free (the CLI reads the presets from it); the rest is
imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtg_gpu.sweeps.config import CHECKS, LR_SCHEDULES, OPTIMIZERS, PRESETS, SUITE, SweepConfig

_LAZY = {
    "SweepRuns": "dtg_gpu.sweeps.loading",
    "run_sweep": "dtg_gpu.sweeps.runner",
    "load_sweep": "dtg_gpu.sweeps.loading",
    "tune_cpu_malloc": "dtg_gpu.sweeps.training",
}

if TYPE_CHECKING:
    from dtg_gpu.sweeps.loading import SweepRuns, load_sweep
    from dtg_gpu.sweeps.runner import run_sweep
    from dtg_gpu.sweeps.training import tune_cpu_malloc


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dtg_gpu.sweeps' has no attribute {name!r}")


__all__ = [
    "SweepConfig",
    "SweepRuns",
    "run_sweep",
    "load_sweep",
    "tune_cpu_malloc",
    "PRESETS",
    "SUITE",
    "CHECKS",
    "OPTIMIZERS",
    "LR_SCHEDULES",
]
