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

import numpy as np
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

__all__ = [
    "GraphBatchResult",
    "Unit",
    "plan_units",
    "iter_solve",
]

DEFAULT_BUDGET_BYTES = 1 << 30
LANCZOS_VECTORS = 32  # solve_perron's ncv: the Lanczos vectors a graph holds
MIN_CHUNK_EDGES = 5_000_000  # a chunk of small graphs: batching them is what makes them fast
MIN_CHUNK_GRAPHS = 10  # a chunk of large graphs: a solve's fixed cost is per layer, not per graph


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


def chunk_size_for(topology: ChannelTopology, dtype: torch.dtype, budget: int) -> int:
    """Graphs per chunk so that raw weights, blocks and Lanczos vectors fit `budget` bytes."""
    item = torch.finfo(dtype).bits // 8
    sizes = [int(np.prod(l.weight_shape)) for l in topology.layers]
    # the next chunk's checkpoints while its blocks are built in the background, blocks
    # three times (this chunk, the next chunk, and a slot once taken by a transposed copy on
    # CPU: kept, since the chunk size fixes the batches and so the last bits of every
    # result and the feature cache's keys) + Lanczos vectors
    per_graph = item * (sum(sizes) + 3 * topology.num_edges + (LANCZOS_VECTORS + 4) * topology.num_nodes)
    return max(1, int(budget // max(per_graph, 1)))


def pipeline_chunk_size(topology: ChannelTopology, n_items: int, dtype: torch.dtype, budget: int | None = None) -> int:
    """Graphs per chunk: within the memory budget, and small enough that reading the next
    chunk overlaps with solving this one (about 4 chunks), but never below ~5 M edges
    (batching small graphs is what makes them fast) nor below `MIN_CHUNK_GRAPHS` graphs.

    The second floor is for large graphs: a batched solve costs thousands of small tensor
    ops per call (a few per layer per Lanczos step) whatever the batch holds, and on CPU
    the batch is what `bmm` splits across threads. Measured on 2 cores
    (`benchmarks/bench_filter_norms.py`, last table), a 10-checkpoint CIFAR VGG-16 run
    analyses 17 % faster in float32 (3 % in float64) as one chunk than as chunks of 3, 3, 3
    and 1 with the next one read in the background; from a cold page cache the two are
    level (docs/benchmarks.md). Graphs under 500 k edges already have ≥ 10 per chunk."""
    size = chunk_size_for(topology, dtype, DEFAULT_BUDGET_BYTES if budget is None else budget)
    floor = max(MIN_CHUNK_GRAPHS, -(-MIN_CHUNK_EDGES // max(topology.num_edges, 1)))
    return max(1, min(size, max(-(-n_items // 4), floor)))


@dataclass(frozen=True)
class Unit:
    """Runs `[start, stop)` of one architecture's runs, solved together `chunk` graphs at
    a time: the unit of work of `plan_units` (one Ray task, one cache entry per run)."""

    start: int
    stop: int
    chunk: int

    def chunks(self, k: int) -> list[range]:
        """The unit's graphs `(run - start)·k + t` in solver chunks."""
        n = (self.stop - self.start) * k
        return [range(i, min(i + self.chunk, n)) for i in range(0, n, self.chunk)]


def plan_units(
    n_runs: int,
    k: int,
    topology: ChannelTopology,
    dtype: torch.dtype,
    chunk_size: int | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> list[Unit]:
    """Split `n_runs` runs of `k` checkpoints each (one architecture) into units of whole runs.

    The plan depends only on `(n_runs, k, topology, dtype, chunk_size, budget)`, never on
    where or whether a unit runs: the local path, a Ray task and a resumed featurisation
    solve every graph in the same batch, so their results are bit-identical (a batched solve
    iterates until every graph of the batch converges, so a graph's last bits depend on
    its batch). A unit holds `chunk // k` runs solved as one batch; when `k` graphs of one
    run exceed the chunk (large models), a unit is one run solved `chunk` graphs at a time.
    """
    size = chunk_size or pipeline_chunk_size(topology, n_runs * k, dtype, budget_bytes)
    if size < k:
        return [Unit(i, i + 1, size) for i in range(n_runs)]
    per = size // k
    return [Unit(i, min(i + per, n_runs), (min(i + per, n_runs) - i) * k) for i in range(0, n_runs, per)]


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
