"""The engine gives the same centrality for any finite weights (scale safety), flags what it
cannot certify, and never lets one graph's numbers stop the others.

Property-based: random chain and residual architectures × per-layer scales 1e-30…1e30 ×
zero layers × a NaN checkpoint among good ones × float32/float64, checked against a dense
float64 eigendecomposition of the NumPy-built reference adjacency (the same graph NetworkX
would get)."""

from __future__ import annotations

import warnings

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import dtg_gpu
from dtg_gpu import Run, analyze, eigenvector_centrality
from dtg_gpu.centrality import attainable_tol
from dtg_gpu.models import LeNet5
from dtg_gpu.testing.reference import reference_adjacency

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Chain(nn.Module):
    def __init__(self, widths, linear):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1] * 4, linear) if linear else None

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x))
        if self.head is not None:
            x = self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 2), 1))
        return x


class Residual(nn.Module):
    def __init__(self, cin, width, blocks):
        super().__init__()
        self.stem = nn.Conv2d(cin, width, 3, padding=1)
        self.a = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(blocks))
        self.b = nn.ModuleList(nn.Conv2d(width, width, 1) for _ in range(blocks))

    def forward(self, x):
        x = self.stem(x)
        for a, b in zip(self.a, self.b):
            x = x + b(torch.relu(a(x)))
        return x


@st.composite
def architectures(draw):
    if draw(st.booleans()):
        widths = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
        return Chain(widths, draw(st.sampled_from([0, 2, 3])))
    return Residual(draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 2)))


def _checkpoints(model, exponents, zero, nan_at, seed, t=3):
    g = torch.Generator().manual_seed(seed)
    params = [n for n, _ in model.named_parameters() if n.endswith("weight")]
    out = []
    for i in range(t):
        sd = {}
        for n, p in model.state_dict().items():
            w = torch.randn(p.shape, generator=g)
            if n in params:
                j = params.index(n)
                w = w * 10.0 ** exponents[j % len(exponents)]
                if zero is not None and j == zero % len(params):
                    w = torch.zeros_like(w)
            sd[n] = w
        if i == nan_at:
            sd[params[0]] = sd[params[0]].clone()
            sd[params[0]].view(-1)[0] = float("nan")
        out.append(sd)
    return out


def _dense_reference(topology, state):
    a = reference_adjacency(topology, state).toarray()
    w, v = np.linalg.eigh(a)
    x = v[:, -1] * np.sign(v[:, -1].sum() or 1.0)
    gap = w[-1] - w[-2] if w.size > 1 else np.inf
    return a, x, w[-1], gap


def _true_residual(a, x):
    x = x / np.linalg.norm(x)
    lam = x @ a @ x
    return np.linalg.norm(a @ x - lam * x) / abs(lam), lam


