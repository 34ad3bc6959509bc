"""The plan: how many graphs are solved together (a memory budget, and enough graphs per batch to be fast) and the units of whole runs a sweep is split into. It depends only on the runs' count and length, the architecture, the dtype and the options, never on where a unit runs, so the local path, a Ray task and a resumed featurisation solve the same batches (bit-identical results)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dtg_gpu.topology.types import ChannelTopology

__all__ = ["Unit", "plan_units", "pipeline_chunk_size", "chunk_size_for", "DEFAULT_BUDGET_BYTES"]

DEFAULT_BUDGET_BYTES = 1 << 30


LANCZOS_VECTORS = 32  # solve_perron's ncv: the Lanczos vectors a graph holds


MIN_CHUNK_EDGES = 5_000_000  # a chunk of small graphs: batching them is what makes them fast


MIN_CHUNK_GRAPHS = 10  # a chunk of large graphs: a solve's fixed cost is per layer, not per graph


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
