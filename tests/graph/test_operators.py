import networkx as nx
import numpy as np
import pytest
import torch
from conftest import GroupedNet, make_checkpoints
from torch import nn

from dtg_gpu import BlockOperator, CheckpointError, channel_topology, filter_norms
from dtg_gpu.graph import graph_edges, row_norms, to_networkx
from dtg_gpu.graph.scaling import load_blocks
from dtg_gpu.models import LeNet5
from dtg_gpu.testing.reference import reference_adjacency


def test_filter_norms_match_numpy():
    conv = nn.Conv2d(3, 4, 3, groups=1)
    layer = channel_topology(nn.Sequential(conv)).layers[0]
    w = torch.randn(5, 4, 3, 3, 3, dtype=torch.float64)
    expected = np.sqrt((w.numpy() ** 2).sum(axis=(3, 4)))
    np.testing.assert_allclose(filter_norms(w, layer).numpy(), expected, rtol=1e-12)
    lin = channel_topology(LeNet5()).layers[2]  # Linear after flatten: [120, 16, 25]
    w = torch.randn(2, 120, 400, dtype=torch.float64)
    expected = np.sqrt((w.numpy().reshape(2, 120, 16, 25) ** 2).sum(-1))
    np.testing.assert_allclose(filter_norms(w, lin).numpy(), expected, rtol=1e-12)
    with pytest.raises(CheckpointError, match="classifier.1.weight.*expected shape"):
        filter_norms(torch.randn(2, 120, 399), lin)


# B x from a transposed copy, as xᵀBᵀ on the transposed view (CPU), as B × column (GPU, run here too)
@pytest.mark.parametrize("form", ["copy", "row view", "column"])
@pytest.mark.parametrize("model_fn", [LeNet5, GroupedNet])
def test_block_operator_equals_reference_adjacency(model_fn, form, device):
    model = model_fn()
    topo = channel_topology(model)
    ckpts = make_checkpoints(model, t=3)
    blocks, finite = load_blocks(topo, ckpts, torch.device(device), torch.float64)
    assert finite.all()
    op = BlockOperator(topo, blocks, transposed_copy=form == "copy")
    assert any(b is not None for b in op._blocks_t) == (form == "copy")
    assert op._row_form == (torch.device(device).type == "cpu")
    op._row_form = form == "row view"
    x = torch.randn(3, topo.num_nodes, dtype=torch.float64, device=device)
    y = op(x).cpu().numpy()
    for t in range(3):
        a = reference_adjacency(topo, ckpts[t])
        np.testing.assert_allclose(y[t], a @ x[t].cpu().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("contiguous", [True, False])
def test_row_norms_match_numpy_with_nan_inf_and_out(dtype, contiguous):
    """The CPU fast path (cdist to the origin: contiguous float32) and the fallback
    (vector_norm: float64, half precision, strided views) give NumPy's float64 norms, propagate
    NaN and Inf per row, write into ``out``, and accept empty input."""
    g = torch.Generator().manual_seed(0)
    tol = {torch.float16: 2e-3, torch.float32: 1e-6, torch.float64: 1e-14}[dtype]
    for k in (9, 49):  # 3×3 kernels (cdist on contiguous float32) and 7×7 positions (vector_norm)
        w = torch.randn(3, 40, 6, k, generator=g, dtype=torch.float64)
        w[0, 0, 0, 4], w[1, 2, 3, 0], w[2, 5, 1, 8] = float("nan"), float("inf"), -float("inf")
        w[0, 1, 2] = 0.0
        x = w.to(dtype)
        if not contiguous:
            x = x.transpose(1, 2)  # [3, 6, 40, k], strided
        expected = np.linalg.norm(x.double().numpy(), axis=-1)
        got = row_norms(x)
        assert got.dtype == dtype and got.shape == x.shape[:-1]
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=tol)  # NaN and Inf at the same places
        out = torch.full(x.shape[:-1], -1.0, dtype=dtype)
        assert row_norms(x, out=out) is out
        np.testing.assert_allclose(out.double().numpy(), expected, rtol=tol)
    assert row_norms(torch.empty(0, 4, 9, dtype=dtype)).shape == (0, 4)


def test_self_loops_counted_once_and_parallel_edges_add():
    model = GroupedNet()
    topo = channel_topology(model)
    ckpt = make_checkpoints(model, t=1)[0]
    blocks, _ = load_blocks(topo, [ckpt], torch.device("cpu"), torch.float64)
    g = to_networkx(topo, blocks)
    w = ckpt["mix.weight"].double()[:, :, 0, 0].abs()
    mix = {l.name: l for l in topo.layers}["mix"]
    n0, n1 = int(mix.out_nodes[0]), int(mix.out_nodes[1])
    assert g[n0][n0]["weight"] == pytest.approx(float(w[0, 0]))
    assert g[n0][n1]["weight"] == pytest.approx(float(w[0, 1] + w[1, 0]))
    ref = nx.from_scipy_sparse_array(reference_adjacency(topo, ckpt), edge_attribute="weight")
    assert set(g.edges) == set(ref.edges)
    ei, ew = graph_edges(topo, blocks, directed_pairs=True)
    assert ei.shape[1] == 2 * g.number_of_edges() - nx.number_of_selfloops(g)
