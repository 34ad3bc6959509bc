"""Filter norms against a plain read (issue #14): ways to take ``‖W[o, i, :, :]‖₂`` of a 3×3
conv weight on this machine, each timed as the best of 15, in GB/s of the weight read.

* ``read``: ``w.sum()``, one pass over the weights (the floor a norm kernel is measured against);
* ``vector_norm``: ``torch.linalg.vector_norm(w.view(-1, 9), dim=-1, out=...)`` (what
  ``dtg_gpu.graph.plain_filter_norms`` does);
* ``einsum``: ``torch.einsum("mk,mk->m", w, w)`` then ``sqrt``;
* ``mul + sum``: the squares into a preallocated buffer, then ``sum(-1)``;
* ``chunked mul + sum``: the same through a cache-sized buffer, 32,768 rows at a time;
* ``square + mv``: ``torch.mv(w.square(), ones(9))``.

Usage: python benchmarks/bench_filter_norms.py [--out benchmarks/results] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


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
        "einsum": lambda: torch.einsum("mk,mk->m", v, v).sqrt_(),
        "mul + sum": mul_sum,
        "chunked mul + sum": chunked,
        "square + mv": lambda: torch.mv(v.square(), ones).sqrt_(),
    }
    gb = w.numel() * w.element_size() / 1e9
    rows = []
    for name, f in ways.items():
        t = _best(f)
        rows.append({"way": name, "ms": round(t * 1e3, 3), "GB/s": round(gb / t, 1)})
        print(f"{name:20s} {t * 1e3:8.2f} ms {gb / t:7.1f} GB/s", flush=True)
    read = rows[0]["ms"]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on cpu ({a.threads} threads), torch {torch.__version__}: "
        f"norms of {m:,} 3×3 kernel slices ({gb * 1e3:.1f} MB). `python benchmarks/bench_filter_norms.py`.",
        "",
        "| way | ms | GB/s | × read |",
        "|---|---|---|---|",
    ] + [f"| {r['way']} | {r['ms']} | {r['GB/s']} | {r['ms'] / read:.1f} |" for r in rows]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "filter_norms_cpu.json").write_text(json.dumps(rows, indent=2))
    (out_dir / "filter_norms_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
