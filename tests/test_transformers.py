"""Transformers per SPEC: tokens are not channels, attention carries v's channels,
``nn.MultiheadAttention`` is its q/k/v blocks and ``out_proj``; what is not followed is an
error that names the operation and the module."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_checkpoints
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer

import dtg_gpu
from dtg_gpu.exceptions import TopologyError
from dtg_gpu.reference import reference_adjacency, reference_centrality, reference_graph
from dtg_gpu.topology import channel_topology


class OneAttention(nn.Module):
    """x (4 channels, 3 tokens) -> self-attention (2 heads) -> mean over tokens -> Linear(4, 2)."""

    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(4, 2, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y, _ = self.att(x, x, x)
        return self.head(y.mean(1))


def by_layer(topo):
    return {l.name: l for l in topo.layers}


def test_multihead_attention_is_its_qkv_blocks_and_out_proj_exactly():
    torch.manual_seed(0)
    net = OneAttention()
    topo = channel_topology(net, strict=True)
    L = by_layer(topo)
    assert list(L) == ["att.in_proj.q", "att.in_proj.k", "att.in_proj.v", "att.out_proj", "head"]
    # nodes: input 0-3, q 4-7, k 8-11, v 12-15, out_proj 16-19, head 20-21 (first appearance)
    assert topo.num_nodes == 22
    state = net.state_dict()
    w_in, w_out, w_head = state["att.in_proj_weight"], state["att.out_proj.weight"], state["head.weight"]
    expected = np.zeros((22, 22))
    for block, first in ((w_in[0:4], 4), (w_in[4:8], 8), (w_in[8:12], 12)):
        expected[first:first + 4, 0:4] = block.abs().numpy()
    expected[16:20, 12:16] = w_out.abs().numpy()      # out_proj reads v's nodes, not q's
    expected[20:22, 16:20] = w_head.abs().numpy()
    expected = expected + expected.T
    got = reference_adjacency(topo, state).toarray()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-7)
    # q and k feed nothing further
    fed = set(np.concatenate([l.in_nodes.numpy() for l in topo.layers]).tolist())
    assert not fed & set(range(4, 12))
    cov = topo.coverage().set_index("parameter")
    assert cov.loc["att.in_proj_weight", "role"] == "graphed"
    assert cov.loc["att.in_proj_bias", "role"] == "bias"
    assert "in_proj.q" in cov.loc["att.in_proj_weight", "reason"]


def test_a_vision_transformer_analyses_with_full_coverage_and_matches_networkx():
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8,
                            mlp_dim=16, num_classes=3)
    topo = channel_topology(vit, strict=True)
    cov = topo.coverage().set_index("parameter")
    assert "unsupported" not in set(cov.role)
    assert cov.loc["class_token", "role"] == cov.loc["encoder.pos_embedding", "role"] == "embedding"
    weights = [n for n, p in vit.named_parameters() if n.endswith("weight") and p.dim() >= 2]
    assert all(cov.loc[n, "role"] == "graphed" for n in weights)
    L = by_layer(topo)
    # the residual stream: conv_proj's nodes are what every out_proj and MLP output adds to
    stream = set(L["conv_proj"].out_nodes.tolist())
    for i in range(2):
        p = f"encoder.layers.encoder_layer_{i}"
        assert set(L[f"{p}.self_attention.out_proj"].out_nodes.tolist()) == stream
        assert set(L[f"{p}.mlp.3"].out_nodes.tolist()) == stream
        assert torch.equal(L[f"{p}.self_attention.out_proj"].in_nodes, L[f"{p}.self_attention.in_proj.v"].out_nodes)
    run = dtg_gpu.Run(model=vit, checkpoints=make_checkpoints(vit, t=2))
    res = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12)
    for t in range(2):
        state = run.weights(t)
        ref = reference_centrality(reference_graph(topo, state))
        np.testing.assert_allclose(res.centrality[t].numpy(), ref, atol=1e-9)
    # the v block's effective weight is the last third of in_proj_weight
    w = run.weights(0)
    packed = run.checkpoints[0]["encoder.layers.encoder_layer_0.self_attention.in_proj_weight"]
    assert torch.equal(w["encoder.layers.encoder_layer_0.self_attention.in_proj_weight[v]"], packed[16:24])


def test_transformer_encoder_layers_share_one_residual_stream():
    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Linear(6, 16)
            layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)).mean(1))

    net = Enc()
    topo = channel_topology(net, strict=True)
    # input 6 + stream 16 + per layer q, k, v (16 each) + feed-forward 32; head 3
    assert topo.num_nodes == 6 + 16 + 2 * (3 * 16 + 32) + 3
    L = by_layer(topo)
    stream = L["emb"].out_nodes.tolist()
    for i in range(2):
        assert L[f"enc.layers.{i}.self_attn.out_proj"].out_nodes.tolist() == stream
        assert L[f"enc.layers.{i}.linear2"].out_nodes.tolist() == stream
        assert L[f"enc.layers.{i}.linear1"].in_nodes.tolist() == stream
    assert set(topo.coverage().role) <= {"graphed", "bias", "normalisation"}
    run = dtg_gpu.Run(model=net, checkpoints=make_checkpoints(net, t=2))
    res = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12)
    ref = reference_centrality(reference_graph(topo, run.weights(1)))
    np.testing.assert_allclose(res.centrality[1].numpy(), ref, atol=1e-9)


@pytest.mark.parametrize("fused", [True, False])
def test_hand_written_attention_carries_the_values_channels(fused):
    class Att(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
            self.proj = nn.Linear(4, 2)

        def forward(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            if fused:
                y = nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                y = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
            return self.proj(y)

    L = by_layer(channel_topology(Att(), strict=True))
    assert torch.equal(L["proj"].in_nodes, L["v"].out_nodes)


def test_token_mixing_through_a_transpose_is_named_not_mis_wired():
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(6, 8)
            self.tokens = nn.Linear(5, 5)   # mixes the 5 tokens: not a channel map
            self.head = nn.Linear(8, 2)

        def forward(self, x):          # x: [B, 5 tokens, 6]
            h = self.stem(x)
            h = h + self.tokens(h.transpose(1, 2)).transpose(1, 2)
            return self.head(h.mean(1))

    with pytest.raises(TopologyError, match=r"op 'transpose' \(node transpose\) in module '' \(Mixer\)|"
                                            r"op 'transpose' \(node transpose\)"):
        channel_topology(Mixer(), strict=True)


def test_timm_attention_with_packed_qkv_is_named():
    timm = pytest.importorskip("timm")
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=3)
    with pytest.raises(TopologyError, match=r"in module 'blocks\.0\.attn' \(Attention\)"):
        channel_topology(vit, strict=True)


@pytest.mark.parametrize("name", ["resnetv2_50x1_bit", "mobilenetv3_small_050"])
def test_timm_cnns_have_every_weight_in_the_graph(name):
    """timm's StdConv2d (weight standardisation in its forward) and its Linear head were the
    layers a module-only tracer dropped without a word."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    net = timm.create_model(name, pretrained=False)
    topo = channel_topology(net, strict=True)
    cov = topo.coverage().set_index("parameter")
    mats = [n for n, p in net.named_parameters() if p.dim() >= 2]
    assert all(cov.loc[n, "role"] == "graphed" for n in mats)
    if name == "resnetv2_50x1_bit":
        conv = net.stem.conv
        layer = by_layer(topo)["stem.conv"]
        assert layer.effective is not None   # the standardised weight, not the raw one
        want = nn.functional.batch_norm(conv.weight.reshape(1, conv.out_channels, -1), None, None,
                                        training=True, momentum=0.0, eps=conv.eps).reshape_as(conv.weight)
        torch.testing.assert_close(layer.effective_weight(net.state_dict()), want.detach())
