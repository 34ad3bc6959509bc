"""The bipartite fast path: Lanczos on C Cᵀ over one colour, lifted to the Perron vector of A."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse.linalg as sla
import torch
from conftest import GroupedNet, make_checkpoints
from torch import nn

from dtg_gpu import BlockOperator, channel_topology, solve_perron
from dtg_gpu.centrality import _ritz
from dtg_gpu.graph import BipartiteSquare
from dtg_gpu.graph.scaling import load_blocks
from dtg_gpu.models import MODELS
from dtg_gpu.testing.reference import reference_adjacency


def GroupedChain():
    """A plain chain through grouped, depthwise and flattened-linear layers: bipartite."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, groups=4),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 2 * 2, 5),
    )


def _structural_graph(topo):
    g = nx.Graph()
    g.add_nodes_from(range(topo.num_nodes))
    for layer in topo.layers:
        e = layer.edge_index().numpy()
        g.add_edges_from(zip(e[0].tolist(), e[1].tolist()))
    return g


@pytest.mark.parametrize("name", ["lenet5", "vgg11", "resnet20", "grouped", "chain"])
def test_bipartition_agrees_with_networkx(name):
    model = {"grouped": GroupedNet, "chain": GroupedChain}.get(name, MODELS.get(name))()
    topo = channel_topology(model)
    colour = topo.bipartition
    g = _structural_graph(topo)
    assert (colour is not None) == nx.is_bipartite(g)
    assert (colour is not None) == (name in ("lenet5", "vgg11", "chain"))
    if colour is not None:
        assert colour.shape == (topo.num_nodes,) and 0 < colour.sum() < topo.num_nodes
        for u, v in g.edges:
            assert colour[u] != colour[v]


@pytest.mark.parametrize("model_fn", [MODELS["lenet5"], GroupedChain])
def test_square_operator_is_c_ct_and_lift_is_the_perron_vector(model_fn, device):
    model = model_fn()
    topo = channel_topology(model)
    ckpts = make_checkpoints(model, t=2)
    blocks, _ = load_blocks(topo, ckpts, torch.device(device), torch.float64)
    op = BlockOperator(topo, blocks)
    sq = op.bipartite_square()
    assert isinstance(sq, BipartiteSquare)
    p, q = sq.p_nodes.cpu().numpy(), sq.q_nodes.cpu().numpy()
    assert len(p) <= len(q) and sorted(np.concatenate([p, q]).tolist()) == list(range(topo.num_nodes))
    u = torch.rand(2, len(p), dtype=torch.float64, device=device)
    mu, half = sq(u).cpu().numpy(), sq.half(u).cpu().numpy()
    tops, lams, perron = [], [], []
    for t in range(2):
        a = reference_adjacency(topo, ckpts[t]).toarray()
        assert np.abs(a[np.ix_(p, p)]).max() == 0 and np.abs(a[np.ix_(q, q)]).max() == 0
        c = a[np.ix_(p, q)]
        np.testing.assert_allclose(half[t], c.T @ u[t].cpu().numpy(), rtol=1e-12)
        np.testing.assert_allclose(mu[t], c @ c.T @ u[t].cpu().numpy(), rtol=1e-12)
        w, v = np.linalg.eigh(c @ c.T)
        tops.append(np.abs(v[:, -1]))
        lams.append(np.sqrt(w[-1]))
        perron.append(np.abs(np.linalg.eigh(a)[1][:, -1]))
    # lifting the exact top eigenvector of C Cᵀ gives the exact Perron vector of A
    x = sq.lift(torch.tensor(np.array(tops), device=device), torch.tensor(lams, device=device))
    np.testing.assert_allclose(x.cpu().numpy(), np.array(perron), atol=1e-10)


