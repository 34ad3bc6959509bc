"""End-to-end featurisation of checkpoints on disk against the time to merely read them,
peak memory as T and the number of runs grow, and the scaling plot.

Issue #6 targets: the pipeline is I/O-bound (featurise / read <= 1.3) and its peak memory is
bounded as T and runs grow.

Workloads (files are written once to --work, safetensors, float32):
* ``digits`` - the real default digits LeNet-5 sweep (96 runs x 20 checkpoints): ``--digits``
  names an existing one (bench_prediction.py writes it), else it is trained here (small graphs:
  per-file and Python overheads dominate);
* ``vgg11`` - CIFAR VGG-11 (width 1, 9.2 M weights, 36.9 MB a checkpoint): per run, an
  initialisation plus a random walk of the weights (real-size files on disk, not trained).

Every measurement runs in a fresh subprocess so that its peak RSS is its own. Reading =
``Run.weights(t)`` for every checkpoint in the same order, touching every byte (a streaming
sum: safetensors maps files lazily). Each point is measured cold (the files evicted from the
page cache with ``posix_fadvise(DONTNEED)`` first: a sweep on disk) and warm (the best case
for reading, so the strict case for the ratio).

Usage: python benchmarks/bench_pipeline.py [--quick] [--device cpu] [--work DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dtg_gpu.core.files import atomic_write  # noqa: E402


# --------------------------------------------------------------------------- worker side
def _synthetic(model, runs: int, t: int):
    """In-memory runs: the model's weights plus a random walk (for the edges series)."""
    from dtg_gpu import Run

    out = []
    for i in range(runs):
        g = torch.Generator().manual_seed(i)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ckpts = []
        for _ in range(t):
            for v in state.values():
                v.add_(0.002 * torch.randn(v.shape, generator=g))
            ckpts.append({k: v.clone() for k, v in state.items()})
        out.append(Run(model=model, checkpoints=ckpts, name=f"mem-{i}"))
    return out


def _runs(workload: str, work: Path, runs: int, t: int):
    from dtg_gpu import Run
    from dtg_gpu.models import build_model

    if workload.startswith("mem:"):  # mem:<model>:<width>
        _, name, width = workload.split(":")
        kw = {"width": float(width)} if name.startswith("vgg") else {}
        return _synthetic(build_model(name, num_classes=10, in_channels=3 if name != "lenet5" else 1, **kw), runs, t)
    if workload == "digits":
        from dtg_gpu.sweeps import load_sweep

        out = load_sweep(work)[:runs]
        for r in out:
            r.checkpoints = list(r.checkpoints)[:t]
        return out
    model = build_model("vgg11", num_classes=10, in_channels=3)
    return [
        Run(
            model=model,
            checkpoints=sorted((work / workload / f"run-{i:03d}").glob("*.safetensors"))[:t],
            name=f"run-{i:03d}",
        )
        for i in range(runs)
    ]


def _evict(runs) -> None:
    """Drop the runs' files from the page cache (posix_fadvise DONTNEED): a cold read."""
    for r in runs:
        for c in r.checkpoints:
            if isinstance(c, (str, Path)):
                fd = os.open(c, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def worker(a) -> None:
    from dtg_gpu import featurize

    runs = _runs(a.workload, Path(a.work), a.runs, a.t)
    if a.cold:
        _evict(runs)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if a.mode == "read":  # safetensors maps files lazily: touch every byte (a streaming sum)
        n, total = 0, 0.0
        for r in runs:
            for t in range(len(r)):
                for v in r.weights(t).values():
                    n += v.numel()
                    total += float(v.sum())
        extra = {"numbers_read": n}
    else:
        X = featurize(runs, device=a.device)
        extra = {"finite": bool(torch.isfinite(X).all())}
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak / 1024, "rss_before_mb": base / 1024, **extra}))


