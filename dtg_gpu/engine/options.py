"""How the centrality is solved: one options object that `analyze`, `featurize`, the sweep
workflow, saved predictors and the CLI pass along, checked once when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dtg_gpu.centrality import Method, attainable_tol, check_solver_args
from dtg_gpu.core.devices import check_dtype
from dtg_gpu.core.validation import check_int

__all__ = ["SolverOptions"]


@dataclass(frozen=True)
class SolverOptions:
    r"""The solver's settings (everything the numbers depend on besides the checkpoints and the device).

    Parameters
    ----------
    dtype : torch.float32 or torch.float64, default torch.float32
    tol : float, default 1e-6
        Relative residual `‖Ax − λx‖₂/λ` per graph (`method="networkx"`: NetworkX's
        `Σ|Δx| < N·tol`), floored at 32·eps of `dtype` (3.8e-6 in float32;
        `effective_tol`). For float64 agreement with NetworkX to 1e-9, ask `tol=1e-10`.
    max_iter : int, default 1000
    method : {"auto", "lanczos", "networkx"}
    chunk_size : int, optional
        Graphs solved together; by default sized to a 1 GiB working set.

    Raises
    ------
    ValueError
        A bad value, naming the parameter.

    Examples
    --------
    >>> SolverOptions(dtype=torch.float64, tol=1e-10).effective_tol
    1e-10
    """

    dtype: torch.dtype = torch.float32
    tol: float = 1e-6
    max_iter: int = 1000
    method: Method = "auto"
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        check_solver_args(self.tol, self.max_iter, self.method)
        if self.chunk_size is not None:
            check_int("chunk_size", self.chunk_size)

    @property
    def effective_tol(self) -> float:
        """The tolerance used: `tol` for `"networkx"`, else `max(tol, 32·eps(dtype))`."""
        return self.tol if self.method == "networkx" else attainable_tol(self.tol, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON): what a result's `settings` record."""
        return {
            "tol": self.tol,
            "effective_tol": self.effective_tol,
            "max_iter": self.max_iter,
            "method": self.method,
            "dtype": str(self.dtype),
        }
