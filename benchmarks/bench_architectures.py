"""Which real architectures analyse, and how well: every torchvision classification model that
builds without downloads (random weights), one row each.

Columns: nodes, edges, coverage (weight matrices in the graph / all weight matrices),
seconds per checkpoint of ``analyze`` (2 checkpoints, float32, after one warm-up), and for
graphs up to ``--ref-max-edges`` the max abs difference to SciPy/ARPACK in float64 on the
NumPy-built reference adjacency (the NetworkX reference). A model that cannot be analysed
gets its error, by name.

Also a few timm models (``timm:NAME``, random weights, small inputs where the model allows).

Usage: python benchmarks/bench_architectures.py [--models resnet18 vit_b_16 timm:resnet18 ...] [--update]
       [--max-params 3e7] [--ref-max-edges 1.2e7] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as sla
import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dtg_gpu  # noqa: E402
from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.testing.reference import reference_adjacency  # noqa: E402

EXTRA = {
    "googlenet": {"aux_logits": False, "init_weights": False},
    "inception_v3": {"aux_logits": False, "init_weights": False},
}
# timm models, built with random weights at a small input size where the model allows it
TIMM = {
    "resnet18": {},
    "efficientnet_b0": {},
    "convnext_atto": {},
    "mobilenetv3_small_050": {},
    "resnetv2_50x1_bit": {},
    "vit_tiny_patch16_224": {"img_size": 32, "patch_size": 8},
    "deit_tiny_patch16_224": {"img_size": 32, "patch_size": 8},
    "mixer_s16_224": {"img_size": 32},
}
DEFAULT_TIMM = [f"timm:{n}" for n in TIMM]


def build(name: str):
    """A torchvision model by name, or ``timm:NAME`` (random weights, no download)."""
    if name.startswith("timm:"):
        import timm

        return timm.create_model(name[5:], pretrained=False, **TIMM.get(name[5:], {}))
    return torchvision.models.get_model(name, weights=None, **EXTRA.get(name, {}))


def count(name: str) -> int:
    try:  # count on the meta device (no memory); some constructors need real tensors
        with torch.device("meta"):
            return sum(p.numel() for p in build(name).parameters())
    except NotImplementedError:
        return sum(p.numel() for p in build(name).parameters())


def row(name: str, ref_max_edges: float, max_params: float) -> dict:
    torch.manual_seed(0)
    out: dict = {"model": name}
    try:
        size = count(name)
        if size > max_params:
            out["error"] = f"skipped: {size / 1e6:.0f} M parameters (--max-params {max_params:.3g})"
            return out
        model = build(name).eval()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            topo = dtg_gpu.channel_topology(model)
        cov = topo.coverage()
        mats = cov[cov["role"].isin(["graphed", "unsupported"])]
        out.update(
            nodes=topo.num_nodes,
            edges=topo.num_edges,
            layers=len(topo.layers),
            graphed=int((mats["role"] == "graphed").sum()),
            weight_matrices=len(mats),
            warnings=[str(w.message)[:200] for w in caught if isinstance(w.message, dtg_gpu.DTGWarning)],
        )
        sd = model.state_dict()
        ckpts = [
            {k: v + 0.01 * t * torch.randn_like(v) if v.is_floating_point() else v for k, v in sd.items()}
            for t in range(2)
        ]
        run = dtg_gpu.Run(model=model, checkpoints=ckpts)
        dtg_gpu.analyze(dtg_gpu.Run(model=model, checkpoints=ckpts[:1]), device="cpu")
        t0 = time.perf_counter()
        res = dtg_gpu.analyze(run, device="cpu")
        out["seconds_per_checkpoint"] = (time.perf_counter() - t0) / 2
        out["converged"] = bool(res.converged.all())
        if topo.num_edges <= ref_max_edges:
            a = reference_adjacency(topo, run.weights(0))
            _, v = sla.eigsh(a, k=1, which="LA", tol=1e-10)
            v = v[:, 0] * np.sign(v[:, 0].sum())
            out["max_abs_diff_vs_reference"] = float(np.abs(res.centrality[0].double().numpy() - v).max())
    except Exception as exc:  # the table names what fails
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--ref-max-edges", type=float, default=3e6)
    p.add_argument("--max-params", type=float, default=1.5e8, help="skip larger models (memory, time)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument(
        "--update",
        action="store_true",
        help="replace only the given models' rows in the existing table, keep the others",
    )
    a = p.parse_args(argv)
    names = a.models or torchvision.models.list_models(module=torchvision.models) + DEFAULT_TIMM
    out = Path(a.out)
    rows = []
    if a.update and (out / "architectures_cpu.json").is_file():
        rows = [r for r in json.loads((out / "architectures_cpu.json").read_text()) if r["model"] not in names]
    for name in names:
        r = row(name, a.ref_max_edges, a.max_params)
        rows.append(r)
        print(json.dumps(r), flush=True)
    rows.sort(key=lambda r: (r["model"].startswith("timm:"), r["model"]))
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on the CPU (2 threads), torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}; random weights, 2 checkpoints, float32.\n",
        "| model | nodes | edges | coverage | s / checkpoint | converged | max abs diff vs reference | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r and "nodes" not in r:
            lines.append(f"| {r['model']} | – | – | – | – | – | – | **fails**: {r['error']} |")
            continue
        diff = f"{r['max_abs_diff_vs_reference']:.1e}" if "max_abs_diff_vs_reference" in r else "–"
        sec = f"{r['seconds_per_checkpoint']:.3f}" if "seconds_per_checkpoint" in r else "–"
        note = r.get("error", "") or "; ".join(r.get("warnings", []))
        conv = {True: "yes", False: "no"}.get(r.get("converged"), "–")
        lines.append(
            f"| {r['model']} | {r['nodes']:,} | {r['edges']:,} | {r['graphed']}/{r['weight_matrices']} | "
            f"{sec} | {conv} | {diff} | {note} |"
        )
    atomic_write(out / "architectures_cpu.md", "\n".join(lines) + "\n")
    atomic_write(out / "architectures_cpu.json", json.dumps(rows, indent=2))
    print(f"wrote {out / 'architectures_cpu.md'}")


if __name__ == "__main__":
    main()
