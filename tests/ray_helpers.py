"""Runs that Ray workers import (tests put this folder on the workers' PYTHONPATH)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from dtg_gpu import Run


@dataclass
class SlowRun(Run):
    """A run whose checkpoints take ``delay`` s to read; each read writes the reading
    process's pid into ``pid_file`` (so a test can kill the worker mid-task)."""

    delay: float = 0.0
    pid_file: str | None = None

    def weights(self, t: int):
        if self.pid_file:
            Path(self.pid_file).write_text(str(os.getpid()))
        time.sleep(self.delay)
        return super().weights(t)


@dataclass
class BrokenRun(Run):
    """A run whose reader raises an unexpected error (a bug, not a bad file)."""

    def weights(self, t: int):
        raise RuntimeError("reader exploded")


def slow(runs, **kw):
    from dtg_gpu.sweeps import SweepRuns

    return SweepRuns(
        [SlowRun(model=r.model, checkpoints=r.checkpoints, name=r.name, meta=r.meta, **kw) for r in runs],
        path=getattr(runs, "path", None),
    )
