"""Ray against local featurisation on this machine, the feature cache, and a scaling model.

For each sweep folder given (default: the digits LeNet-5 demo sweep, a digits VGG-11 sweep
of width 1/16, both trained with ``dtg sweep``, and ``cifar-vgg11``: 16 runs × 10 checkpoints of
the full-width CIFAR VGG-11, 36.9 MB a checkpoint, an initialisation plus a random walk of
the weights written here in the sweep format, not trained):

* ``local``: ``featurize_sweep(runs, cache=False)`` in this process (best of --repeats);
* ``ray``: a local Ray instance (``ray.init(num_cpus=C)``, its start timed apart), the same
  call with ``executor="ray"``: the first call (workers start, import torch, trace the
  model) and then the best of --repeats; the statistics are compared bit for bit;
* ``per task``: every unit of the plan solved in this process on one thread, as a Ray
  worker with ``num_cpus=1`` does: the measured cost of a task without Ray;
* ``cache``: the first featurisation that writes the cache, and a resumed one that finds
  every run in it.

The overhead of Ray per task is ``(ray warm × C − Σ task costs) / tasks``: what a task costs
beyond its own solve when C workers are kept busy.

The scaling model (on paper, from the measured costs): ``N`` nodes of ``P`` cores each
featurise ``N·P / (c + o)`` runs per second (``c``: a run's one-core solve, ``o``: its share
of the Ray overhead) until the shared filesystem binds at ``B / bytes_per_run``. GPU nodes:
no GPU was lent to this session, so the model takes a GPU task to be bound by what its node
reads (``--node-gbps``), not by the solve; every assumption is printed with the table.

Usage: python benchmarks/bench_distributed.py [--sweeps DIR ...] [--repeats 2] [--cpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dtg_gpu.core.files import atomic_write  # noqa: E402

DEFAULT_SWEEPS = ["/tmp/sweeps/lenet5", "/tmp/sweeps/vgg11n", "cifar-vgg11"]


def write_cifar_vgg(path: Path, runs: int = 16, t: int = 10) -> Path:
    """A sweep folder of full-width CIFAR VGG-11 checkpoints (random walks, not trained)."""
    from safetensors.torch import save_file

    from dtg_gpu.core.files import atomic_write
    from dtg_gpu.models import build_model

    if (path / "sweep.json").is_file():
        return path
    names = [f"run-{i:04d}" for i in range(runs)]
    for i, name in enumerate(names):
        folder = path / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(i)
        state = {
            k: v.detach().clone().contiguous()
            for k, v in build_model("vgg11", num_classes=10, in_channels=3).state_dict().items()
        }
        g = torch.Generator().manual_seed(1000 + i)
        cps = []
        for j in range(t):
            for v in state.values():
                if v.is_floating_point():
                    v.add_(0.002 * torch.randn(v.shape, generator=g))
            f = folder / f"ckpt-{j + 1:04d}.safetensors"
            save_file(state, str(f))
            cps.append({"file": f.name, "epoch": j + 1, "bytes": f.stat().st_size})
        meta = {
            "name": name,
            "model": "vgg11",
            "model_kwargs": {"num_classes": 10, "in_channels": 3},
            "dataset": "cifar10",
            "checkpoints": cps,
            "final_accuracy": 0.1 + 0.05 * i,
            "status": "complete",
            "complete": True,
        }
        atomic_write(folder / "run.json", json.dumps(meta))
    atomic_write(
        path / "sweep.json", json.dumps({"format": "dtg_gpu.sweep/1", "config": {"synthetic": True}, "runs": names})
    )
    return path


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _identical(a, b) -> bool:
    def eq(x, y):
        if x is None or y is None:
            return x is None and y is None
        return bool(torch.equal(torch.nan_to_num(x, nan=-7.0), torch.nan_to_num(y, nan=-7.0)))

    return eq(a.stats, b.stats) and eq(a.log_eigenvalue, b.log_eigenvalue) and eq(a.layer_stats, b.layer_stats)


def _task_costs(runs, k: int) -> list[dict]:
    """Every unit of the plan solved here on one thread: (runs, graphs, seconds)."""
    from dtg_gpu.engine.plan import plan_units
    from dtg_gpu.engine.units import SolveSettings, solve_unit

    s = SolveSettings(k=k, dtype=torch.float32, tol=1e-6, max_iter=1000, method="auto", per_layer=True, eigenvalue=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        topo = runs[0].topology
        out = []
        for unit in plan_units(len(runs), k, topo, s.dtype):
            t = time.perf_counter()
            solve_unit(runs[unit.start : unit.stop], unit, s, torch.device("cpu"), topo)
            out.append(
                {
                    "runs": unit.stop - unit.start,
                    "graphs": (unit.stop - unit.start) * k,
                    "seconds": time.perf_counter() - t,
                }
            )
        return out
    finally:
        torch.set_num_threads(threads)


def measure(path: Path, repeats: int, cpus: int) -> dict:
    import ray

    from dtg_gpu.engine.cache import FeatureCache
    from dtg_gpu.sweeps import load_sweep
    from dtg_gpu.workflow import featurize_sweep

    runs = load_sweep(path)
    k = min(len(r) for r in runs)
    nbytes = sum(os.path.getsize(c) for r in runs for c in r.checkpoints[:k])
    res = {
        "sweep": str(path),
        "model": f"{runs[0].meta.get('dataset')} {runs[0].meta.get('model')}"
        + (f" w{runs[0].meta['model_kwargs']['width']:g}" if "width" in runs[0].meta.get("model_kwargs", {}) else ""),
        "runs": len(runs),
        "k": k,
        "bytes": nbytes,
        "graphs": len(runs) * k,
    }
    res["local_s"], local = _best(lambda: featurize_sweep(runs, cache=False, device="cpu"), repeats)
    tasks = _task_costs(runs, k)
    res["tasks"] = len(tasks)
    res["task_seconds"] = [round(t["seconds"], 4) for t in tasks]
    res["task_sum_s"] = sum(t["seconds"] for t in tasks)

    t = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    res["ray_start_s"] = time.perf_counter() - t
    try:
        t = time.perf_counter()
        first = featurize_sweep(runs, cache=False, device="cpu", executor="ray")
        res["ray_first_s"] = time.perf_counter() - t
        res["ray_s"], warm = _best(lambda: featurize_sweep(runs, cache=False, device="cpu", executor="ray"), repeats)
        res["identical"] = _identical(local, first) and _identical(local, warm)
    finally:
        ray.shutdown()
    res["ray_overhead_per_task_s"] = (res["ray_s"] * cpus - res["task_sum_s"]) / len(tasks)

    cache = FeatureCache(Path("/tmp") / f"dtg-bench-distributed-cache-{path.name}", root=path)
    import shutil

    shutil.rmtree(cache.folder, ignore_errors=True)
    t = time.perf_counter()
    featurize_sweep(runs, cache=cache, device="cpu")
    res["cache_write_s"] = time.perf_counter() - t
    res["cache_read_s"], cached = _best(lambda: featurize_sweep(runs, cache=cache, device="cpu"), repeats)
    res["cache_identical"] = _identical(local, cached)
    shutil.rmtree(cache.folder, ignore_errors=True)
    return res


def scaling(res: dict, cores: int, fs_gbps: list[float], node_gbps: float) -> list[dict]:
    """Runs per second on N nodes (model, see the module's description): the compute bound of
    CPU nodes, the bound of what the nodes read, and the throughput under each shared
    filesystem bandwidth for CPU and (read-bound) GPU nodes."""
    per_run = res["task_sum_s"] / res["runs"]  # one core
    over = max(res["ray_overhead_per_task_s"], 0.0) * res["tasks"] / res["runs"]
    bytes_run = res["bytes"] / res["runs"]
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        compute = n * cores / (per_run + over)
        node_io = n * node_gbps * 1e9 / bytes_run
        row = {"nodes": n, "cpu_compute_runs_s": compute, "node_read_runs_s": node_io}
        for fs in fs_gbps:
            cap = fs * 1e9 / bytes_run
            row[f"fs{fs:g}"] = {
                "cpu": min(compute, node_io, cap),
                "gpu": min(node_io, cap),
                "binds": "filesystem"
                if cap < min(compute, node_io)
                else ("node reads" if node_io < compute else "compute"),
            }
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweeps", nargs="+", default=DEFAULT_SWEEPS)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="Ray workers on this machine")
    p.add_argument("--cores", type=int, default=32, help="cores per node in the scaling model")
    p.add_argument(
        "--fs-gbps",
        type=float,
        nargs="+",
        default=[2.0, 20.0],
        help="shared filesystem bandwidths to model, GB/s (an NFS server, a parallel filesystem)",
    )
    p.add_argument("--node-gbps", type=float, default=1.25, help="what one node reads, GB/s (10 GbE)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    results = []
    for s in a.sweeps:
        if s == "cifar-vgg11":
            s = str(write_cifar_vgg(Path(os.environ.get("TMPDIR", "/tmp")) / "dtg-bench-distributed-cifar-vgg11"))
        if not (Path(s) / "sweep.json").is_file():
            print(f"skip {s}: no sweep.json (see the module's description)", file=sys.stderr)
            continue
        r = measure(Path(s), a.repeats, a.cpus)
        r["scaling"] = scaling(r, a.cores, a.fs_gbps, a.node_gbps)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("scaling", "task_seconds")}, indent=1))
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "cpus": a.cpus,
        "cores": a.cores,
        "fs_gbps": a.fs_gbps,
        "node_gbps": a.node_gbps,
        "machine": f"{os.cpu_count()} cores, no GPU",
        "command": "python benchmarks/bench_distributed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "distributed_cpu.json", json.dumps({"meta": meta, "results": results}, indent=2))
    lines = [
        f"# Ray against local featurisation ({meta['date']}, {meta['machine']}, torch {meta['torch']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        "| sweep | runs × k | MB | local s | Ray start s | Ray first s | Ray warm s | Ray/local | tasks "
        "| task s (1 core, mean) | overhead s/task | identical | cache write s | resume from cache s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['runs']} × {r['k']} | {r['bytes'] / 1e6:.0f} | {r['local_s']:.2f} | "
            f"{r['ray_start_s']:.1f} | {r['ray_first_s']:.1f} | {r['ray_s']:.2f} | {r['ray_s'] / r['local_s']:.2f} | "
            f"{r['tasks']} | {r['task_sum_s'] / r['tasks']:.2f} | {r['ray_overhead_per_task_s']:.3f} | "
            f"{'yes' if r['identical'] else 'NO'} | {r['cache_write_s']:.2f} | {r['cache_read_s']:.3f} |"
        )
    fs_cols = " | ".join(f"{fs:g} GB/s FS: CPU | GPU | binds" for fs in a.fs_gbps)
    for r in results:
        lines += [
            "",
            f"## Scaling model: {r['model']} ({r['runs']} runs × {r['k']}, "
            f"{r['bytes'] / r['runs'] / 1e6:.1f} MB a run, {r['tasks']} tasks)",
            "",
            f"Runs per second. Assumed: {a.cores} cores a node, a node reads {a.node_gbps} GB/s; one run costs "
            f"{r['task_sum_s'] / r['runs']:.3f} core-s (measured) plus its share of Ray's overhead (measured); "
            "GPU nodes bound by what they read (GPU solve not measured: no GPU lent to this project). A sweep of "
            f"this size has {r['tasks']} tasks: no more than that many workers are busy at once.",
            "",
            f"| nodes | CPU compute bound | node reads bound | {fs_cols} |",
            "|---|---|---|" + "---|---|---|" * len(a.fs_gbps),
        ]
        for row in r["scaling"]:
            cells = " | ".join(
                f"{row[f'fs{fs:g}']['cpu']:.1f} | {row[f'fs{fs:g}']['gpu']:.1f} | {row[f'fs{fs:g}']['binds']}"
                for fs in a.fs_gbps
            )
            lines.append(
                f"| {row['nodes']} | {row['cpu_compute_runs_s']:.1f} | {row['node_read_runs_s']:.1f} | {cells} |"
            )
    atomic_write(out / "distributed_cpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
