"""Exceptions and warnings of dtg_gpu: one root, each named for what went wrong."""

from __future__ import annotations

__all__ = [
    "DTGError",
    "CheckpointError",
    "UnsafeCheckpointError",
    "TopologyError",
    "InsufficientCheckpointsError",
    "DatasetNotFoundError",
    "SweepLockedError",
    "SweepFailedError",
    "DTGWarning",
    "ConvergenceWarning",
    "NonFiniteWeightsWarning",
    "DisconnectedGraphWarning",
    "TracingFallbackWarning",
    "UncoveredWeightsWarning",
    "FailedRunsWarning",
]


class DTGError(Exception):
    """Root of every error dtg_gpu raises on purpose."""


class CheckpointError(DTGError, ValueError):
    """A checkpoint file or state dict is missing, corrupt, or does not fit the model.

    The message names the checkpoint (file path or index) and, where relevant,
    the parameter.
    """


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint would execute code when unpickled; it was refused, nothing ran."""


class TopologyError(DTGError, ValueError):
    """The channel graph of a model cannot be derived (unsupported structure)."""


class InsufficientCheckpointsError(DTGError, ValueError):
    """A run holds fewer checkpoints than requested (e.g. `timesteps=k`)."""


class DatasetNotFoundError(DTGError, FileNotFoundError):
    """A dataset is not under the data root; the message says where we looked."""


class SweepLockedError(DTGError, RuntimeError):
    """Another process holds the sweep folder's lock (it is training the same sweep)."""


class SweepFailedError(DTGError, RuntimeError):
    """Some runs of a sweep could not be trained (their tasks failed); every other run was.

    `failures` maps each such run's name to the reason. Rerunning the sweep trains only the
    runs that are not complete."""

    def __init__(self, message: str, failures: dict[str, str] | None = None):
        super().__init__(message)
        self.failures = dict(failures or {})


class DTGWarning(UserWarning):
    """Root of dtg_gpu's warnings."""


class ConvergenceWarning(DTGWarning):
    """Some graphs did not reach the requested tolerance within `max_iter`."""


class NonFiniteWeightsWarning(DTGWarning):
    """Some checkpoints hold NaN/Inf weights; their centrality is NaN."""


class DisconnectedGraphWarning(DTGWarning):
    """Some graphs are disconnected (or all-zero): their Perron vector is not unique."""


class TracingFallbackWarning(DTGWarning):
    """The model could not be traced with torch.fx; module order was used instead."""


class FailedRunsWarning(DTGWarning):
    """Some runs of a sweep could not be read or solved; their rows are NaN and they are left
    out of training. `failures` maps each run's name to the reason (file and cause)."""

    def __init__(self, message: str, failures: dict[str, str] | None = None):
        super().__init__(message)
        self.failures = dict(failures or {})


class UncoveredWeightsWarning(DTGWarning):
    """Some conv/linear-like weight matrices of the model are not in the channel graph (see
    `ChannelTopology.coverage()`); `strict=True` makes it an error."""
