"""How a failed run is reported: the errors that mark a run as failed (not the sweep), one
warning naming every failed run, and unique names for them."""

from __future__ import annotations

import warnings
from typing import Any

from dtg_gpu.exceptions import CheckpointError, FailedRunsWarning, TopologyError

__all__ = ["READ_ERRORS", "warn_failures", "unique_name"]

#: Errors that fail one run (unreadable checkpoint, untraceable model, file system) and
#: leave the rest of a sweep to go on.
READ_ERRORS = (CheckpointError, TopologyError, OSError)


def warn_failures(failures: dict[str, str], stacklevel: int = 2) -> None:
    """One [`FailedRunsWarning`][dtg_gpu.exceptions.FailedRunsWarning] naming every failed run (nothing when there is none)."""
    if failures:
        lines = "; ".join(f"{name}: {why}" for name, why in list(failures.items())[:8])
        more = f" (and {len(failures) - 8} more)" if len(failures) > 8 else ""
        warnings.warn(
            FailedRunsWarning(
                f"{len(failures)} run(s) could not be read or solved and were left out (NaN rows): {lines}{more}",
                failures,
            ),
            stacklevel=stacklevel + 1,
        )


def unique_name(run: Any, i: int, taken: dict) -> str:
    """The run's name as a key of `taken`, made unique with its index when it is there already."""
    name = str(run.name)
    return name if name not in taken else f"{name} (run {i})"
