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
from dtg_gpu.testing.reference import reference_adjacency, reference_centrality, reference_graph
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
        expected[first : first + 4, 0:4] = block.abs().numpy()
    expected[16:20, 12:16] = w_out.abs().numpy()  # out_proj reads v's nodes, not q's
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
    vit = VisionTransformer(
        image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3
    )
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


def test_token_mixing_is_listed_not_graphed_and_channels_pass_through():
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(6, 8)
            self.tokens = nn.Linear(5, 5)  # mixes the 5 tokens: not a channel map
            self.head = nn.Linear(8, 2)

        def forward(self, x):  # x: [B, 5 tokens, 6]
            h = self.stem(x)
            h = h + self.tokens(h.transpose(1, 2)).transpose(1, 2)
            return self.head(h.mean(1))

    topo = channel_topology(Mixer(), strict=True)
    L = by_layer(topo)
    assert list(L) == ["stem", "head"] and torch.equal(L["head"].in_nodes, L["stem"].out_nodes)
    cov = topo.coverage().set_index("parameter")
    assert cov.loc["tokens.weight", "role"] == "token-mixing"


class Attention(nn.Module):
    """timm's layout: one qkv linear, reshaped into heads, permuted, unbound."""

    def __init__(self, d=8, heads=2, fused=True):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused:
            x = nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            x = (q @ k.transpose(-2, -1)).softmax(-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class TinyViT(nn.Module):
    def __init__(self, fused=True):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, stride=4)
        self.cls = nn.Parameter(torch.zeros(1, 1, 8))
        self.attn = Attention(fused=fused)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):  # [B, 3, 8, 8] -> 4 tokens + a class token
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1)
        t = t + self.attn(self.norm(t))
        return self.head(t[:, 0])


@pytest.mark.parametrize("fused", [True, False])
def test_packed_qkv_attention_is_followed_through_reshape_permute_unbind(fused):
    net = TinyViT(fused)
    topo = channel_topology(net, strict=True)
    L = by_layer(topo)
    assert list(L) == ["patch", "attn.qkv", "attn.proj", "head"]
    qkv = L["attn.qkv"].out_nodes  # one layer of 24 outputs: q, k, v in that order
    # the value heads, in order, are what proj reads; q and k feed nothing; proj adds to the stream
    assert torch.equal(L["attn.proj"].in_nodes, qkv[16:24])
    fed = set(torch.cat([l.in_nodes for l in topo.layers]).tolist())
    assert not fed & set(qkv[:16].tolist())
    assert torch.equal(L["attn.proj"].out_nodes, L["patch"].out_nodes)
    assert torch.equal(L["head"].in_nodes, L["patch"].out_nodes)  # the class token took the stream's nodes
    cov = topo.coverage().set_index("parameter")
    assert cov.loc["cls", "role"] == "embedding" and cov.loc["attn.qkv.weight", "role"] == "graphed"
    run = dtg_gpu.Run(model=net, checkpoints=make_checkpoints(net, t=2))
    w = run.weights(1)
    res = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12)
    np.testing.assert_allclose(res.centrality[1].numpy(), reference_centrality(reference_graph(topo, w)), atol=1e-9)


def _small_models():
    from conftest import GroupedNet
    from torchvision.models import resnet18, shufflenet_v2_x0_5

    from dtg_gpu.models import LeNet5

    return {
        "lenet5": LeNet5,
        "resnet18": resnet18,
        "shufflenet_v2": shufflenet_v2_x0_5,
        "grouped": GroupedNet,
        "vit": lambda: VisionTransformer(
            image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16
        ),
    }


@pytest.mark.parametrize("name", list(_small_models()))
def test_the_shape_tracer_agrees_with_the_symbolic_one(name):
    """Two independent ways of following channels (symbols with the channel at dim 1; id
    tensors through a real forward pass) give the same graph wherever both apply."""
    from dtg_gpu.topology.fx_pass import _trace
    from dtg_gpu.topology.shape_pass import trace_with_shapes

    net = _small_models()[name]()
    assert _trace(net).signature() == trace_with_shapes(net).signature()


def test_swin_and_maxvit_analyse_with_every_weight_in_the_graph():
    from torchvision.models.maxvit import MaxVit
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    small = dict(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=[2, 2], num_classes=3)
    for net in (
        SwinTransformer(**small),
        SwinTransformer(**small, block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2),
        MaxVit(
            input_size=(32, 32),
            stem_channels=8,
            partition_size=2,
            block_channels=[8, 16],
            block_layers=[1, 1],
            head_dim=4,
            stochastic_depth_prob=0.0,
            num_classes=3,
        ),
    ):
        topo = channel_topology(net, strict=True)
        assert topo.structurally_connected()
        cov = topo.coverage().set_index("parameter")
        assert "unsupported" not in set(cov.role)
        convs = [n for n, m in net.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        # Swin-V2's position-bias MLP runs on a constant table: not a channel map
        assert all(cov.loc[f"{n}.weight", "role"] == ("embedding" if "cpb_mlp" in n else "graphed") for n in convs)
        run = dtg_gpu.Run(model=net, checkpoints=make_checkpoints(net, t=1))
        res = dtg_gpu.analyze(run, device="cpu", dtype=torch.float64, tol=1e-12)
        ref = reference_centrality(reference_graph(topo, run.weights(0)))
        np.testing.assert_allclose(res.centrality[0].numpy(), ref, atol=1e-8)


def test_timm_vit_and_mixer_on_the_meta_device_as_from_dir_builds_them():
    timm = pytest.importorskip("timm")
    for name, kw in (("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8}), ("mixer_s16_224", {"img_size": 32})):
        cpu = channel_topology(timm.create_model(name, pretrained=False, num_classes=3, **kw), strict=True)
        with torch.device("meta"):
            meta = timm.create_model(name, pretrained=False, num_classes=4, **kw)
        assert channel_topology(meta, strict=True).num_nodes == cpu.num_nodes + 1
        roles = set(cpu.coverage().role)
        assert "unsupported" not in roles and ("token-mixing" in roles) == name.startswith("mixer")


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
        assert layer.effective is not None  # the standardised weight, not the raw one
        want = nn.functional.batch_norm(
            conv.weight.reshape(1, conv.out_channels, -1), None, None, training=True, momentum=0.0, eps=conv.eps
        ).reshape_as(conv.weight)
        torch.testing.assert_close(layer.effective_weight(net.state_dict()), want.detach())