@pytest.mark.parametrize("dtype,tol,atol", [(torch.float64, 1e-12, 1e-10), (torch.float32, 1e-6, 2e-6)])
@pytest.mark.parametrize("name", ["lenet5", "vgg11"])
def test_bipartite_path_matches_arpack_and_plain_lanczos(name, dtype, tol, atol, device):
    model = MODELS[name]()
    topo = channel_topology(model)
    ckpts = make_checkpoints(model, t=3, scale=3.0)
    blocks, _ = load_blocks(topo, ckpts, torch.device(device), dtype)
    op = BlockOperator(topo, blocks)
    mask = torch.ones(3, topo.num_nodes, dtype=torch.bool, device=device)
    fast = solve_perron(op, mask, tol=tol)  # default: the squared form
    plain = solve_perron(op, mask, tol=tol, bipartite=False)
    assert fast.converged.all() and plain.converged.all()
    assert (fast.iterations < plain.iterations).all()
    # the reported residual is the true one of A, computed here with a fresh product
    ax = op(fast.vector)
    true = torch.linalg.vector_norm(ax - fast.eigenvalue[:, None] * fast.vector, dim=-1) / fast.eigenvalue
    assert float(true.max()) <= max(tol, 32 * torch.finfo(dtype).eps) * 1.5
    np.testing.assert_allclose(
        fast.residual.cpu().double().numpy(), true.cpu().double().numpy(), rtol=0.5, atol=32 * torch.finfo(dtype).eps
    )
    for t in range(3):
        a = reference_adjacency(topo, ckpts[t])
        w, v = sla.eigsh(a, k=1, which="LA", tol=1e-14)
        np.testing.assert_allclose(fast.vector[t].cpu().double().numpy(), np.abs(v[:, 0]), atol=atol)
        assert float(fast.eigenvalue[t]) == pytest.approx(w[0], rel=10 * atol)
    np.testing.assert_allclose(fast.vector.cpu().numpy(), plain.vector.cpu().numpy(), atol=2 * atol)


def test_bipartite_zero_graph_budget_and_refusal():
    model = MODELS["lenet5"]()
    topo = channel_topology(model)
    ckpts = make_checkpoints(model, t=2)
    ckpts[1] = {k: torch.zeros_like(v) for k, v in ckpts[1].items()}
    blocks, _ = load_blocks(topo, ckpts, torch.device("cpu"), torch.float64)
    op = BlockOperator(topo, blocks)
    mask = torch.ones(2, topo.num_nodes, dtype=torch.bool)
    res = solve_perron(op, mask, tol=1e-12, bipartite=True)
    assert res.converged.all() and float(res.eigenvalue[1]) == 0
    np.testing.assert_allclose(res.vector[1].numpy(), np.full(topo.num_nodes, topo.num_nodes**-0.5))
    short = solve_perron(op, mask, tol=1e-14, max_iter=4, bipartite=True)
    assert not short.converged[0] and int(short.iterations[0]) == 4 and float(short.residual[0]) > 1e-14
    resnet = channel_topology(MODELS["resnet20"]())
    rb, _ = load_blocks(resnet, make_checkpoints(MODELS["resnet20"](), t=1), torch.device("cpu"), torch.float64)
    rop = BlockOperator(resnet, rb)
    assert rop.bipartite_square() is None
    with pytest.raises(ValueError, match="bipartite=True"):
        solve_perron(rop, torch.ones(1, resnet.num_nodes, dtype=torch.bool), bipartite=True)
    with pytest.raises(ValueError, match="not bipartite"):
        BipartiteSquare(rop)


@pytest.mark.parametrize("k", [1, 2, 7, 25, 26, 32])
def test_ritz_pair_matches_eigh(k):
    g = torch.Generator().manual_seed(k)
    alpha = torch.rand(64, k, generator=g, dtype=torch.float64) * 10
    beta = torch.rand(64, k, generator=g, dtype=torch.float64)
    beta[:4] = 0.0  # broken-down (diagonal) tridiagonals
    alpha[4:6] = 0.0
    beta[4:6] = 0.0  # all-zero ones
    theta, s, ok = _ritz(alpha, beta)
    assert ok.all()
    t = torch.diag_embed(alpha)
    if k > 1:
        off = torch.diag_embed(beta[:, :-1], offset=1)
        t = t + off + off.mT
    w, v = torch.linalg.eigh(t)
    np.testing.assert_allclose(theta.numpy(), w[:, -1].numpy(), atol=1e-12)
    assert torch.isfinite(s).all()
    np.testing.assert_allclose(torch.linalg.vector_norm(s, dim=1).numpy(), 1.0, atol=1e-12)
    # a unit vector with Rayleigh quotient equal to the top eigenvalue is a top eigenvector
    rq = torch.einsum("gi,gij,gj->g", s, t, s)
    np.testing.assert_allclose(rq.numpy(), w[:, -1].numpy(), atol=1e-9)


def test_ritz_flags_bad_tridiagonals_and_keeps_the_rest():
    g = torch.Generator().manual_seed(0)
    alpha = torch.rand(6, 8, generator=g, dtype=torch.float64)
    beta = torch.rand(6, 8, generator=g, dtype=torch.float64)
    alpha[1, 3] = float("nan")
    beta[4, 2] = float("inf")
    theta, s, ok = _ritz(alpha, beta)
    assert ok.tolist() == [True, False, True, True, False, True]
    assert torch.isnan(theta[~ok]).all() and (s[~ok] == 0).all()
    good = ok.nonzero().flatten()
    ref, _, _ = _ritz(alpha[good], beta[good])
    torch.testing.assert_close(theta[good], ref)
