import networkx as nx
import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import from_networkx, to_undirected

from dtg_gpu import eigenvector_centrality


def _random_graph(seed, n=40, p=0.2, scale=1.0):
    g = nx.gnp_random_graph(n, p, seed=seed)
    while not nx.is_connected(g):
        seed += 1000
        g = nx.gnp_random_graph(n, p, seed=seed)
    rng = np.random.default_rng(seed)
    for u, v in g.edges:
        g[u][v]["weight"] = float(rng.uniform(0.1, 1.0) * scale)
    return g


def _pyg(g):
    d = from_networkx(g, group_edge_attrs=["weight"])
    return d.edge_index, d.edge_attr.view(-1).double()


def _ref(g):
    c = nx.eigenvector_centrality_numpy(g, weight="weight")
    return np.array([c[i] for i in range(g.number_of_nodes())])


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_single_graph_matches_networkx(device, dtype, atol):
    g = _random_graph(1, scale=30.0)
    ei, ew = _pyg(g)
    x, res = eigenvector_centrality(ei.to(device), ew.to(device), g.number_of_nodes(), dtype=dtype, tol=1e-12)
    assert res.converged.all()
    np.testing.assert_allclose(x.cpu().double().numpy(), _ref(g), atol=atol)
    lam = max(np.linalg.eigvalsh(nx.to_numpy_array(g)))
    assert float(res.eigenvalue) == pytest.approx(lam, rel=1e-5)


def test_batch_equals_loop_and_graphs_normalised_apart(device):
    graphs = [_random_graph(s, n=20 + 7 * s, scale=10.0**s) for s in range(4)]
    batch = Batch.from_data_list(
        [Data(edge_index=_pyg(g)[0], edge_weight=_pyg(g)[1], num_nodes=g.number_of_nodes()) for g in graphs]
    )
    x, res = eigenvector_centrality(
        batch.edge_index.to(device),
        batch.edge_weight.to(device),
        batch.num_nodes,
        batch.batch.to(device),
        tol=1e-12,
        dtype=torch.float64,
    )
    assert res.converged.all() and res.vector.shape[0] == 4
    for i, g in enumerate(graphs):
        xi = x[batch.ptr[i] : batch.ptr[i + 1]].cpu().numpy()
        np.testing.assert_allclose(np.linalg.norm(xi), 1.0, rtol=1e-12)
        np.testing.assert_allclose(xi, _ref(g), atol=1e-9)
        single, _ = eigenvector_centrality(
            *(t.to(device) for t in _pyg(g)), g.number_of_nodes(), tol=1e-12, dtype=torch.float64
        )
        np.testing.assert_allclose(xi, single.cpu().numpy(), atol=1e-12)


def test_networkx_method_reproduces_iterations():
    g = _random_graph(3, n=30)
    ei, ew = _pyg(g)
    x, res = eigenvector_centrality(ei, ew, 30, method="networkx", tol=1e-6, max_iter=1000, dtype=torch.float64)
    it = int(res.iterations)
    ref = nx.eigenvector_centrality(g, weight="weight", max_iter=it, tol=1e-6)
    np.testing.assert_allclose(x.numpy(), [ref[i] for i in range(30)], atol=1e-12)
    with pytest.raises(nx.PowerIterationFailedConvergence):
        nx.eigenvector_centrality(g, weight="weight", max_iter=it - 1, tol=1e-6)


def test_realistic_scale_networkx_fails_lanczos_converges():
    # a bipartite layer graph with large weights: (A + I) power iteration crawls
    rng = np.random.default_rng(0)
    b = rng.uniform(0, 1, size=(60, 40)) * 20
    a = np.zeros((100, 100))
    a[40:, :40], a[:40, 40:] = b, b.T
    ei = torch.tensor(np.array(np.nonzero(a)))
    ew = torch.tensor(a[np.nonzero(a)])
    _, nxres = eigenvector_centrality(ei, ew, 100, method="networkx", max_iter=100)
    assert not nxres.converged.all()
    assert float(nxres.residual) > 1e-6
    x, res = eigenvector_centrality(ei, ew, 100, tol=1e-12, dtype=torch.float64)
    assert res.converged.all() and int(res.iterations) < 60
    w, v = np.linalg.eigh(a)
    np.testing.assert_allclose(x.numpy(), np.abs(v[:, -1]), atol=1e-9)


def test_not_converged_is_flagged_with_residual():
    g = _random_graph(5, n=60)
    x, res = eigenvector_centrality(*_pyg(g), 60, tol=1e-14, max_iter=3, dtype=torch.float64)
    assert not res.converged.any() and float(res.residual) > 1e-14 and int(res.iterations) == 3


def test_all_zero_and_self_loop_graph():
    ei = torch.tensor([[0, 1], [1, 0]])
    x, res = eigenvector_centrality(ei, torch.zeros(2, dtype=torch.float64), 3)
    assert res.converged.all() and float(res.eigenvalue) == 0
    np.testing.assert_allclose(x.numpy(), np.full(3, 3**-0.5))
    g = nx.Graph()
    g.add_weighted_edges_from([(0, 0, 2.0), (0, 1, 1.0), (1, 2, 0.5)])
    ei = to_undirected(torch.tensor([[0, 0, 1], [0, 1, 2]]))
    ew = torch.tensor([2.0, 1.0, 1.0, 0.5, 0.5], dtype=torch.float64)
    x, _ = eigenvector_centrality(ei, ew, 3, tol=1e-13)
    np.testing.assert_allclose(x.numpy(), _ref(g), atol=1e-9)


def test_bad_input_errors():
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="not symmetric"):
        eigenvector_centrality(ei, torch.ones(2), 3)
    with pytest.raises(ValueError, match="non-negative"):
        eigenvector_centrality(torch.tensor([[0, 1], [1, 0]]), torch.tensor([-1.0, -1.0]), 2)
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        eigenvector_centrality(torch.tensor([0, 1]), None, 2)
    with pytest.raises(ValueError, match="outside"):
        eigenvector_centrality(torch.tensor([[0, 5], [5, 0]]), None, 3)
    with pytest.raises(ValueError, match="method"):
        eigenvector_centrality(torch.tensor([[0, 1], [1, 0]]), None, 2, method="magic")
    with pytest.raises(ValueError, match="two different graphs"):
        eigenvector_centrality(torch.tensor([[0, 1], [1, 0]]), None, 2, torch.tensor([0, 1]))


def test_validate_args_false_skips_the_value_checks_not_the_answer(device):
    graphs = [_random_graph(s, n=15 + 5 * s) for s in range(3)]
    batch = Batch.from_data_list(
        [Data(edge_index=_pyg(g)[0], edge_weight=_pyg(g)[1], num_nodes=g.number_of_nodes()) for g in graphs]
    )
    args = (batch.edge_index.to(device), batch.edge_weight.to(device), batch.num_nodes, batch.batch.to(device))
    checked, _ = eigenvector_centrality(*args, num_graphs=3, tol=1e-12, dtype=torch.float64)
    fast, _ = eigenvector_centrality(*args, num_graphs=3, tol=1e-12, dtype=torch.float64, validate_args=False)
    assert torch.equal(checked, fast)
    one_way = torch.tensor([[0, 1], [1, 2]], device=device)  # not symmetric
    with pytest.raises(ValueError, match="not symmetric"):
        eigenvector_centrality(one_way, num_nodes=3)
    eigenvector_centrality(one_way, num_nodes=3, validate_args=False)  # the caller vouched for it
    with pytest.raises(ValueError, match="shape"):  # shapes are always checked
        eigenvector_centrality(one_way[0], num_nodes=3, validate_args=False)
