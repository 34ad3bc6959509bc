import numpy as np
import pytest
import scipy.stats
import torch
from conftest import GroupedNet, make_checkpoints

import dtg_gpu
from dtg_gpu import ConvergenceWarning, DisconnectedGraphWarning, NonFiniteWeightsWarning, Run, analyze
from dtg_gpu.models import LeNet5, build_model
from dtg_gpu.testing.reference import reference_centrality, reference_graph

MODELS = {
    "lenet5": lambda: build_model("lenet5", in_channels=1),
    "narrow_vgg11": lambda: build_model("vgg11", width=0.125),
    "resnet20": lambda: build_model("resnet20"),
    "grouped": GroupedNet,
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype,atol,tol", [(torch.float64, 1e-9, 1e-12), (torch.float32, 1e-5, 1e-6)])
def test_agrees_with_networkx(name, dtype, atol, tol, device):
    torch.manual_seed(0)
    model = MODELS[name]()
    ckpts = make_checkpoints(model, t=3, scale=4.0)  # larger weights: λ₁ ≫ 1 as when trained
    res = analyze(Run(model=model, checkpoints=ckpts), device=device, dtype=dtype, tol=tol)
    assert res.centrality.dtype == dtype and res.converged.all() and res.connected.all()
    for t in (0, 2):
        g = reference_graph(res.topology, ckpts[t])
        ref = reference_centrality(g)
        np.testing.assert_allclose(res.centrality[t].double().numpy(), ref, atol=atol)
        assert float(res.eigenvalue[t]) == pytest.approx(float(np.linalg.eigvalsh(nx_dense(g))[-1]), rel=1e-5)
        assert float(res.residual[t]) <= max(tol, 32 * torch.finfo(dtype).eps)


def nx_dense(g):
    import networkx as nx

    return nx.to_numpy_array(g, nodelist=range(g.number_of_nodes()))


def test_networkx_method_matches_networkx_power_iteration():
    model = MODELS["lenet5"]()
    ckpts = make_checkpoints(model, t=2)
    res = analyze(
        Run(model=model, checkpoints=ckpts), method="networkx", dtype=torch.float64, device="cpu", max_iter=5000
    )
    for t in range(2):
        it = int(res.iterations[t])
        ref = reference_centrality(reference_graph(res.topology, ckpts[t]), "power", max_iter=it)
        np.testing.assert_allclose(res.centrality[t].numpy(), ref, atol=1e-12)


def test_batched_equals_looped_and_featurize_batches_runs(device):
    model = MODELS["resnet20"]()
    runs = [Run(model=model, checkpoints=make_checkpoints(model, t=3, seed=s), name=f"r{s}") for s in range(3)]
    kw = dict(device=device, solver=dtg_gpu.SolverOptions(dtype=torch.float64, tol=1e-12))
    whole = analyze(runs[0], **kw)
    for t in range(3):
        one = analyze(Run(model=model, checkpoints=[runs[0].checkpoints[t]]), **kw)
        np.testing.assert_allclose(whole.centrality[t].numpy(), one.centrality[0].numpy(), atol=1e-12)
    chunked = analyze(runs[0], chunk_size=2, **kw)
    np.testing.assert_allclose(whole.centrality.numpy(), chunked.centrality.numpy(), atol=1e-12)
    feats = dtg_gpu.featurize(runs, timesteps=3, alpha=0.5, features="spec", **kw)
    assert feats.shape == (3, 15)
    for i, run in enumerate(runs):
        np.testing.assert_allclose(feats[i].numpy(), analyze(run, alpha=0.5, **kw).features.numpy(), atol=1e-10)
    # option beyond SPEC: log(lambda_1) as a sixth statistic, smoothed like the others
    six = dtg_gpu.featurize(
        runs, timesteps=3, alpha=0.5, features=dtg_gpu.feature_recipe("spec", eigenvalue=True), **kw
    ).view(3, 3, 6)
    np.testing.assert_allclose(six[..., :5].reshape(3, 15).numpy(), feats.numpy(), atol=1e-12)
    lam = np.log(analyze(runs[1], **kw).eigenvalue.numpy())
    want = [lam[0], 0.5 * lam[1] + 0.5 * lam[0], 0.5 * lam[2] + 0.25 * lam[1] + 0.25 * lam[0]]
    np.testing.assert_allclose(six[1, :, 5].numpy(), want, rtol=1e-10)


def test_pipeline_chunks_batch_large_graphs_and_stay_within_the_budget():
    """A run of 10 VGG-16 checkpoints is one batch (chunks of 3, 3, 3, 1 measured 17 % slower
    end to end on CPU, float32); long runs still split in about four chunks; the memory
    budget wins over both floors; tiny graphs batch by edges (a LeNet-5 sweep: 1,920 graphs
    in four chunks)."""
    from dtg_gpu.engine.plan import MIN_CHUNK_GRAPHS, chunk_size_for, pipeline_chunk_size, plan_units

    vgg = build_model("vgg16")
    big = Run(model=vgg, checkpoints=[vgg.state_dict()]).topology
    f32 = torch.float32
    cap = chunk_size_for(big, f32, 1 << 30)
    assert MIN_CHUNK_GRAPHS <= cap < 50  # VGG-16 at the default budget: ~11 graphs
    assert pipeline_chunk_size(big, 10, f32) == 10
    assert pipeline_chunk_size(big, 5, f32) == MIN_CHUNK_GRAPHS  # whole run, one batch
    assert pipeline_chunk_size(big, 200, f32) == cap  # about 4 chunks, capped by memory
    small_budget = 3 * ((1 << 30) // cap)  # room for 3 graphs
    assert pipeline_chunk_size(big, 10, f32, budget=small_budget) == 3
    assert [u.chunk for u in plan_units(2, 10, big, f32)] == [10, 10]  # one run per unit
    lenet = LeNet5(in_channels=1)
    tiny = Run(model=lenet, checkpoints=[lenet.state_dict()]).topology
    assert pipeline_chunk_size(tiny, 1920, f32) == 480


def test_per_layer_statistics_option_matches_scipy_per_layer():
    model = LeNet5()
    runs = [Run(model=model, checkpoints=make_checkpoints(model, t=2, seed=s), name=f"r{s}") for s in range(2)]
    kw = dict(device="cpu", solver=dtg_gpu.SolverOptions(dtype=torch.float64, tol=1e-12))
    groups = dtg_gpu.features.statistics.layer_node_groups(runs[0].topology)
    assert [len(idx) for _, idx in groups] == [6, 16, 120, 84, 10]  # the 1-node input is left out
    res = dtg_gpu.extract_features(
        runs, alpha=1.0, features=dtg_gpu.feature_recipe("spec", per_layer=True, eigenvalue=True), **kw
    )
    X, st = res.features, res.statistics
    assert X.shape == (2, 2 * (5 + 25 + 1)) and st.shape == (2, 2, 31)
    c = analyze(runs[1], **kw).centrality.numpy()
    for li, (_, idx) in enumerate(groups):
        v = c[1, idx.numpy()]
        want = [v.mean(), v.std(), np.median(v), scipy.stats.skew(v), scipy.stats.kurtosis(v)]
        np.testing.assert_allclose(st[1, 1, 5 + 5 * li : 10 + 5 * li].numpy(), want, rtol=1e-9, atol=1e-12)
    base = dtg_gpu.featurize(runs, alpha=1.0, features="spec", **kw)
    np.testing.assert_allclose(st[:, :, :5].reshape(2, 10).numpy(), base.numpy(), atol=1e-12)


def test_nan_checkpoints_are_flagged_and_do_not_leak():
    model = MODELS["lenet5"]()
    ckpts = make_checkpoints(model, t=4)
    ckpts[1]["features.0.weight"][0, 0, 0, 0] = float("nan")
    ckpts[3]["classifier.1.weight"][0, 0] = float("inf")
    with pytest.warns(NonFiniteWeightsWarning, match=r"t=1\].*t=3\]"):
        res = analyze(
            Run(model=model, checkpoints=ckpts, name="diverged"), device="cpu", dtype=torch.float64, tol=1e-12
        )
    assert res.finite.tolist() == [True, False, True, False]
    assert torch.isnan(res.centrality[[1, 3]]).all() and not res.converged[[1, 3]].any()
    clean = analyze(Run(model=model, checkpoints=[ckpts[0], ckpts[2]]), device="cpu", dtype=torch.float64, tol=1e-12)
    np.testing.assert_allclose(res.centrality[[0, 2]].numpy(), clean.centrality.numpy(), atol=1e-12)
    assert torch.isnan(res.stats[1]).all() and torch.isfinite(res.stats[0]).all()


def test_zero_and_disconnected_graphs_are_flagged():
    model = MODELS["lenet5"]()
    ckpts = make_checkpoints(model, t=3)
    ckpts[1] = {k: torch.zeros_like(v) for k, v in ckpts[1].items()}
    ckpts[2]["features.3.weight"][:, 2] = 0.0  # channel 2 of conv1 output loses all edges out
    ckpts[2]["features.0.weight"][2] = 0.0  # ... and in: node isolated
    with pytest.warns(DisconnectedGraphWarning, match=r"t=1\].*t=2\]"):
        res = analyze(Run(model=model, checkpoints=ckpts), device="cpu")
    assert res.connected.tolist() == [True, False, False]
    ckpts[0]["features.3.weight"][:, 2] = 0.0  # a zero column alone disconnects nothing
    assert analyze(Run(model=model, checkpoints=[ckpts[0]]), device="cpu").connected.all()


def test_nonconvergence_is_flagged():
    model = MODELS["lenet5"]()
    run = Run(model=model, checkpoints=make_checkpoints(model, t=2, scale=5.0))
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        res = analyze(run, method="networkx", max_iter=5, device="cpu")
    assert not res.converged.any() and (res.residual > 0).all() and (res.iterations == 5).all()


def test_graph_and_to_networkx_views(device):
    model = MODELS["grouped"]()
    ckpts = make_checkpoints(model, t=2)
    res = analyze(Run(model=model, checkpoints=ckpts), device=device, dtype=torch.float64)
    data = res.graph(1)
    assert data.num_nodes == res.topology.num_nodes
    from torch_geometric.utils import is_undirected

    assert is_undirected(data.edge_index, data.edge_weight)
    x, _ = dtg_gpu.eigenvector_centrality(data.edge_index, data.edge_weight, data.num_nodes, tol=1e-12)
    np.testing.assert_allclose(x.numpy(), reference_centrality(res.to_networkx(1)), atol=1e-9)
    g_ref = reference_graph(res.topology, ckpts[1])
    g = res.to_networkx(1)
    assert g.number_of_edges() == g_ref.number_of_edges()
    for u, v, w in list(g_ref.edges(data="weight"))[:200]:
        assert g[u][v]["weight"] == pytest.approx(w, rel=1e-12)
    table = res.table()
    assert list(table.columns[:7]) == ["run", "t", "mean", "std", "median", "skewness", "kurtosis"]


def test_featurize_errors_name_the_run():
    model = MODELS["lenet5"]()
    runs = [
        Run(model=model, checkpoints=make_checkpoints(model, t=3), name="long"),
        Run(model=model, checkpoints=make_checkpoints(model, t=2), name="short"),
    ]
    with pytest.raises(dtg_gpu.InsufficientCheckpointsError, match="run 'short' has only 2 checkpoints"):
        dtg_gpu.featurize(runs, timesteps=3, device="cpu")
    with pytest.raises(ValueError, match="empty"):
        dtg_gpu.featurize([], timesteps=3)
    with pytest.raises(ValueError, match="alpha"):
        dtg_gpu.featurize(runs, timesteps=2, alpha=2.0)
    assert dtg_gpu.featurize(runs, device="cpu", features="spec").shape == (2, 10)  # default k: the shortest run


def test_all_exports_import_and_are_unique():
    assert len(dtg_gpu.__all__) == len(set(dtg_gpu.__all__))
    for name in dtg_gpu.__all__:
        assert getattr(dtg_gpu, name) is not None


def test_live_parameters_that_require_grad_analyze_like_a_state_dict():
    """``dict(model.named_parameters())`` as checkpoints (tensors that require grad), with a
    conv above the engine's small-layer size (norms written in place): the same centrality as
    the detached state dict, and no autograd graph in the result (this crashed inside
    ``vector_norm(out=...)`` before session 12)."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 96, 3), nn.ReLU(), nn.Conv2d(96, 96, 3), nn.ReLU(), nn.Conv2d(96, 4, 1))
    live = [dict(model.named_parameters())] * 2
    assert all(p.requires_grad for p in live[0].values()) and model[2].weight.numel() > (1 << 16)
    res = analyze(Run(model=model, checkpoints=live), device="cpu")
    ref = analyze(Run(model=model, checkpoints=[model.state_dict()] * 2), device="cpu")
    assert not res.centrality.requires_grad
    torch.testing.assert_close(res.centrality, ref.centrality, rtol=0, atol=0)
