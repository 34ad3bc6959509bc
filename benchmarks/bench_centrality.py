"""Eigenvector centrality: NetworkX, SciPy eigsh and dtg_gpu's kernels side by side, one run.

For each model graph and T checkpoints, every method solves the same T graphs (float64
unless stated) and reports wall time per graph, iterations, max |Δ| to the SciPy/ARPACK
reference, and speed-up against NetworkX and SciPy measured in this run.

NetworkX's power iteration is timed for a few steps and extrapolated to the number of steps
it needs (our ``method="networkx"`` reproduces its iteration, so that count is exact); the
row says so. ``eigenvector_centrality_numpy`` is skipped above ``--nx-max-edges`` (building
a ``networkx.Graph`` of 20 M edges takes minutes and many GB).

Usage: python benchmarks/bench_centrality.py [--quick] [--device cuda] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np
import scipy
import scipy.sparse.linalg as sla
import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dtg_gpu  # noqa: E402
from dtg_gpu.centrality import solve_perron  # noqa: E402
from dtg_gpu.core.devices import resolve_device
from dtg_gpu.graph import BlockOperator, graph_edges  # noqa: E402
from dtg_gpu.graph.scaling import load_blocks, scaled_blocks
from dtg_gpu.models import build_model  # noqa: E402
from dtg_gpu.testing.reference import reference_adjacency  # noqa: E402


def models(quick: bool):
    out = [
        ("lenet5", lambda: build_model("lenet5", in_channels=1)),
        ("cifar_vgg11", lambda: build_model("vgg11")),
        ("cifar_vgg16", lambda: build_model("vgg16")),
    ]
    if not quick:
        out += [
            ("resnet18", lambda: build_model("resnet18")),
            ("tv_vgg11", lambda: torchvision.models.vgg11(num_classes=10)),
        ]
    return out


def checkpoints(model, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = []
    for i in range(t):
        out.append(
            {
                k: (v + 0.02 * i * torch.randn(v.shape, generator=g) * v.std())
                if v.is_floating_point() and v.dim() > 1
                else v
                for k, v in base.items()
            }
        )
    return out


def read_bandwidth(device) -> float:
    """Bytes per second of a streaming read (``x.sum()`` over 512 MiB), best of 5."""
    x = torch.ones(2**27, device=device)  # 512 MiB float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        x.sum()
        sync()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


BANDWIDTH: dict = {}


def timed(fn, sync=None):
    t0 = time.perf_counter()
    out = fn()
    if sync:
        sync()
    return out, time.perf_counter() - t0


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(name, model, t, device, nx_max_edges, nx_steps):
    topo = dtg_gpu.channel_topology(model)
    ckpts = checkpoints(model, t)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    rows = []
    # reference: SciPy eigsh on the NumPy-built adjacency (float64), looped over graphs
    adjs, t_build = timed(lambda: [reference_adjacency(topo, c) for c in ckpts])
    refs, t_eigsh, it_eigsh = [], 0.0, []
    for a in adjs:
        count = [0]

        def mv(x, a=a):
            count[0] += 1
            return a @ x

        op = sla.LinearOperator(a.shape, matvec=mv, dtype=np.float64)
        (w, v), dt = timed(lambda: sla.eigsh(op, k=1, which="LA", tol=1e-10))
        v = v[:, 0] * np.sign(v[:, 0].sum())
        refs.append(v)
        t_eigsh += dt
        it_eigsh.append(count[0])
    refs = np.stack(refs)
    rows.append(
        dict(
            method="scipy eigsh (looped)",
            dtype="float64",
            seconds=t_eigsh,
            iterations=float(np.mean(it_eigsh)),
            max_abs_diff=0.0,
            note=f"adjacency build {t_build / t:.3f} s/graph not counted",
        )
    )

    def ours(method, dtype, tol, max_iter=20000, bipartite=None):
        torch_dtype = getattr(torch, dtype)
        (blocks, _, scale), t_load = timed(lambda: scaled_blocks(topo, ckpts, device, torch_dtype), sync)
        op = BlockOperator(topo, blocks, scale=scale)
        mask = torch.ones(t, topo.num_nodes, dtype=torch.bool, device=device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        res, dt = timed(
            lambda: solve_perron(op, mask, tol=tol, max_iter=max_iter, method=method, bipartite=bipartite), sync
        )
        diff = float(np.abs(res.vector.double().cpu().numpy() - refs).max())
        peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else rss_mb()
        return res, dt, t_load, diff, peak

    # the default (Lanczos on C Cᵀ for bipartite graphs), and Lanczos on A for comparison
    bip = topo.bipartition is not None
    runs = [("lanczos", "float64", 1e-10, None), ("lanczos", "float32", 1e-6, None)]
    runs += [("lanczos", "float32", 1e-6, False)] if bip else []
    for method, dtype, tol, bipartite in runs:
        res, dt, t_load, diff, peak = ours(method, dtype, tol, bipartite=bipartite)
        iters = float(res.iterations.double().mean())
        # memory-bandwidth floor: every edge weight read once per iteration per graph
        floor = (4 if dtype == "float32" else 8) * topo.num_edges * t * iters / BANDWIDTH["bytes_per_s"]
        label = (
            "lanczos on A (bipartite=False)"
            if bipartite is False
            else ("lanczos" + (" (C Cᵀ, bipartite)" if bip else ""))
        )
        rows.append(
            dict(
                method=f"dtg blocks {label}",
                dtype=dtype,
                seconds=dt,
                iterations=iters,
                max_abs_diff=diff,
                peak_mb=peak,
                floor_s=floor,
                x_bandwidth_floor=dt / floor,
                note=f"filter norms {t_load / t:.3f} s/graph not counted",
            )
        )
    # end to end, as a user calls it: filter norms, transposed copies, solve, statistics
    run = dtg_gpu.Run(model=model, checkpoints=ckpts)
    for dtype, tol in (("float32", 1e-6), ("float64", 1e-10)):
        dtg_gpu.analyze(
            dtg_gpu.Run(model=model, checkpoints=ckpts[:1]), device=device, dtype=getattr(torch, dtype), tol=tol
        )  # warm-up (tracing is cached)
        ana, dt = timed(lambda: dtg_gpu.analyze(run, device=device, dtype=getattr(torch, dtype), tol=tol), sync)
        rows.append(
            dict(
                method="dtg analyze (end to end)",
                dtype=dtype,
                seconds=dt,
                iterations=float(ana.iterations.double().mean()),
                max_abs_diff=float(np.abs(ana.centrality.double().numpy() - refs).max()),
                peak_mb=rss_mb() if device.type == "cpu" else None,
                note="filter norms, transposed copies, solve and statistics all counted",
            )
        )
    res_nx, dt_nx, _, diff_nx, peak = ours("networkx", "float64", 1e-6)
    nx_iters = float(res_nx.iterations.double().mean())
    rows.append(
        dict(
            method="dtg blocks networkx-steps",
            dtype="float64",
            seconds=dt_nx,
            iterations=nx_iters,
            max_abs_diff=diff_nx,
            peak_mb=peak,
            note="NetworkX's (A+I) iteration and stopping rule",
        )
    )
    # our general sparse kernel (edge list), one batched call; its int64 edge lists and CSR
    # copies need ~50 bytes per edge per graph, so it is skipped above --sparse-max-edges in all
    if topo.num_edges * t <= SPARSE_MAX["edges"]:
        blocks, _ = load_blocks(topo, ckpts, torch.device("cpu"), torch.float64)
        eis, ews = zip(*(graph_edges(topo, blocks, g) for g in range(t)))
        n = topo.num_nodes
        ei = torch.cat([e + g * n for g, e in enumerate(eis)], 1).to(device)
        ew = torch.cat(ews).to(device)
        batch = torch.arange(t, device=device).repeat_interleave(n)
        (x, r), dt = timed(lambda: dtg_gpu.eigenvector_centrality(ei, ew, n * t, batch, num_graphs=t, tol=1e-10), sync)
        rows.append(
            dict(
                method="dtg sparse lanczos",
                dtype="float64",
                seconds=dt,
                iterations=float(r.iterations.double().mean()),
                max_abs_diff=float(np.abs(x.view(t, n).cpu().numpy() - refs).max()),
            )
        )
    # NetworkX
    if topo.num_edges <= nx_max_edges:
        g = nx.from_scipy_sparse_array(adjs[0], edge_attribute="weight")
        c, dt = timed(lambda: nx.eigenvector_centrality_numpy(g, weight="weight"))
        rows.append(
            dict(
                method="networkx eigenvector_centrality_numpy",
                dtype="float64",
                seconds=dt * t,
                iterations=float("nan"),
                note="timed on graph 0, x T",
                max_abs_diff=float(np.abs(np.array([c[i] for i in range(len(c))]) - refs[0]).max()),
            )
        )
        steps = max(1, min(nx_steps, int(nx_iters)))
        try:
            _, dt = timed(lambda: nx.eigenvector_centrality(g, weight="weight", max_iter=steps, tol=0))
        except nx.PowerIterationFailedConvergence:
            pass
        _, dt = timed(lambda: _nx_steps(g, steps))
        per_step = dt / steps
        rows.append(
            dict(
                method="networkx eigenvector_centrality",
                dtype="float64",
                seconds=per_step * nx_iters * t,
                iterations=nx_iters,
                max_abs_diff=diff_nx,
                note=f"{steps} steps timed ({per_step:.3g} s/step), extrapolated to {nx_iters:.0f} steps x T",
            )
        )
    else:
        per_edge = NX_STEP_PER_EDGE.get("value")
        if per_edge:
            rows.append(
                dict(
                    method="networkx eigenvector_centrality",
                    dtype="float64",
                    seconds=per_edge * topo.num_edges * nx_iters * t,
                    iterations=nx_iters,
                    max_abs_diff=diff_nx,
                    note="not run: step time extrapolated per edge from the largest graph run",
                )
            )
    for r in rows:
        if r["method"] == "networkx eigenvector_centrality" and "per edge" not in r.get("note", ""):
            NX_STEP_PER_EDGE["value"] = r["seconds"] / (topo.num_edges * nx_iters * t)
    nx_time = next((r["seconds"] for r in rows if r["method"] == "networkx eigenvector_centrality"), None)
    for r in rows:
        r.update(
            model=name,
            T=t,
            nodes=topo.num_nodes,
            edges=topo.num_edges,
            per_graph_s=r["seconds"] / t,
            speedup_vs_networkx=(nx_time / r["seconds"]) if nx_time else None,
            speedup_vs_scipy=t_eigsh / r["seconds"],
        )
    return rows


NX_STEP_PER_EDGE: dict = {}
SPARSE_MAX = {"edges": 2e7}


def _nx_steps(g, steps):
    try:
        nx.eigenvector_centrality(g, weight="weight", max_iter=steps, tol=0)
    except nx.PowerIterationFailedConvergence:
        pass


def to_markdown(rows):
    head = (
        "| model | T | edges | method | dtype | s/graph | iters | max abs diff | x NetworkX | x SciPy | x bandwidth floor |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        sx = f"{r['speedup_vs_networkx']:.3g}" if r.get("speedup_vs_networkx") else "–"
        bw = f"{r['x_bandwidth_floor']:.2f}" if "x_bandwidth_floor" in r else "–"
        lines.append(
            f"| {r['model']} | {r['T']} | {r['edges']:,} | {r['method']} | {r['dtype']} | "
            f"{r['per_graph_s']:.4g} | {r['iterations']:.0f} | {r['max_abs_diff']:.1e} | {sx} | "
            f"{r['speedup_vs_scipy']:.3g} | {bw} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small graphs, T in {1, 10}")
    p.add_argument("--timesteps", type=int, nargs="+", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--nx-max-edges", type=float, default=2e6)
    p.add_argument("--nx-steps", type=int, default=3)
    p.add_argument(
        "--sparse-max-edges", type=float, default=2e7, help="skip the sparse kernel when edges x T exceed this (memory)"
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=None,
        help="subset, in this order (lenet5 cifar_vgg11 cifar_vgg16 resnet18 tv_vgg11)",
    )
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = p.parse_args(argv)
    device = resolve_device(a.device)
    BANDWIDTH["bytes_per_s"] = read_bandwidth(device)
    SPARSE_MAX["edges"] = a.sparse_max_edges
    print(f"streaming read bandwidth on {device}: {BANDWIDTH['bytes_per_s'] / 1e9:.1f} GB/s", flush=True)
    ts = a.timesteps or ([1, 10] if a.quick else [1, 10, 50])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"centrality_{device.type}" + ("_quick" if a.quick else "")
    env = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "networkx": nx.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "read_bandwidth_gb_s": BANDWIDTH["bytes_per_s"] / 1e9,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }

    def save():  # after every (model, T): a crash or kill keeps what was measured
        for path, text in (
            (out / f"{tag}.json", json.dumps({"env": env, "rows": rows}, indent=2)),
            (
                out / f"{tag}.md",
                f"Measured {env['date']} on {env['device']} "
                f"({env['gpu'] or str(env['cpu_threads']) + ' CPU threads'}), torch {env['torch']}, "
                f"streaming read {env['read_bandwidth_gb_s']:.1f} GB/s.\n\n" + to_markdown(rows) + "\n",
            ),
        ):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    rows = []
    chosen = models(False) if a.models else models(a.quick)
    if a.models:
        unknown = set(a.models) - {name for name, _ in chosen}
        if unknown:
            p.error(f"unknown model(s) {sorted(unknown)}; choose from {[name for name, _ in chosen]}")
        chosen = [(name, build) for name, build in chosen if name in a.models]
    for name, build in chosen:
        torch.manual_seed(0)
        model = build()
        for t in ts:
            if name == "tv_vgg11" and t > 10 and device.type == "cpu":
                continue  # 20 M edges x 50 float64 blocks exceed this machine's memory budget
            new = bench(name, model, t, device, a.nx_max_edges, a.nx_steps)
            rows += new
            save()
            for r in new:
                print(
                    f"{name:12s} T={t:3d} {r['method']:40s} {r['dtype']:8s} {r['per_graph_s']:10.4g} s/graph "
                    f"iters={r['iterations']:6.0f} diff={r['max_abs_diff']:.1e} "
                    f"xNX={r['speedup_vs_networkx'] or float('nan'):.3g} xSciPy={r['speedup_vs_scipy']:.3g}",
                    flush=True,
                )
    print(f"wrote {out / tag}.json and .md")


if __name__ == "__main__":
    main()
