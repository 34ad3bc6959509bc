"""Draw the figures of the docs (run on demand; the PNGs are committed beside this file).

    python docs/make_figures.py

``img/channel_graph.png``: the channel graph of a tiny chain network, edge width ∝ edge
weight, node area ∝ eigenvector centrality. ``img/centrality_over_training.png``: the five
statistics of the centrality over training for two LeNet-5 runs on digits, one that learns
and one whose learning rate is too high.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dtg_gpu  # noqa: E402
from dtg_gpu.features.statistics import STATISTICS  # noqa: E402
from dtg_gpu.sweeps import SweepConfig, load_sweep, run_sweep  # noqa: E402

HERE = Path(__file__).resolve().parent / "img"


def channel_graph() -> None:
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 4, 3), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    res = dtg_gpu.analyze(dtg_gpu.Run(model=net, checkpoints=[net.state_dict()]), dtype=torch.float64,
                          device="cpu")
    g = res.to_networkx(0)
    topo = res.topology
    layer_of = {int(n): 0 for n in topo.layers[0].in_nodes}
    for i, layer in enumerate(topo.layers, 1):
        layer_of.update({int(n): i for n in layer.out_nodes})
    names = ["input\nchannels", "conv1\nfilters", "conv2\nfilters", "linear\nneurons"]
    pos = {}
    for col in range(len(names)):
        nodes = sorted(n for n, c in layer_of.items() if c == col)
        for j, n in enumerate(nodes):
            pos[n] = (col, j - (len(nodes) - 1) / 2)
    c = res.centrality[0].numpy()
    w = [d["weight"] for _, _, d in g.edges(data=True)]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    nx.draw_networkx_edges(g, pos, ax=ax, width=[2.5 * x / max(w) for x in w], edge_color="#888")
    nx.draw_networkx_nodes(g, pos, ax=ax, node_size=[3000 * x for x in c], node_color=c, cmap="viridis")
    for col, name in enumerate(names):
        ax.text(col, -2.9, name, ha="center", va="top", fontsize=9)
    ax.set_title("One checkpoint's channel graph: edge = ‖W[i, j]‖₂, node area = centrality")
    ax.set_ylim(-3.6, 2.4)
    ax.axis("off")
    fig.savefig(HERE / "channel_graph.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def centrality_over_training() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SweepConfig(model="lenet5", dataset="digits", lrs=(0.01, 0.3), dropouts=(0.0,), seeds=1,
                          epochs=10, checkpoint_every=1)
        runs = load_sweep(run_sweep(cfg, Path(tmp) / "sweep", progress=False, device="cpu"))
        fig, axes = plt.subplots(1, 5, figsize=(16, 3.2), constrained_layout=True)
        for run in runs:
            res = dtg_gpu.analyze(run, device="cpu")
            label = f"lr={run.meta['lr']:g}: final accuracy {run.final_accuracy:.2f}"
            for i, ax in enumerate(axes):
                ax.plot(range(1, len(res) + 1), res.stats[:, i].numpy(), marker="o", ms=3, label=label)
                ax.set_title(f"centrality {STATISTICS[i]}")
                ax.set_xlabel("epoch")
        axes[0].legend(fontsize=8)
        fig.savefig(HERE / "centrality_over_training.png", dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    channel_graph()
    centrality_over_training()
    print(f"wrote {HERE}")
