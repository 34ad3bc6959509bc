"""A timestep's graph as edges, as `torch_geometric.data.Data` or as a `networkx.Graph` (both directions of every edge, self-loops once, parallel edges summed)."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np
import torch

from dtg_gpu.topology.types import ChannelTopology

__all__ = ["graph_edges", "to_pyg", "to_networkx"]


def graph_edges(
    topology: ChannelTopology, blocks: Sequence[torch.Tensor], g: int = 0, *, directed_pairs: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Edge list of graph `g` of a batch of blocks, parallel edges summed.

    Parameters
    ----------
    topology : ChannelTopology
    blocks : sequence of Tensor `[G, out, C/groups]`
    g : int
        Which graph of the batch.
    directed_pairs : bool, default True
        `True`: both directions of every edge (PyG's convention for an undirected
        graph), self-loops once. `False`: each undirected edge once, `row <= col`.

    Returns
    -------
    edge_index : LongTensor `[2, E]`
    edge_weight : Tensor `[E]`
    """
    from torch_geometric.utils import coalesce

    rows, cols, ws = [], [], []
    for layer, block in zip(topology.layers, blocks):
        e = layer.edge_index()
        w = block[g].reshape(-1).detach().cpu()
        lo, hi = torch.minimum(e[0], e[1]), torch.maximum(e[0], e[1])
        rows.append(lo)
        cols.append(hi)
        ws.append(w)
    ei = torch.stack([torch.cat(rows), torch.cat(cols)])
    ew = torch.cat(ws)
    ei, ew = coalesce(ei, ew, num_nodes=topology.num_nodes, reduce="sum")
    if directed_pairs:
        off = ei[0] != ei[1]
        ei = torch.cat([ei, ei[:, off].flip(0)], dim=1)
        ew = torch.cat([ew, ew[off]])
        ei, ew = coalesce(ei, ew, num_nodes=topology.num_nodes, reduce="sum")
    return ei, ew


def to_pyg(topology: ChannelTopology, blocks: Sequence[torch.Tensor], g: int = 0):
    """Graph `g` as `torch_geometric.data.Data(edge_index, edge_weight, num_nodes)`."""
    from torch_geometric.data import Data

    ei, ew = graph_edges(topology, blocks, g, directed_pairs=True)
    return Data(edge_index=ei, edge_weight=ew, num_nodes=topology.num_nodes)


def to_networkx(topology: ChannelTopology, blocks: Sequence[torch.Tensor], g: int = 0) -> nx.Graph:
    """Graph `g` as a `networkx.Graph` with nodes `0..N-1` and edge attribute `weight`."""
    ei, ew = graph_edges(topology, blocks, g, directed_pairs=False)
    graph = nx.Graph()
    graph.add_nodes_from(range(topology.num_nodes))
    graph.add_weighted_edges_from(zip(ei[0].tolist(), ei[1].tolist(), np.asarray(ew, dtype=float).tolist()))
    return graph
