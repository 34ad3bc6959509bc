r"""The batched engine: (run, timestep) pairs → filter norms → Perron vectors, in chunks.

Graphs of one architecture are solved together, `[runs·T, …]` at a time, in chunks
sized to a memory budget; the next chunk's checkpoints are read in a background thread
while the current chunk is solved, so reading files overlaps with compute.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import torch

from dtg_gpu.centrality import solve_perron
from dtg_gpu.core.failures import READ_ERRORS
from dtg_gpu.engine.options import SolverOptions
from dtg_gpu.exceptions import (
    ConvergenceWarning,
    DisconnectedGraphWarning,
    NonFiniteWeightsWarning,
)
from dtg_gpu.graph.operators import BlockOperator
from dtg_gpu.graph.scaling import scaled_blocks
from dtg_gpu.io.run import Run
from dtg_gpu.topology.types import ChannelTopology

__all__ = ["SolvedGraphs", "GraphBatchResult", "SolveFlags", "iter_solve", "concat_results", "warn_results"]


@dataclass
class SolvedGraphs:
    """Per graph (`[G]` rows, in the order asked): the centrality and its flags. The fields
    every solved batch has, here and in [`AnalysisResult`][dtg_gpu.AnalysisResult]."""

    centrality: torch.Tensor  # [G, N]
    eigenvalue: torch.Tensor  # [G]
    residual: torch.Tensor  # [G]
    iterations: torch.Tensor  # [G] long
    converged: torch.Tensor  # [G] bool
    finite: torch.Tensor  # [G] bool: weights were all finite
    connected: torch.Tensor  # [G] bool: positive-weight graph is connected (Perron vector unique)

    def solved_fields(self) -> dict[str, torch.Tensor]:
        """The shared fields, by name (to build another result from this one)."""
        return {f.name: getattr(self, f.name) for f in fields(SolvedGraphs)}


@dataclass
class GraphBatchResult(SolvedGraphs):
    """A solved batch, with why each unreadable checkpoint could not be read."""

    error: list  # [G] str | None: why the checkpoint could not be read (row is NaN)


def _reachable_everywhere(op: BlockOperator, which: torch.Tensor) -> torch.Tensor:
    """Exact connectivity of the positive-weight graphs `which` by reachability from node 0.

    `r ← r ∨ (A r > 0)` until nothing changes: with non-negative weights a node gains
    reach exactly when a positive edge joins it to a reached node. Costs one product per
    step of the graph's eccentricity (a few per layer), and runs only for graphs that hold
    an exactly-zero weight slice.
    """
    r = torch.zeros(op.num_graphs, op.num_nodes, dtype=op.dtype, device=op.device)
    r[:, 0] = 1.0
    for _ in range(op.num_nodes):
        grown = torch.maximum(r, (op(r) > 0).to(op.dtype))
        if torch.equal(grown, r):
            break
        r = grown
    return (r > 0).all(1) | ~which


def iter_solve(
    chunks: Sequence[Sequence[tuple[Run, int]]],
    topology: ChannelTopology,
    *,
    device: torch.device,
    solver: SolverOptions,
) -> Iterator[GraphBatchResult]:
    """Solve the given chunks of `(run, t)` pairs one batch each, in order; results on the CPU.

    The next chunk's checkpoints are read (and their filter norms taken) in a background
    thread while this one is solved.
    """
    dtype = solver.dtype
    chunks = [list(c) for c in chunks]
    structural = topology.structurally_connected()
    with ThreadPoolExecutor(max_workers=1) as pool:

        def load(chunk):  # read the files and take the filter norms while the last chunk solves
            weights, errors = _read_weights(chunk, topology)
            return scaled_blocks(topology, weights, device, dtype), errors

        pending = pool.submit(load, chunks[0]) if chunks else None
        for i, chunk in enumerate(chunks):
            assert pending is not None
            (blocks, finite, scale), errors = pending.result()
            pending = pool.submit(load, chunks[i + 1]) if i + 1 < len(chunks) else None
            op = BlockOperator(topology, blocks, scale=scale)
            mask = torch.ones(len(chunk), topology.num_nodes, dtype=torch.bool, device=device)
            res = solve_perron(op, mask, tol=solver.tol, max_iter=solver.max_iter, method=solver.method)
            connected = finite & (res.eigenvalue > 0) & structural
            zero = op.has_zero_weights() & connected
            if bool(zero.any()):
                zero &= ~op.layers_positively_connected()
                if bool(zero.any()):
                    connected &= _reachable_everywhere(op, zero)
            nan = torch.tensor(float("nan"), dtype=dtype, device=device)
            del blocks, op
            yield GraphBatchResult(
                centrality=torch.where(finite[:, None], res.vector, nan).cpu(),
                eigenvalue=torch.where(finite, res.eigenvalue, nan).cpu(),
                residual=torch.where(finite, res.residual, nan).cpu(),
                iterations=res.iterations.cpu(),
                converged=(res.converged & finite).cpu(),
                finite=finite.cpu(),
                connected=connected.cpu(),
                error=errors,
            )


def concat_results(parts: Sequence[GraphBatchResult]) -> GraphBatchResult:
    """One `GraphBatchResult` of several, rows in order."""
    fields: dict[str, Any] = {
        f: torch.cat([getattr(p, f) for p in parts]) if f != "error" else [e for p in parts for e in p.error]
        for f in GraphBatchResult.__dataclass_fields__
    }
    return GraphBatchResult(**fields)


def _read_weights(chunk, topology: ChannelTopology) -> tuple[list, list]:
    """Each item's weights, or NaN stand-ins (no memory: expanded scalars) and the reason
    when its checkpoint cannot be read, so that one bad file fails one graph, not the chunk."""
    weights: list = []
    errors: list[str | None] = []
    for run, t in chunk:
        try:
            # another layout of the run's model (batch norm folded) is passed on; a plain read stays
            # run.weights(t), which Run subclasses may override with one argument
            weights.append(run.weights(t) if topology is run.topology else run.weights(t, topology))
            errors.append(None)
        except READ_ERRORS as exc:
            nan = torch.tensor(float("nan"))
            weights.append({l.param: nan.expand(l.weight_shape) for l in topology.layers})
            errors.append(str(exc) or type(exc).__name__)
    return weights, errors


def _names(items, mask) -> str:
    hits = [f"{run.name}[t={t}]" for (run, t), m in zip(items, mask.tolist()) if m]
    more = f" and {len(hits) - 8} more" if len(hits) > 8 else ""
    return ", ".join(hits[:8]) + more


@dataclass
class SolveFlags:
    """Per graph: the flags the warnings read (of solved graphs, or of cached runs)."""

    residual: torch.Tensor
    finite: torch.Tensor
    converged: torch.Tensor
    connected: torch.Tensor
    error: list


def warn_results(items, out: GraphBatchResult | SolveFlags, stacklevel: int = 3) -> None:
    """The non-finite, not-converged and disconnected graphs of `out`, each kind in one warning."""
    unread = torch.tensor([e is not None for e in out.error], dtype=torch.bool)
    nonfinite = ~out.finite & ~unread  # unreadable checkpoints are reported by the caller
    if bool(nonfinite.any()):
        warnings.warn(
            f"non-finite (NaN/Inf) weights at {_names(items, nonfinite)}: their centrality is NaN",
            NonFiniteWeightsWarning,
            stacklevel=stacklevel,
        )
    bad = out.finite & ~out.converged
    if bool(bad.any()):
        warnings.warn(
            f"eigenvector centrality did not converge at {_names(items, bad)} "
            f"(largest residual {float(out.residual[bad].max()):.3g}); raise max_iter "
            "or tol",
            ConvergenceWarning,
            stacklevel=stacklevel,
        )
    disc = out.finite & ~out.connected
    if bool(disc.any()):
        warnings.warn(
            f"disconnected or all-zero graph at {_names(items, disc)}: its Perron vector is not unique",
            DisconnectedGraphWarning,
            stacklevel=stacklevel,
        )
