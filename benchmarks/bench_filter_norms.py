"""Filter norms against a plain read (issue #14): ways to take ``‖W[o, i, :, :]‖₂`` of a 3×3
conv weight on this machine, each timed as the best of 15, in GB/s of the weight read.

* ``read``: ``w.sum()``, one pass over the weights (the floor a norm kernel is measured against);
* ``vector_norm``: ``torch.linalg.vector_norm(w.view(-1, 9), dim=-1, out=...)`` (what
  ``dtg_gpu.graph.plain_filter_norms`` did until session 12, and still does off CPU);
* ``native kernel (row_norms)``: ``dtg_gpu.graph.row_norms``, what ``plain_filter_norms`` does on
  CPU: the compiled kernel of ``dtg_gpu.graph.native`` (session 14) where it can be built;
* ``cdist to the origin``: ``torch.cdist(w.view(-1, 9), zeros(1, 9))`` in its direct mode
  (``row_norms`` in sessions 12–13, and still where the compiled kernel is off or unavailable);
* ``einsum``: ``torch.einsum("mk,mk->m", w, w)`` then ``sqrt``;
* ``mul + sum``: the squares into a preallocated buffer, then ``sum(-1)``;
* ``chunked mul + sum``: the same through a cache-sized buffer, 32,768 rows at a time;
* ``square + mv``: ``torch.mv(w.square(), ones(9))``;
* with ``--inductor`` (needs a C++ compiler; not used by the library): ``torch.compile`` of
  ``sqrt((y * y).sum(1))`` on 16-row tiles ``w.view(-1, 16, 9).transpose(1, 2)``, the
  fastest form of the ones tried, as a ceiling for what generated code reaches here.

Then the same three kernels over row lengths 2…400 (the same 37.7 MB, float32 and float64), which
is how ``row_norms`` chooses: the compiled kernel for every row length of two or more.

Then the products with a filter-norm block ``B [G, out, in]`` that a Lanczos step takes,
``B x`` and ``Bᵀ y``: ``B x`` as a batched matrix × column vector, as ``xᵀ Bᵀ`` through the
transposed *view* (what ``BlockOperator`` does on CPU), and as ``xᵀ`` times a transposed
contiguous copy (``BlockOperator(transposed_copy=True)``), with the copy's own cost and the
number of products after which it pays. Last, ``analyze`` end to end on CIFAR VGG checkpoints
both ways (the engine's operator patched to make the copy), with the norms by ``cdist`` (the
compiled kernel patched out) and by ``vector_norm``, and with the chunks as before 2026-12-04 (about four per call, so 3-graph batches for a
10-checkpoint VGG-16 run: ``MIN_CHUNK_GRAPHS`` patched to 1), alternated three times.

Usage: python benchmarks/bench_filter_norms.py [--out benchmarks/results] [--threads 2] [--inductor]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.graph import row_norms  # noqa: E402
from dtg_gpu.graph.native import native_status  # noqa: E402


def _best(f, reps: int = 15) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--inductor", action="store_true", help="add a torch.compile row (compiles C++ first)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    w = torch.randn(4, 512, 512, 3, 3)  # 4 checkpoints of VGG-16's largest conv
    v = w.view(-1, 9)
    m = v.shape[0]
    out, sq, buf, ones = torch.empty(m), torch.empty_like(v), torch.empty(32768, 9), torch.ones(9)

    def chunked():
        for s in range(0, m, buf.shape[0]):
            e = min(m, s + buf.shape[0])
            torch.mul(v[s:e], v[s:e], out=buf[: e - s])
            torch.sum(buf[: e - s], -1, out=out[s:e])
        out.sqrt_()

    def mul_sum():
        torch.mul(v, v, out=sq)
        torch.sum(sq, -1, out=out)
        out.sqrt_()

    ways = {
        "read": lambda: w.sum(),
        "vector_norm": lambda: torch.linalg.vector_norm(v, dim=-1, out=out),
        "native kernel (row_norms)": lambda: row_norms(v, out=out),
        "cdist to the origin": lambda: torch.cdist(v, v.new_zeros(1, 9), compute_mode="donot_use_mm_for_euclid_dist"),
        "einsum": lambda: torch.einsum("mk,mk->m", v, v).sqrt_(),
        "mul + sum": mul_sum,
        "chunked mul + sum": chunked,
        "square + mv": lambda: torch.mv(v.square(), ones).sqrt_(),
    }
    if a.inductor:
        tiles = torch.compile(lambda x: torch.sqrt((x * x).sum(1)), dynamic=False)
        ways["torch.compile, 16-row tiles (not shipped)"] = lambda: tiles(v.view(-1, 16, 9).transpose(1, 2))
    status = native_status()
    print(status, flush=True)
    gb = w.numel() * w.element_size() / 1e9
    rows = []
    for name, f in ways.items():
        t = _best(f)
        rows.append({"way": name, "ms": round(t * 1e3, 3), "GB/s": round(gb / t, 1)})
        print(f"{name:20s} {t * 1e3:8.2f} ms {gb / t:7.1f} GB/s", flush=True)
    read = rows[0]["ms"]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on cpu ({a.threads} threads), torch {torch.__version__}: "
        f"norms of {m:,} 3×3 kernel slices ({gb * 1e3:.1f} MB). `python benchmarks/bench_filter_norms.py`. "
        f"Row norms: {status}.",
        "",
        "| way | ms | GB/s | × read |",
        "|---|---|---|---|",
    ] + [f"| {r['way']} | {r['ms']} | {r['GB/s']} | {r['ms'] / read:.1f} |" for r in rows]
    lengths = row_lengths()
    lines += [
        "",
        "Row lengths (the same 37.7 MB as `[rows, k]`; time as × a read of it, best of 11):",
        "",
        "| dtype | k | read ms | native kernel | cdist | vector_norm |",
        "|---|---|---|---|---|---|",
    ] + [
        f"| {r['dtype']} | {r['k']} | {r['read_ms']} | {r['native']} | {r['cdist']} | {r['vector_norm']} |"
        for r in lengths
    ]
    products = product_forms()
    lines += [
        "",
        "Products with a block `B [G, out, in]` (ms, best of 15): `B x` as matrix × column, as `xᵀ Bᵀ` on the "
        "transposed view (BlockOperator on CPU), as `xᵀ` × a transposed contiguous copy; the copy's cost; "
        "after how many products the copy pays (`copy / (view - with copy)`).",
        "",
        "| G × out × in | dtype | column | view | with copy | copy | copy pays after |",
        "|---|---|---|---|---|---|---|",
    ] + [
        f"| {r['shape']} | {r['dtype']} | {r['column']} | {r['view']} | {r['with_copy']} | {r['copy']} | "
        f"{r['pays_after']} |"
        for r in products
    ]
    ends = end_to_end()
    lines += [
        "",
        "`analyze` end to end (ms per graph, best of 3 alternated runs; random-walk checkpoints of CIFAR VGG): "
        "products on the transposed view against a transposed copy per block, and (view) with the filter norms "
        "taken by `cdist` as on 2026-12-04 and by `vector_norm` as before them instead of the compiled kernel, "
        "and (view) in about four chunks per "
        "call as before 2026-12-04 (`MIN_CHUNK_GRAPHS` = 1: chunks of 3, 3, 3, 1 graphs for VGG-16 at T = 10); "
        "max |Δ centrality| between view and copy.",
        "",
        "| model | T | dtype | view | copy | view, cdist norms | view, vector_norm norms | view, four chunks "
        "| max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ] + [
        f"| {r['model']} | {r['T']} | {r['dtype']} | {r['view']} | {r['copy']} | {r['cdist']} | "
        f"{r.get('vector_norm', '–')} | "
        f"{r.get('four_chunks', '–')} | {r['max_abs_diff']:.1e} |"
        for r in ends
    ]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = {"row_norms": status, "norms": rows, "row_lengths": lengths, "products": products, "analyze": ends}
    atomic_write(out_dir / "filter_norms_cpu.json", json.dumps(saved, indent=2))
    atomic_write(out_dir / "filter_norms_cpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def row_lengths() -> list[dict]:
    """``row_norms`` (the compiled kernel), ``cdist`` and ``vector_norm`` on ``[rows, k]``, as × a read."""
    import dtg_gpu.graph.native as native

    if native.native_status().startswith("native"):
        assert native.native_row_norms(torch.ones(1, 2), torch.empty(1))  # the row below is the kernel
    rows = []
    for dtype in (torch.float32, torch.float64):
        for k in (2, 4, 9, 16, 25, 49, 64, 400, 3136):
            x = torch.randn(4 * 512 * 512 * 9 // k, k, dtype=dtype)
            out = torch.empty(x.shape[0], dtype=dtype)
            zero = x.new_zeros(1, k)
            read = _best(lambda: x.sum(), 11)
            times = {
                "native": _best(lambda: row_norms(x, out=out), 11),
                "cdist": _best(lambda: torch.cdist(x, zero, compute_mode="donot_use_mm_for_euclid_dist"), 11),
                "vector_norm": _best(lambda: torch.linalg.vector_norm(x, dim=-1, out=out), 11),
            }
            rows.append(
                {"dtype": str(dtype).removeprefix("torch."), "k": k, "read_ms": round(read * 1e3, 3)}
                | {n: round(t / read, 2) for n, t in times.items()}
            )
            print(rows[-1], flush=True)
    return rows


def product_forms() -> list[dict]:
    """``B x`` three ways on the block shapes of LeNet-5 (T = 1,920 graphs of a sweep), CIFAR
    VGG (512 × 512, 4096 × 512) and a classifier (10 × 4096)."""
    rows = []
    for dtype in (torch.float32, torch.float64):
        for shape in [(1920, 120, 400), (10, 512, 512), (50, 512, 512), (10, 4096, 512), (10, 10, 4096)]:
            g = torch.Generator().manual_seed(0)
            b = torch.rand(*shape, generator=g, dtype=dtype)
            bt = b.mT.contiguous()
            x = torch.rand(shape[0], shape[2], generator=g, dtype=dtype)
            column = _best(lambda: torch.bmm(b, x.unsqueeze(-1)))
            view = _best(lambda: torch.bmm(x.unsqueeze(1), b.mT))
            with_copy = _best(lambda: torch.bmm(x.unsqueeze(1), bt))
            copy = _best(lambda: b.mT.contiguous())
            pays = copy / (view - with_copy) if view > with_copy else float("inf")
            rows.append(
                {
                    "shape": " × ".join(map(str, shape)),
                    "dtype": str(dtype).removeprefix("torch."),
                    "column": round(column * 1e3, 3),
                    "view": round(view * 1e3, 3),
                    "with_copy": round(with_copy * 1e3, 3),
                    "copy": round(copy * 1e3, 3),
                    "pays_after": round(pays) if pays != float("inf") else "never",
                }
            )
            print(rows[-1], flush=True)
    return rows


def _vector_norm(w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return torch.linalg.vector_norm(w, dim=-1, out=out)


def end_to_end() -> list[dict]:
    """``analyze`` with products on the transposed view (the default) and with a transposed
    copy of every block (the engine's ``BlockOperator`` patched), alternated."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_centrality import build_model

    import dtg_gpu
    import dtg_gpu.engine.plan as plan
    import dtg_gpu.engine.solve as engine
    import dtg_gpu.graph.norms as graph

    made, fast, min_graphs, native = (
        engine.BlockOperator,
        graph.row_norms,
        plan.MIN_CHUNK_GRAPHS,
        graph.native_row_norms,
    )
    rows = []
    for name, t in (("vgg16", 10), ("vgg11", 50)):
        model = build_model(name)
        g = torch.Generator().manual_seed(0)
        ckpts = [
            {
                k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                for k, v in model.state_dict().items()
            }
            for _ in range(t)
        ]
        run = dtg_gpu.Run(model=model, checkpoints=ckpts)
        for dtype in (torch.float32, torch.float64):
            dtg_gpu.analyze(dtg_gpu.Run(model=model, checkpoints=ckpts[:1]), device="cpu", dtype=dtype)
            times: dict[str, list[float]] = {"view": [], "copy": [], "cdist": [], "vector_norm": [], "four_chunks": []}
            cent = {}
            for _ in range(3):
                for mode in times:
                    engine.BlockOperator = (  # type: ignore[misc]
                        (lambda *a, **k: made(*a, transposed_copy=True, **k)) if mode == "copy" else made
                    )
                    if mode == "cdist":  # the norms as in sessions 12-13 (no compiled kernel)
                        graph.native_row_norms = lambda m, out: False
                    if mode == "vector_norm":  # the norms as before session 12
                        graph.row_norms = _vector_norm
                    if mode == "four_chunks":  # the chunks as before session 13
                        plan.MIN_CHUNK_GRAPHS = 1
                    try:
                        s = time.perf_counter()
                        cent[mode] = dtg_gpu.analyze(run, device="cpu", dtype=dtype).centrality
                        times[mode].append((time.perf_counter() - s) / t)
                    finally:
                        engine.BlockOperator = made  # type: ignore[misc]
                        graph.row_norms = fast
                        graph.native_row_norms = native
                        plan.MIN_CHUNK_GRAPHS = min_graphs
            rows.append(
                {
                    "model": f"cifar_{name}",
                    "T": t,
                    "dtype": str(dtype).removeprefix("torch."),
                    "view": round(min(times["view"]) * 1e3, 2),
                    "copy": round(min(times["copy"]) * 1e3, 2),
                    "cdist": round(min(times["cdist"]) * 1e3, 2),
                    "vector_norm": round(min(times["vector_norm"]) * 1e3, 2),
                    "four_chunks": round(min(times["four_chunks"]) * 1e3, 2),
                    "max_abs_diff": float((cent["view"] - cent["copy"]).abs().max()),
                }
            )
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
