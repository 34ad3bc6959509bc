"""Choose the default predictor leave one sweep out, over several k at once.

Reads the cells `bench_suite.py` scored (`ROOT/scores-r100.json` for k = 25 %,
`scores-r100-f0.5.json`, `scores-r100-f1.json`) and, for every held-out sweep, picks among
the candidate defaults the one with the best mean rank (precision and AUC, every fraction) on
the *other* sweeps; the choice is then scored on the held-out sweep at every fraction. Also,
for each candidate: the issue's goal cells at k = 25 % (as `bench_suite.py` counts them) and
the cells lost to the seed's method at each fraction (mean below the seed's lower bound).

    python benchmarks/bench_default_choice.py --root ROOT

Writes `benchmarks/results/prediction_default_choice.{md,json}`. Nothing is trained here:
score the candidates first, e.g. `bench_suite.py --root ROOT --fraction F --only NAME`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_suite as bs  # noqa: E402

from dtg_gpu.core.files import atomic_write  # noqa: E402

FRACTIONS = (0.25, 0.5, 1.0)
METRICS = ("precision", "roc_auc")


def cache_name(fraction: float, repeats: int = 100) -> str:
    """`bench_suite.py`'s score cache of a fraction."""
    return f"scores-r{repeats}" + ("" if fraction == 0.25 else f"-f{fraction:g}") + ".json"


def tables(root: Path, fractions=FRACTIONS, repeats: int = 100) -> dict[float, dict[str, dict[str, dict]]]:
    """`{fraction: {sweep: {candidate: cell}}}` from the caches that exist."""
    out: dict[float, dict[str, dict[str, dict]]] = {}
    for f in fractions:
        path = root / cache_name(f, repeats)
        if not path.is_file():
            continue
        table: dict[str, dict[str, dict]] = {}
        for key, cell in json.loads(path.read_text()).items():
            sweep, cand = key.split("|", 1)
            table.setdefault(sweep, {})[cand] = cell
        out[f] = table
    return out


def mean_ranks(
    t: dict[float, dict[str, dict[str, dict]]], cands: list[str], sweeps: list[str], held: str | None = None
) -> dict[str, float]:
    """Each candidate's mean rank (0 = best) over the cells of `sweeps` but `held`: every
    fraction, precision and AUC, ranked by mean."""
    rank = {c: 0.0 for c in cands}
    n = 0
    for table in t.values():
        for s in sweeps:
            if s == held:
                continue
            for m in METRICS:
                order = sorted(cands, key=lambda c: -table[s][c][m]["mean"])
                for r, c in enumerate(order):
                    rank[c] += r
                n += 1
    return {c: rank[c] / max(n, 1) for c in cands}


def choose(t: dict[float, dict[str, dict[str, dict]]], cands: list[str], sweeps: list[str]) -> dict[str, dict]:
    """For each held-out sweep: the candidate with the best mean rank over the other sweeps'
    cells (every fraction, precision and AUC; ties to the earlier candidate), and its cells
    on the held-out sweep."""
    out = {}
    for held in sweeps:
        rank = mean_ranks(t, cands, sweeps, held)
        best = min(cands, key=lambda c: rank[c])
        out[held] = {
            "chosen": best,
            "mean_rank_elsewhere": rank,
            "held_out": {str(f): {m: t[f][held][best][m]["mean"] for m in METRICS} for f in t},
        }
    return out


def lost_to_seed(t: dict, cand: str) -> dict[str, list[str]]:
    """Per fraction: the (sweep, metric) cells where `cand`'s mean is below the seed's lower bound."""
    return {
        str(f): [
            f"{s} {m}"
            for s, row in table.items()
            for m in METRICS
            if bs.SEED in row and row[cand][m]["mean"] < row[bs.SEED][m]["ci_low"]
        ]
        for f, table in t.items()
    }


def goals_met(table: dict, cand: str) -> tuple[int, int, list[str]]:
    """`bench_suite`'s goal cells at k = 25 % for `cand` as the default: met, applicable, missed."""
    met = total = 0
    missed = []
    for s, row in table.items():
        for name, cell in zip(("precision", "AUC", "0.90 / 0.90"), bs.goal_cells(row, cand)):
            if cell is None:
                continue
            total += 1
            met += bool(cell)
            if not cell:
                missed.append(f"{s} {name}")
    return met, total, missed


