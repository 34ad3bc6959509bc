"""Do two revisions of dtg_gpu give the same numbers on recorded sweeps? (issue #21: "the
benchmark numbers are reproduced after the change").

For each sweep folder, each revision (a ``git worktree`` of ``REV``, and this work tree)
computes in its own process, with the feature cache off:
* every feature set of the prediction benchmark (``dtg``, ``weight_stats``, ``spectral``,
  ``dtg+weight_stats``, ``dtg+eigenvalue``, ``dtg_per_layer``, ``dtg_per_layer+eigenvalue``,
  ``learning_curve``) at k in {1, 3, 5, all};
* ``compare(...)`` at k = 5, median label, 10 splits: the precision / AUC the benchmark tables
  report;
* the early-stopping checkpoint records of three runs (``early_stopping.run_records``);
* ``featurize`` (the default recipe and ``features="spec"``) at k in {2, all} and ``analyze``
  of one run: the public entry points, whatever path they take to the solver.
Then it prints, per sweep, whether each is identical, and the largest difference where not.

Usage: python benchmarks/compare_revisions.py REV SWEEP [SWEEP ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

DUMP = r"""
import pickle, sys, warnings
import numpy as np
import dtg_gpu
assert dtg_gpu.__file__.startswith(sys.argv[3]), f"imported {dtg_gpu.__file__}, not the tree in {sys.argv[3]}"
warnings.simplefilter("ignore")
from dtg_gpu.early_stopping import run_records
from dtg_gpu.sweeps import load_sweep
from dtg_gpu.workflow import compare, feature_sets, featurize_sweep
folder, out = sys.argv[1], sys.argv[2]
runs = load_sweep(folder)
sf = featurize_sweep(runs, alpha=0.5, cache=False)
names = ["dtg", "weight_stats", "spectral", "dtg+weight_stats", "dtg+eigenvalue", "dtg_per_layer",
         "dtg_per_layer+eigenvalue", "learning_curve"]
res = {"accuracies": np.asarray(sf.accuracies), "usable": np.asarray(sf.usable)}
for k in sorted({1, 3, 5, sf.timesteps}):
    for n, X in feature_sets(sf, k, names).items():
        res[f"{n}@{k}"] = np.asarray(X)
rows = compare(sf, [5], names, threshold="median", repeats=10)
res["scores"] = [(r["features"], r["scores"]["precision"]["mean"], r["scores"]["roc_auc"]["mean"]) for r in rows]
res["records"] = [run_records(runs[i], device="cpu") for i in (0, len(runs) // 2, len(runs) - 1)]
good = [r for r in runs if r.final_accuracy is not None][:8]
for k in sorted({2, sf.timesteps}):
    res[f"featurize default@{k}"] = np.asarray(dtg_gpu.featurize(good, timesteps=k, device="cpu"))
    res[f"featurize spec@{k}"] = np.asarray(dtg_gpu.featurize(good, timesteps=k, device="cpu", features="spec"))
a = dtg_gpu.analyze(runs[0], device="cpu")
res["analyze centrality"], res["analyze features"] = np.asarray(a.centrality), np.asarray(a.features)
pickle.dump(res, open(out, "wb"))
"""


def _strings(records) -> list[str]:
    """The text leaves of nested records (architecture keys), in order."""
    if isinstance(records, dict):
        return [s for k in sorted(records) for s in _strings(records[k])]
    if isinstance(records, list):
        return [s for v in records for s in _strings(v)]
    return [records] if isinstance(records, str) else []


def _flat(records) -> np.ndarray:
    out: list[float] = []

    def walk(x):
        if isinstance(x, dict):
            for k in sorted(x):
                walk(x[k])
        elif isinstance(x, list):
            for v in x:
                walk(v)
        else:
            out.append(np.nan if x is None or isinstance(x, str) else float(x))  # strings: _strings

    walk(records)
    return np.array(out)


def dump(src: Path, folder: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_WAIT_POLICY": "PASSIVE"}
    # run from inside the tree: ``python -c`` puts the working directory first on sys.path
    subprocess.run(
        [sys.executable, "-c", DUMP, str(folder.resolve()), str(out), str(src)], env=env, check=True, cwd=src
    )
    with open(out, "rb") as f:
        return pickle.load(f)


def diff(a: dict, b: dict) -> list[str]:
    lines = []
    for key in a:
        if key == "scores":
            same = a[key] == b.get(key)
            worst = max(max(abs(x[1] - y[1]), abs(x[2] - y[2])) for x, y in zip(a[key], b[key]))
            lines.append(f"  scores (precision/AUC at k=5): {'identical' if same else f'max diff {worst:.3f}'}")
            continue
        if key == "records":  # fields one revision added (e.g. "folded") are left out
            common = [[{f: r[f] for f in r if f in q} for r, q in zip(ra, rb)] for ra, rb in zip(b[key], a[key])]
            x, y = _flat(a[key]), _flat(common)
            if _strings(a[key]) != _strings(common):
                lines.append(f"  {key}: text fields differ (architecture keys)")
        else:
            x, y = np.asarray(a[key], dtype=float), np.asarray(b.get(key), dtype=float)
        if x.shape != y.shape:
            lines.append(f"  {key}: shapes differ {x.shape} vs {y.shape}")
        elif not np.array_equal(x, y, equal_nan=True):
            both = np.isfinite(x) & np.isfinite(y)
            nan_same = np.array_equal(np.isnan(x), np.isnan(y))
            d = np.abs(x[both] - y[both])
            rel = d / np.maximum(np.abs(x[both]), 1e-30)
            lines.append(
                f"  {key}: max abs diff {d.max():.2e}, max rel {rel.max():.2e}"
                + ("" if nan_same else " (NaN in different places)")
            )
    if not any(not line.startswith("  scores") for line in lines):
        lines.insert(0, "  every feature set and early-stopping record: identical, bit for bit")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rev", help="the other revision (commit, tag, branch)")
    p.add_argument("sweeps", nargs="+", help="recorded sweep folders (dtg sweep --out)")
    p.add_argument("--work", default=None, help="where the worktree and dumps go (default: a temporary folder)")
    a = p.parse_args(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dtg-compare-"))
    tree = work / "worktree"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), a.rev], check=True)
    for folder in map(Path, a.sweeps):
        old = dump(tree.resolve(), folder, (work / f"old-{folder.name}.pkl").resolve())
        new = dump(ROOT, folder, (work / f"new-{folder.name}.pkl").resolve())
        print(f"{folder.name}: {a.rev} against the work tree")
        print("\n".join(diff(old, new)), flush=True)
    print(f"(worktree left in {tree}; remove with git worktree remove {tree})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
