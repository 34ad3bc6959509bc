"""Step 2: edge weights (filter norms), block operators and converters to PyG and NetworkX."""

from dtg_gpu.graph.operators import (
    BipartiteSquare,
    BlockOperator,
    filter_norms,
    graph_edges,
    row_norms,
    to_networkx,
    to_pyg,
    wide_filter_norms,
)

__all__ = [
    "filter_norms",
    "wide_filter_norms",
    "BlockOperator",
    "BipartiteSquare",
    "graph_edges",
    "to_pyg",
    "to_networkx",
    "row_norms",
]