@SETTINGS
@given(
    model=architectures(),
    exponents=st.lists(st.integers(-30, 30), min_size=1, max_size=4),
    zero=st.one_of(st.none(), st.integers(0, 5)),
    nan_at=st.one_of(st.none(), st.integers(0, 2)),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_any_finite_scale_matches_float64_or_is_flagged(model, exponents, zero, nan_at, dtype, seed):
    ckpts = _checkpoints(model, exponents, zero, nan_at, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.DTGWarning)
        res = analyze(Run(model=model, checkpoints=ckpts), dtype=dtype, device="cpu")
    tol = attainable_tol(1e-6, dtype)
    for t, state in enumerate(ckpts):
        if t == nan_at:
            assert not res.finite[t] and not res.converged[t]
            assert torch.isnan(res.centrality[t]).all()
            continue
        assert res.finite[t], "finite weights of any scale are never called non-finite"
        x = res.centrality[t].double().numpy()
        assert np.isfinite(x).all() and np.isfinite(float(res.residual[t]))
        a, ref, lam1, gap = _dense_reference(res.topology, state)
        if not res.connected[t] or lam1 == 0:
            continue  # flagged: the Perron vector is not unique
        true_res, lam = _true_residual(a, x)
        if res.converged[t]:
            # converged is only said with a residual that holds (float64 check, small slack
            # for the float32 rounding of the vector itself)
            assert true_res <= 50 * tol, (true_res, float(res.residual[t]))
            # Davis–Kahan: sin θ <= ‖r‖ / gap
            bound = 2 * true_res * lam1 / gap if gap > 0 else np.inf
            atol = 1e-5 if dtype == torch.float32 else 1e-9
            assert np.abs(x - ref).max() <= max(atol, bound)
            np.testing.assert_allclose(float(res.eigenvalue[t]), lam1, rtol=1e-4 if dtype == torch.float32 else 1e-9)
        else:
            assert float(res.residual[t]) > tol


@pytest.mark.parametrize("scale", [1e-30, 1e-21, 1e-12, 1e9, 1e17, 1e20, 1e30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lenet_centrality_does_not_depend_on_the_weights_scale(scale, dtype):
    torch.manual_seed(0)
    model = LeNet5(in_channels=1)
    sd = model.state_dict()
    ref = analyze(Run(model=model, checkpoints=[sd]), dtype=torch.float64, tol=1e-12, device="cpu")
    scaled = {k: v.to(dtype) * scale for k, v in sd.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", dtg_gpu.DTGWarning)  # nothing to warn about
        res = analyze(
            Run(model=model, checkpoints=[scaled]),
            dtype=dtype,
            device="cpu",
            tol=1e-6 if dtype == torch.float32 else 1e-11,
        )
    assert res.converged.all() and res.finite.all() and res.connected.all()
    atol = 1e-5 if dtype == torch.float32 else 1e-9
    np.testing.assert_allclose(res.centrality.double().numpy(), ref.centrality.numpy(), atol=atol)
    np.testing.assert_allclose(res.eigenvalue.double().numpy(), ref.eigenvalue.numpy() * scale, rtol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtg_gpu.ConvergenceWarning)  # 20 steps are not enough
        nx_mode = analyze(
            Run(model=model, checkpoints=[scaled]), dtype=dtype, device="cpu", method="networkx", max_iter=20, tol=1e-6
        )
        assert torch.isfinite(nx_mode.centrality).all()
        if scale > 1:  # (A + I) x ≈ A x once A is large: every large scale takes the same steps
            np.testing.assert_allclose(
                nx_mode.centrality.numpy(),
                analyze(
                    Run(model=model, checkpoints=[{k: v.to(dtype) * 1e9 for k, v in sd.items()}]),
                    dtype=dtype,
                    device="cpu",
                    method="networkx",
                    max_iter=20,
                    tol=1e-6,
                ).centrality.numpy(),
                atol=atol,
            )


def test_one_huge_weight_is_finite_and_exact():
    torch.manual_seed(0)
    model = LeNet5(in_channels=1)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["features.0.weight"].view(-1)[0] = 1e30  # w² overflows float32
    res = analyze(Run(model=model, checkpoints=[sd]), device="cpu")
    ref = analyze(
        Run(model=model, checkpoints=[{k: v.double() for k, v in sd.items()}]),
        dtype=torch.float64,
        tol=1e-12,
        device="cpu",
    )
    assert res.finite.all() and res.converged.all()
    np.testing.assert_allclose(res.centrality.double().numpy(), ref.centrality.numpy(), atol=1e-5)


def test_float64_weights_beyond_float32_range_solve_in_float32():
    torch.manual_seed(0)
    model = LeNet5(in_channels=1)
    sd = {k: v.double() * 1e60 for k, v in model.state_dict().items()}  # not representable in float32
    res = analyze(Run(model=model, checkpoints=[sd]), dtype=torch.float32, device="cpu")
    ref = analyze(Run(model=model, checkpoints=[sd]), dtype=torch.float64, tol=1e-12, device="cpu")
    assert res.finite.all() and res.converged.all()
    np.testing.assert_allclose(res.centrality.double().numpy(), ref.centrality.numpy(), atol=1e-5)


def _karate():
    g = nx.karate_club_graph()
    ei = torch.tensor(list(g.edges())).T
    w = torch.tensor([g[u][v]["weight"] for u, v in g.edges()], dtype=torch.float64)
    return g, torch.cat([ei, ei.flip(0)], 1), torch.cat([w, w])


@pytest.mark.parametrize("scale", [1e-40, 1e-30, 1.0, 1e30, 1e40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_kernel_is_scale_free(scale, dtype):
    g, ei, w = _karate()
    ref = nx.eigenvector_centrality_numpy(g, weight="weight")
    ref = np.array([ref[i] for i in range(34)])
    x, res = eigenvector_centrality(ei, w * scale, 34, dtype=dtype)
    assert res.converged.all()
    np.testing.assert_allclose(x.double().numpy(), ref, atol=1e-5 if dtype == torch.float32 else 1e-8)


@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_networkx_mode_reproduces_networkx_at_any_scale(scale):
    """NetworkX's (A + I) iteration is not scale-free (at 1e-30 it stops after 2 steps near
    the uniform vector); method="networkx" must reproduce exactly that, without overflow."""
    g, ei, w = _karate()
    h = nx.Graph()
    h.add_nodes_from(range(34))
    h.add_weighted_edges_from((u, v, d["weight"] * scale) for u, v, d in g.edges(data=True))
    ref = nx.eigenvector_centrality(h, weight="weight", max_iter=1000)
    ref = np.array([ref[i] for i in range(34)])
    x, res = eigenvector_centrality(ei, w * scale, 34, dtype=torch.float64, method="networkx", max_iter=1000)
    np.testing.assert_allclose(x.numpy(), ref, atol=1e-12)


# NetworkX's own undirected test cases for eigenvector centrality
# (networkx/algorithms/centrality/tests/test_eigenvector_centrality.py), through the kernel
def _nx_cases():
    k5 = nx.complete_graph(5)
    p3 = nx.path_graph(3)
    yield "K5", k5, {n: 0.4472135954999579 for n in k5}
    yield "P3", p3, {0: 0.5, 1: 0.7071, 2: 0.5}
    g = nx.Graph()
    g.add_weighted_edges_from([(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 4, 2)])  # a weighted path
    yield "weighted_path", g, None
    yield "karate", nx.karate_club_graph(), None
    yield "florentine", nx.convert_node_labels_to_integers(nx.florentine_families_graph()), None


@pytest.mark.parametrize("name,graph,expected", list(_nx_cases()), ids=[c[0] for c in _nx_cases()])
def test_networkx_test_cases_through_the_kernel(name, graph, expected):
    n = graph.number_of_nodes()
    edges = list(graph.edges(data="weight", default=1.0))
    ei = torch.tensor([[u for u, v, _ in edges], [v for u, v, _ in edges]])
    w = torch.tensor([float(d) for *_, d in edges], dtype=torch.float64)
    x, res = eigenvector_centrality(torch.cat([ei, ei.flip(0)], 1), torch.cat([w, w]), n, tol=1e-12)
    ref = nx.eigenvector_centrality_numpy(graph, weight="weight")
    ref = np.array([ref[i] for i in range(n)])
    np.testing.assert_allclose(x.numpy(), ref, atol=1e-9)
    if expected is not None:
        np.testing.assert_allclose(x.numpy(), [expected[i] for i in range(n)], atol=1e-4)
    assert res.converged.all()


def test_networkx_empty_graph_case_raises():
    """NetworkX's test_empty: centrality of a graph without nodes is undefined."""
    with pytest.raises(ValueError, match="no nodes"):
        eigenvector_centrality(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), 0)


def test_a_residual_at_the_rounding_floor_stops_early_and_is_flagged(monkeypatch):
    """Asked for a residual float32 cannot reach, the solver stops once the residual stops
    improving (not after max_iter products) and says it did not converge."""
    import dtg_gpu.centrality as c

    monkeypatch.setattr(c, "TOL_FLOOR_EPS", 0)  # let tol go below what float32 can certify
    torch.manual_seed(0)
    model = LeNet5(in_channels=1)
    run = Run(model=model, checkpoints=[model.state_dict()])
    with pytest.warns(dtg_gpu.ConvergenceWarning):
        res = analyze(run, dtype=torch.float32, tol=1e-12, max_iter=100_000, device="cpu")
    assert not res.converged.any() and int(res.iterations.max()) < 2_000
    ref = analyze(run, dtype=torch.float64, tol=1e-12, device="cpu")
    np.testing.assert_allclose(res.centrality.double().numpy(), ref.centrality.numpy(), atol=1e-5)
    assert float(res.residual.max()) < 1e-5  # the floor it reached, reported honestly


def test_a_huge_weight_in_a_large_layer_is_exact():
    """Layers above SMALL_LAYER take their norms checkpoint by checkpoint, with one range check
    per layer; an out-of-range norm sends the whole layer through the safe path."""
    from dtg_gpu.graph.scaling import SMALL_LAYER

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3),
        nn.ReLU(),
        nn.Conv2d(64, 64, 5),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 4),
    )
    assert model[2].weight.numel() > SMALL_LAYER
    ckpts = _checkpoints(model, [0], None, None, seed=1, t=2)
    ckpts[1]["2.weight"].view(-1)[7] = 3e37  # w² overflows float32, the norm does not
    res = analyze(Run(model=model, checkpoints=ckpts), device="cpu")
    ref = analyze(
        Run(model=model, checkpoints=[{k: v.double() for k, v in c.items()} for c in ckpts]),
        dtype=torch.float64,
        tol=1e-12,
        device="cpu",
    )
    assert res.finite.all() and res.converged.all()
    np.testing.assert_allclose(res.centrality.double().numpy(), ref.centrality.numpy(), atol=1e-5)
