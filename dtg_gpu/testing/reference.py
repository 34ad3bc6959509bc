r"""The CPU NetworkX way of doing steps 2–3: the reference our engine is tested against.

The graph is built here with NumPy from the raw weights (not with the engine's torch
blocks), accumulated into a SciPy sparse matrix and handed to `networkx`; centrality is
`networkx.eigenvector_centrality_numpy` (ARPACK) or `networkx.eigenvector_centrality`.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx
import numpy as np
import scipy.sparse as sp
import torch

from dtg_gpu.topology.types import ChannelTopology

__all__ = ["reference_adjacency", "reference_graph", "reference_centrality"]


def _layer_norms(w: np.ndarray, kind: str, out: int, cin: int, spatial: int) -> np.ndarray:
    if kind == "linear":
        return np.abs(w) if spatial == 1 else np.sqrt((w.reshape(out, cin, spatial) ** 2).sum(-1))
    return np.sqrt((w.reshape(out, cin, -1) ** 2).sum(-1))


def reference_adjacency(topology: ChannelTopology, state: Mapping[str, torch.Tensor]) -> sp.csr_matrix:
    """Symmetric weighted adjacency (float64 SciPy CSR) of one checkpoint, built with NumPy."""
    n = topology.num_nodes
    rows, cols, vals = [], [], []
    for layer in topology.layers:
        w = layer.effective_weight(dict(state)).detach().cpu().double().numpy()
        out, cin = layer.block_shape
        norms = _layer_norms(w, layer.kind, out, cin, layer.spatial)
        opg = out // layer.groups
        o_nodes, i_nodes = layer.out_nodes.numpy(), layer.in_nodes.numpy()
        for i in range(out):
            g = i // opg
            u = o_nodes[i]
            v = i_nodes[g * cin : (g + 1) * cin]
            # an undirected edge u - v: store both triangles, a self-loop once
            rows.append(np.full(cin, u))
            cols.append(v)
            vals.append(norms[i])
            off = v != u
            rows.append(v[off])
            cols.append(np.full(int(off.sum()), u))
            vals.append(norms[i][off])
    a = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return a.tocsr()  # duplicates (parallel edges) are summed


def reference_graph(topology: ChannelTopology, state: Mapping[str, torch.Tensor]) -> nx.Graph:
    """The checkpoint's channel graph as a `networkx.Graph` (edge attribute `weight`)."""
    return nx.from_scipy_sparse_array(reference_adjacency(topology, state), edge_attribute="weight")


def reference_centrality(graph: nx.Graph, method: str = "numpy", **kwargs) -> np.ndarray:
    """NetworkX eigenvector centrality as an array in node order `0..N-1`.

    `method="numpy"`: `eigenvector_centrality_numpy(G, weight="weight")`;
    `method="power"`: `eigenvector_centrality(G, weight="weight", **kwargs)`.
    """
    if method == "numpy":
        c = nx.eigenvector_centrality_numpy(graph, weight="weight", **kwargs)
    elif method == "power":
        c = nx.eigenvector_centrality(graph, weight="weight", **kwargs)
    else:
        raise ValueError(f"method must be 'numpy' or 'power', got {method!r}")
    return np.array([c[i] for i in range(graph.number_of_nodes())])