# --------------------------------------------------------------------------- driver side
def _write_vgg(work: Path, runs: int, t_first: int, t: int) -> None:
    """Run 0 gets ``t_first`` checkpoints (the T series), the others ``t`` (the runs series)."""
    from safetensors.torch import save_file

    from dtg_gpu.models import build_model

    for i in range(runs):
        t_i = t_first if i == 0 else t
        folder = work / "vgg11" / f"run-{i:03d}"
        have = len(list(folder.glob("*.safetensors"))) if folder.is_dir() else 0
        if have >= t_i:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(i)
        state = {
            k: v.detach().clone().contiguous()
            for k, v in build_model("vgg11", num_classes=10, in_channels=3).state_dict().items()
        }
        g = torch.Generator().manual_seed(1000 + i)
        for j in range(t_i):
            for v in state.values():
                v.add_(0.002 * torch.randn(v.shape, generator=g))
            if j >= have:
                save_file(state, str(folder / f"ckpt-{j + 1:04d}.safetensors"))


DIGITS: dict = {}


def _ensure_digits(path: Path, t: int) -> None:
    """The default digits sweep (as bench_sweep.py / bench_prediction.py), trained if absent."""
    from dtg_gpu.sweeps import SweepConfig, run_sweep

    cfg = SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.03, 0.1, 0.3),
        dropouts=(0.0, 0.25, 0.5, 0.75),
        seeds=3,
        epochs=t,
    )
    run_sweep(cfg, path, progress=False)
    DIGITS["path"] = path


