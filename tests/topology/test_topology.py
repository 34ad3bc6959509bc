import numpy as np
import pytest
import torch
import torchvision
from conftest import GroupedNet
from torch import nn

import dtg_gpu
from dtg_gpu import TopologyError, TracingFallbackWarning, channel_topology
from dtg_gpu.models import LeNet5, build_model


def _weight_layers(model):
    return [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def test_lenet5_chain_order_and_count():
    model = LeNet5(in_channels=1)
    topo = channel_topology(model)
    layers = _weight_layers(model)
    expected = layers[0].in_channels + sum(
        m.out_channels if isinstance(m, nn.Conv2d) else m.out_features for m in layers
    )
    assert topo.num_nodes == expected == 1 + 6 + 16 + 120 + 84 + 10
    # chain: node ranges in exactly the order in_1, out_1, out_2, ...
    start = 0
    assert topo.layers[0].in_nodes.tolist() == [0]
    start = 1
    for layer in topo.layers:
        assert layer.out_nodes.tolist() == list(range(start, start + layer.out_channels))
        start += layer.out_channels
    assert topo.layers[2].spatial == 25 and topo.layers[2].in_channels == 16


def test_torchvision_vgg11_node_count_from_layer_shapes():
    model = torchvision.models.vgg11(num_classes=10)
    topo = channel_topology(model)
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    fcs = [m for m in model.classifier if isinstance(m, nn.Linear)]
    n = convs[0].in_channels + sum(c.out_channels for c in convs) + sum(f.out_features for f in fcs)
    assert topo.num_nodes == n == 10957  # SPEC step 3 quotes 10,957 nodes
    assert topo.layers[8].spatial == fcs[0].in_features // convs[-1].out_channels == 49
    edges = sum(c.out_channels * c.in_channels for c in convs) + 512 * 4096 + 4096 * 4096 + 4096 * 10
    assert topo.num_edges == edges


def test_torchvision_resnet18_residual_stream_is_shared():
    model = torchvision.models.resnet18(num_classes=10)
    topo = channel_topology(model)
    assert topo.traced
    # stream spaces: stem (64) shared by layer1; each later stage one new 128/256/512 space.
    # nodes = input 3 + stem 64 + one conv1 output per block + one stream per stage 2..4
    blocks = [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]
    n = 3 + 64 + sum(b.conv1.out_channels for b in blocks) + 128 + 256 + 512 + 10
    assert topo.num_nodes == n
    by_name = {l.name: l for l in topo.layers}
    stem = by_name["conv1"].out_nodes
    assert torch.equal(by_name["layer1.0.conv2"].out_nodes, stem)
    assert torch.equal(by_name["layer1.1.conv2"].out_nodes, stem)
    assert torch.equal(by_name["layer2.0.downsample.0"].out_nodes, by_name["layer2.0.conv2"].out_nodes)
    assert torch.equal(by_name["layer2.1.conv1"].in_nodes, by_name["layer2.0.conv2"].out_nodes)
    assert torch.equal(by_name["fc"].in_nodes, by_name["layer4.1.conv2"].out_nodes)
    # first appearance order: the stage-2 stream is numbered where layer2.0.conv2 runs
    assert by_name["layer2.0.conv2"].out_nodes[0] > by_name["layer2.0.conv1"].out_nodes[-1]


def test_cifar_resnet20_and_grouped_model():
    topo = channel_topology(build_model("resnet20"))
    assert topo.num_nodes == 3 + 16 + 9 * 0 + (16 * 3 + 32 * 3 + 64 * 3) + 32 + 64 + 10
    g = channel_topology(GroupedNet())
    by = {l.name: l for l in g.layers}
    assert by["grouped"].groups == 4 and by["grouped"].block_shape == (16, 2)
    assert by["depthwise"].block_shape == (16, 1)
    assert torch.equal(by["mix"].in_nodes, by["mix"].out_nodes)  # x + conv(x): one space
    assert torch.equal(by["mix"].in_nodes, torch.cat([by["depthwise"].out_nodes, by["branch"].out_nodes]))
    assert by["fc"].spatial == 16
    assert g.num_nodes == 3 + 8 + 16 + 16 + 4 + 5


def test_untraceable_model_falls_back_with_warning():
    class Dynamic(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                x = x * 2
            return self.b(self.a(x))

    # refused by default: which layer feeds which is unknown (a silently wrong graph otherwise)
    with pytest.raises(TopologyError, match=r"Dynamic: cannot be traced \(.*\), so which layers feed which is unknown"):
        channel_topology(Dynamic())
    with pytest.raises(TopologyError) as err:  # the shape tracer failed for the same reason: said once
        channel_topology(Dynamic())
    assert str(err.value).count("TraceError") == 1
    with pytest.raises(TopologyError, match="pass fallback=True"):
        dtg_gpu.analyze(dtg_gpu.Run(model=Dynamic(), checkpoints=[Dynamic().state_dict()]), device="cpu")
    # on request: registration order, with a warning
    with pytest.warns(TracingFallbackWarning, match="module registration order"):
        topo = channel_topology(Dynamic(), fallback=True)
    assert not topo.traced and topo.num_nodes == 9
    with pytest.raises(TopologyError, match="cannot be traced"):  # the cached fallback is not handed out
        channel_topology(Dynamic())
    with pytest.warns(TracingFallbackWarning):
        res = dtg_gpu.analyze(dtg_gpu.Run(model=Dynamic(), checkpoints=[Dynamic().state_dict()], fallback=True))
    assert res.centrality.shape == (1, 9)


def test_no_weight_layers_and_unknown_parametrised_module():
    with pytest.raises(TopologyError, match="no Conv1d/2d/3d or Linear"):
        channel_topology(nn.Sequential(nn.ReLU()))
    with pytest.raises(TopologyError, match="Embedding"):
        channel_topology(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2)))


