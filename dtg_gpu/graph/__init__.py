"""Step 2: edge weights (filter norms) and per-graph scaling, block operators, and
converters to PyG and NetworkX."""

from dtg_gpu.graph.convert import graph_edges, to_networkx, to_pyg
from dtg_gpu.graph.norms import filter_norms, row_norms, wide_filter_norms
from dtg_gpu.graph.operators import BipartiteSquare, BlockOperator

__all__ = [
    "filter_norms",
    "wide_filter_norms",
    "row_norms",
    "BlockOperator",
    "BipartiteSquare",
    "graph_edges",
    "to_pyg",
    "to_networkx",
]