def measure(workload: str, work: Path, runs: int, t: int, mode: str, device: str, cold: bool = False) -> dict:
    if workload == "digits":
        work = DIGITS["path"]
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--workload",
        workload,
        "--work",
        str(work),
        "--runs",
        str(runs),
        "--t",
        str(t),
        "--mode",
        mode,
        "--device",
        device,
    ] + (["--cold"] if cold else [])
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller grid (a few minutes on 2 cores)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "dtg-bench-pipeline"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument(
        "--digits",
        default=None,
        help="an existing default digits sweep folder (bench_prediction.py's lenet5); else trained here",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", default="vgg11", help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--t", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="featurize", help=argparse.SUPPRESS)
    p.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.quick:
        t_grid, run_grid, digits_t = [5, 10, 20], [1, 2, 4], 20
    else:
        t_grid, run_grid, digits_t = [5, 10, 20, 40], [1, 2, 4, 8], 20
    _write_vgg(work, max(run_grid), max(t_grid), t_grid[1])
    _ensure_digits(Path(a.digits) if a.digits else work / "digits", digits_t)
    points = (
        [("vgg11", 1, t) for t in t_grid]
        + [("vgg11", r, t_grid[1]) for r in run_grid if r > 1]
        + [("digits", 96, digits_t)]
    )
    rows = []
    for workload, runs, t in points:
        cold_read = measure(workload, work, runs, t, "read", a.device, cold=True)
        cold_feat = measure(workload, work, runs, t, "featurize", a.device, cold=True)
        read = measure(workload, work, runs, t, "read", a.device)  # page cache now warm
        feat = measure(workload, work, runs, t, "featurize", a.device)
        row = {
            "workload": workload,
            "runs": runs,
            "T": t,
            "graphs": runs * t,
            "cold_read_s": round(cold_read["seconds"], 3),
            "cold_featurize_s": round(cold_feat["seconds"], 3),
            "cold_ratio": round(cold_feat["seconds"] / cold_read["seconds"], 2),
            "read_s": round(read["seconds"], 3),
            "featurize_s": round(feat["seconds"], 3),
            "ratio": round(feat["seconds"] / read["seconds"], 2),
            "read_peak_rss_mb": round(read["peak_rss_mb"]),
            "featurize_peak_rss_mb": round(feat["peak_rss_mb"]),
            "finite": feat["finite"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    from dtg_gpu.models import build_model
    from dtg_gpu.topology import channel_topology

    edges = []  # featurise time against graph size: in-memory runs, T = 10
    sizes = [("lenet5", 1), ("vgg11", 0.125), ("vgg11", 0.25), ("vgg11", 0.5), ("vgg11", 1)]
    if not a.quick:
        sizes.append(("vgg16", 1))
    for name, width in sizes:
        kw = {"width": width} if name.startswith("vgg") else {}
        topo = channel_topology(build_model(name, num_classes=10, in_channels=1 if name == "lenet5" else 3, **kw))
        feat = measure(f"mem:{name}:{width}", work, 1, 10, "featurize", a.device)
        edges.append(
            {
                "model": name,
                "width": width,
                "nodes": topo.num_nodes,
                "edges": topo.num_edges,
                "T": 10,
                "featurize_s": round(feat["seconds"], 3),
                "peak_rss_mb": round(feat["peak_rss_mb"]),
            }
        )
        print(json.dumps(edges[-1]), flush=True)
    topo = channel_topology(build_model("vgg11", num_classes=10, in_channels=3))
    res = {
        "device": a.device,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "vgg11_nodes": topo.num_nodes,
        "vgg11_edges": topo.num_edges,
        "checkpoint_mb_vgg11": round(sum(p.numel() for p in build_model("vgg11").parameters()) * 4 / 2**20, 1),
        "page_cache": "cold_* columns: files evicted with posix_fadvise(DONTNEED) first; others: warm",
        "rows": rows,
        "edges": edges,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"pipeline_{a.device}" + ("_quick" if a.quick else "")
    atomic_write(out / f"{stem}.json", json.dumps(res, indent=2))
    lines = [
        "| workload | runs | T | graphs | cold read s | cold featurise s | cold ratio | warm read s | "
        "warm featurise s | warm ratio | peak RSS MB (read / featurise) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['workload']} | {r['runs']} | {r['T']} | {r['graphs']} | {r['cold_read_s']} | {r['cold_featurize_s']} | "
        f"{r['cold_ratio']} | {r['read_s']} | {r['featurize_s']} | "
        f"{r['ratio']} | {r['read_peak_rss_mb']} / {r['featurize_peak_rss_mb']} |"
        for r in rows
    ]
    lines += ["", "| model | width | nodes | edges | T | featurise s | peak RSS MB |", "|---|---|---|---|---|---|---|"]
    lines += [
        f"| {e['model']} | {e['width']} | {e['nodes']} | {e['edges']} | {e['T']} | {e['featurize_s']} | "
        f"{e['peak_rss_mb']} |"
        for e in edges
    ]
    atomic_write(out / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(res, out / f"{stem}_scaling.png")


def plot(res: dict, path: Path) -> None:
    """Featurise time against T, runs and edges (log-log, with a slope-1 guide)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res["rows"] if r["workload"] == "vgg11"]
    by_t = sorted((r for r in rows if r["runs"] == 1), key=lambda r: r["T"])
    t_runs = by_t[1]["T"] if len(by_t) > 1 else by_t[0]["T"]
    by_runs = sorted((r for r in rows if r["T"] == t_runs), key=lambda r: r["runs"])
    series = [
        (
            "checkpoints T (VGG-11, 1 run)",
            [r["T"] for r in by_t],
            [r["featurize_s"] for r in by_t],
            [r["read_s"] for r in by_t],
        ),
        (
            f"runs (VGG-11, T={t_runs})",
            [r["runs"] for r in by_runs],
            [r["featurize_s"] for r in by_runs],
            [r["read_s"] for r in by_runs],
        ),
        ("edges (T=10, in memory)", [e["edges"] for e in res["edges"]], [e["featurize_s"] for e in res["edges"]], None),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    for ax, (label, x, y, read) in zip(axes, series):
        ax.loglog(x, y, "o-", label="featurise (read + solve)")
        if read:
            ax.loglog(x, read, "s--", label="read files only")
        guide = [y[-1] * xi / x[-1] for xi in x]
        ax.loglog(x, guide, ":", color="grey", label="linear (slope 1)")
        ax.set_xlabel(label)
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"dtg_gpu featurise scaling on {res['device']} ({res['threads']} threads, {res['date']})")
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    main()