def markdown(doc: dict, command: str) -> str:
    t, cands, sweeps = doc["cells"], doc["candidates"], doc["sweeps"]
    fr = list(t)
    lines = [
        "# The default, chosen leave one sweep out over several k",
        "",
        f"`{command}` ({doc['date']}), on the cells `bench_suite.py` scored (100 stratified 90/10 "
        "splits each, label at the sweep median). k as a share of each sweep's checkpoints: "
        + ", ".join(f"{float(f):.0%}" for f in fr)
        + ".",
        "",
        "## Precision / AUC of each candidate",
        "",
        "| sweep | k | " + " | ".join(c.replace("|", "/") for c in cands) + f" | {bs.SEED} |",
        "|---|---|" + "---|" * (len(cands) + 1),
    ]
    for s in sweeps:
        for f in fr:
            row = t[f][s]
            cells = [f"{row[c]['precision']['mean']:.3f} / {row[c]['roc_auc']['mean']:.3f}" for c in [*cands, bs.SEED]]
            lines.append(f"| {s} | {float(f):.0%} | " + " | ".join(cells) + " |")
    lines += ["", "## Leave one sweep out", ""]
    lines += [
        "For each sweep, the candidate with the best mean rank on the other sweeps (every k, "
        "precision and AUC), and what it gives on the held-out sweep:",
        "",
        "| held-out sweep | chosen | " + " | ".join(f"k = {float(f):.0%}" for f in fr) + " |",
        "|---|---|" + "---|" * len(fr),
    ]
    for s, ch in doc["leave_one_sweep_out"].items():
        cells = [f"{ch['held_out'][f]['precision']:.3f} / {ch['held_out'][f]['roc_auc']:.3f}" for f in fr]
        lines.append(f"| {s} | {ch['chosen']} | " + " | ".join(cells) + " |")
    counts = {c: sum(ch["chosen"] == c for ch in doc["leave_one_sweep_out"].values()) for c in cands}
    lines += ["", "Chosen on " + ", ".join(f"{n} of {len(sweeps)} folds: {c}" for c, n in counts.items()) + "."]
    rank = doc["mean_rank"]
    lines += [
        "",
        f"The rule on all {len(sweeps)} sweeps (what the default is chosen by): mean rank "
        + ", ".join(f"{rank[c]:.3f} {c}" for c in cands)
        + f" (0 = best of {len(cands)}); chosen: **{min(cands, key=lambda c: rank[c])}**.",
    ]
    lines += ["", "## Goals and the seed's method, per candidate", ""]
    lines += [
        "| candidate | goal cells met at k = 25 % | missed | cells lost to the seed's method |",
        "|---|---|---|---|",
    ]
    for c in cands:
        g = doc["goals"].get(c)
        goal = f"{g['met']}/{g['total']}" if g else "–"
        missed = ", ".join(g["missed"]) if g else "–"
        lost = "; ".join(f"k = {float(f):.0%}: " + (", ".join(v) or "none") for f, v in doc["lost_to_seed"][c].items())
        lines.append(f"| {c} | {goal} | {missed} | {lost} |")
    lines += [
        "",
        "Goal cells (issue #33, k = 25 %): precision and AUC at or above the best single data-free "
        "row's lower 95 % bound, and >= 0.90 / 0.90 where the hyper-parameter oracle reaches it. "
        "Lost to the seed's method: the candidate's mean below the lower 95 % bound of "
        '`features="spec"` + `PerformancePredictor.spec()`.',
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="the suite's folder (bench_suite.py's --root, with its score caches)")
    p.add_argument("--candidates", nargs="+", default=[bs.PREVIOUS, bs.EQUAL, bs.DEFAULT])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--stem", default="prediction_default_choice")
    p.add_argument(
        "--checks-root",
        default=None,
        help="also count the check sweeps (dtg_gpu.sweeps.CHECKS) scored under this folder: a what-if of the "
        "choice with them, since they were held out of it",
    )
    a = p.parse_args(argv)
    t = tables(Path(a.root))
    names = list(bs.SUITE)
    if a.checks_root:
        from dtg_gpu.sweeps.config import CHECKS

        for f, tab in tables(Path(a.checks_root)).items():
            if f in t:
                t[f].update({s: row for s, row in tab.items() if s in CHECKS})
        names += list(CHECKS)
    needed = [*a.candidates, bs.SEED]
    sweeps = [s for s in names if all(s in tab and all(c in tab[s] for c in needed) for tab in t.values())]
    if not t or not sweeps:
        p.error(f"no sweep has every candidate scored at every fraction in {a.root}")
    t = {f: {s: tab[s] for s in sweeps} for f, tab in t.items()}
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "candidates": a.candidates,
        "sweeps": sweeps,
        "cells": {str(f): tab for f, tab in t.items()},
        "leave_one_sweep_out": choose(t, a.candidates, sweeps),
        "mean_rank": mean_ranks(t, a.candidates, sweeps),
        "lost_to_seed": {c: lost_to_seed(t, c) for c in a.candidates},
        "goals": {},
    }
    quarter = t.get(0.25)
    if quarter and all(all(c in row for c in (bs.ORACLE, *bs.SINGLE_ROWS)) for row in quarter.values()):
        for c in a.candidates:
            met, total, missed = goals_met(quarter, c)
            doc["goals"][c] = {"met": met, "total": total, "missed": missed}
    command = shlex.join(
        ["python", "benchmarks/bench_default_choice.py", *(argv if argv is not None else sys.argv[1:])]
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"{a.stem}.json", json.dumps(doc, indent=1))
    atomic_write(out / f"{a.stem}.md", markdown(doc, command))
    for s, ch in doc["leave_one_sweep_out"].items():
        print(f"{s:26s} chose {ch['chosen']}")
    print(f"-> {out / f'{a.stem}.md'}")


if __name__ == "__main__":
    main()