def test_conv1d_conv3d():
    net = nn.Sequential(nn.Conv1d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6, 4))
    topo = channel_topology(net)
    assert topo.num_nodes == 2 + 3 + 4 and topo.layers[1].spatial == 6
    net3 = nn.Sequential(nn.Conv3d(1, 2, 2), nn.Conv3d(2, 2, 1, groups=2))
    assert channel_topology(net3).num_nodes == 5


# --- weight layers are calls (SPEC step 2, decided later) ------------------------------
class _WSConv(nn.Conv2d):
    """Weight standardisation, as timm's StdConv2d: a Conv2d subclass with its own forward."""

    def forward(self, x):
        w = self.weight - self.weight.mean(dim=(1, 2, 3), keepdim=True)
        w = w / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return nn.functional.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _LoRALinear(nn.Linear):
    def __init__(self, a, b, r=2):
        super().__init__(a, b)
        self.lora_A = nn.Parameter(torch.randn(r, a))
        self.lora_B = nn.Parameter(torch.randn(b, r))

    def forward(self, x):
        return nn.functional.linear(x, self.weight + self.lora_B @ self.lora_A, self.bias)


def _issue_model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3),
        nn.ReLU(),
        _WSConv(16, 16, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        _LoRALinear(16, 16),
        nn.ReLU(),
        nn.Linear(16, 10),
    )


def test_conv_and_linear_subclasses_with_their_own_forward_are_graphed():
    from dtg_gpu import Run, analyze

    torch.manual_seed(0)
    model = _issue_model()
    topo = channel_topology(model)
    assert [l.name for l in topo.layers] == ["0", "2", "6", "8"]
    assert topo.layers[1].sources == ("2.weight",)
    assert set(topo.layers[2].sources) == {"6.weight", "6.lora_A", "6.lora_B"}
    cov = topo.coverage().set_index("parameter")
    assert (
        cov.loc[["0.weight", "2.weight", "6.weight", "6.lora_A", "6.lora_B", "8.weight"], "role"] == "graphed"
    ).all()
    assert (cov.loc[["0.bias", "2.bias"], "role"] == "bias").all()
    # the edges come from the effective weights: the same graph as a plain model holding them
    sd = model.state_dict()
    w2 = sd["2.weight"] - sd["2.weight"].mean(dim=(1, 2, 3), keepdim=True)
    w2 = w2 / (w2.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
    plain = nn.Sequential(
        nn.Conv2d(3, 16, 3),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 16),
        nn.ReLU(),
        nn.Linear(16, 10),
    )
    plain_sd = {
        **{k: v for k, v in sd.items() if "lora" not in k},
        "2.weight": w2,
        "6.weight": sd["6.weight"] + sd["6.lora_B"] @ sd["6.lora_A"],
    }
    got = analyze(Run(model=model, checkpoints=[sd]), dtype=torch.float64, tol=1e-12, device="cpu")
    want = analyze(Run(model=plain, checkpoints=[plain_sd]), dtype=torch.float64, tol=1e-12, device="cpu")
    np.testing.assert_allclose(got.centrality.numpy(), want.centrality.numpy(), atol=1e-12)
    raw = analyze(
        Run(model=plain, checkpoints=[{k: v for k, v in sd.items() if "lora" not in k}]),
        dtype=torch.float64,
        tol=1e-12,
        device="cpu",
    )
    assert np.abs(got.centrality.numpy() - raw.centrality.numpy()).max() > 1e-3  # not the raw weights


def test_a_weight_matrix_outside_the_graph_is_never_silent():
    from dtg_gpu import UncoveredWeightsWarning

    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.mix = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return self.fc(x) @ self.mix  # a matrix product, not a conv/linear call

    with pytest.warns(UncoveredWeightsWarning, match="mix"):
        topo = channel_topology(Gate())
    assert topo.coverage().set_index("parameter").loc["mix", "role"] == "unsupported"
    with pytest.raises(TopologyError, match="mix"):
        channel_topology(Gate(), strict=True)


