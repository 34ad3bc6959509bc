"""How a failed run is reported: the errors that mark a run as failed (not the sweep), one
line naming every failed run (in a warning or an error), why a task failed, and unique names
for failed runs."""

from __future__ import annotations

import warnings
from typing import Any

from dtg_gpu.exceptions import CheckpointError, FailedRunsWarning, TopologyError

__all__ = ["READ_ERRORS", "warn_failures", "failure_list", "cause", "unique_name"]

#: Errors that fail one run (unreadable checkpoint, untraceable model, file system) and
#: leave the rest of a sweep to go on.
READ_ERRORS = (CheckpointError, TopologyError, OSError)


def failure_list(failures: dict[str, str], shown: int = 8) -> str:
    """`"name: why; name: why (and N more)"`: the first `shown` failed runs and a count of the rest."""
    lines = "; ".join(f"{name}: {why}" for name, why in list(failures.items())[:shown])
    return lines + (f" (and {len(failures) - shown} more)" if len(failures) > shown else "")


def cause(exc: BaseException) -> str:
    """Why a task failed, in one line: the exception's type and the last line of its message
    (of the error it wraps, for Ray's task errors)."""
    err = getattr(exc, "cause", None) or exc
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else 'no message (the process may have ended)'}"


def warn_failures(failures: dict[str, str], stacklevel: int = 2) -> None:
    """One [`FailedRunsWarning`][dtg_gpu.exceptions.FailedRunsWarning] naming every failed run (nothing when there is none)."""
    if failures:
        warnings.warn(
            FailedRunsWarning(
                f"{len(failures)} run(s) could not be read or solved and were left out (NaN rows): "
                f"{failure_list(failures)}",
                failures,
            ),
            stacklevel=stacklevel + 1,
        )


def unique_name(run: Any, i: int, taken: dict) -> str:
    """The run's name as a key of `taken`, made unique with its index when it is there already."""
    name = str(run.name)
    return name if name not in taken else f"{name} (run {i})"
