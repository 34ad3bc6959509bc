"""What dtg_gpu's tests and benchmarks compare against: the CPU NetworkX way of doing the
method's steps 2–3 (`dtg_gpu.testing.reference`). Not needed to use the library."""

from dtg_gpu.testing.reference import reference_adjacency, reference_centrality, reference_graph

__all__ = ["reference_adjacency", "reference_graph", "reference_centrality"]