@pytest.mark.parametrize("order", ["gate_first", "features_first"])
def test_squeeze_and_excitation_does_not_depend_on_operand_order(order):
    class SE(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.fc1 = nn.Conv2d(8, 2, 1)
            self.fc2 = nn.Conv2d(2, 8, 1)
            self.head = nn.Conv2d(8, 4, 1)

        def forward(self, x):
            x = self.conv(x)
            gate = torch.sigmoid(self.fc2(torch.relu(self.fc1(nn.functional.adaptive_avg_pool2d(x, 1)))))
            x = gate * x if order == "gate_first" else x * gate
            return self.head(x)

    topo = channel_topology(SE())
    layers = {l.name: l for l in topo.layers}
    assert torch.equal(layers["fc2"].out_nodes, layers["conv"].out_nodes)  # the gate is the features' nodes
    assert torch.equal(layers["head"].in_nodes, layers["conv"].out_nodes)
    assert topo.num_nodes == 3 + 8 + 2 + 4


class _ShuffleBlock(nn.Module):
    """ShuffleNet-V2's stride-1 unit, as torchvision writes it: chunk, branch, cat, shuffle."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(1, 4, 1)
        self.b = nn.Conv2d(2, 2, 1)
        self.c = nn.Conv2d(4, 1, 1)

    def forward(self, x):
        x = self.a(x)
        x1, x2 = x.chunk(2, dim=1)
        x = torch.cat((x1, self.b(x2)), dim=1)
        b, c, h, w = x.size()
        x = x.view(b, 2, c // 2, h, w)
        x = torch.transpose(x, 1, 2).contiguous()
        return self.c(x.view(b, -1, h, w))


def test_channel_chunk_and_shuffle_map_nodes_exactly():
    topo = channel_topology(_ShuffleBlock())
    layers = {l.name: l for l in topo.layers}
    a = layers["a"].out_nodes.tolist()
    assert layers["b"].in_nodes.tolist() == a[2:]  # the second chunk
    b = layers["b"].out_nodes.tolist()
    # cat -> [a0, a1, b0, b1]; shuffle with 2 groups -> [a0, b0, a1, b1]
    assert layers["c"].in_nodes.tolist() == [a[0], b[0], a[1], b[1]]


@pytest.mark.parametrize("how", ["slice", "split", "narrow"])
def test_channel_slices_take_their_nodes(how):
    class Slice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(1, 6, 1)
            self.b = nn.Conv2d(2, 3, 1)

        def forward(self, x):
            x = self.a(x)
            if how == "slice":
                part = x[:, 2:4]
            elif how == "split":
                part = torch.split(x, [2, 2, 2], dim=1)[1]
            else:
                part = x.narrow(1, 2, 2)
            return self.b(part)

    layers = {l.name: l for l in channel_topology(Slice()).layers}
    assert layers["b"].in_nodes.tolist() == layers["a"].out_nodes.tolist()[2:4]


def test_torchvision_shufflenet_analyses():
    from dtg_gpu import Run, analyze

    model = torchvision.models.shufflenet_v2_x0_5()
    res = analyze(Run(model=model, checkpoints=[model.state_dict()]), device="cpu")
    assert res.converged.all() and res.centrality.shape[1] == res.topology.num_nodes


@pytest.mark.parametrize("style", ["parametrize", "legacy"])
def test_weight_norm_uses_the_effective_weight(style):
    import warnings

    from dtg_gpu import Run, analyze

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the legacy hook is deprecated
        wn = nn.utils.parametrizations.weight_norm if style == "parametrize" else nn.utils.weight_norm
        net[0] = wn(net[0])
        net[3] = wn(net[3])
    sd = net.state_dict()
    assert "0.weight" not in sd  # the checkpoint holds the factors only
    topo = channel_topology(net)
    assert [l.name for l in topo.layers] == ["0", "3"] and all(l.effective is not None for l in topo.layers)
    plain = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    with torch.no_grad():
        effective = {"0.weight": net[0].weight.detach().clone(), "3.weight": net[3].weight.detach().clone()}
    got = analyze(Run(model=net, checkpoints=[sd]), dtype=torch.float64, tol=1e-12, device="cpu")
    want = analyze(
        Run(model=plain, checkpoints=[{**plain.state_dict(), **effective}]),
        dtype=torch.float64,
        tol=1e-12,
        device="cpu",
    )
    np.testing.assert_allclose(got.centrality.numpy(), want.centrality.numpy(), atol=1e-10)


def test_ops_in_no_table_are_listed_and_named_when_channels_go_wrong():
    class Known(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 1)

        def forward(self, x):
            y = torch.nn.functional.gelu(self.a(x)).float()
            return self.b(torch.nn.functional.max_pool2d(y, 2)).mean((2, 3))

    assert channel_topology(Known()).assumed_ops == ()

    class Unknown(Known):
        def forward(self, x):
            return self.b(torch.cumsum(self.a(x), 2))

    topo = channel_topology(Unknown())
    assert len(topo.assumed_ops) == 1 and "op 'cumsum'" in topo.assumed_ops[0]
    assert topo.num_nodes == 3 + 4 + 2  # still assumed to keep the channels, as before

    class Wrong(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 3), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            return self.b(torch.repeat_interleave(self.a(x), 2, dim=1))

    with pytest.raises(TopologyError, match="op 'repeat_interleave'"):
        channel_topology(Wrong(), strict=True)
