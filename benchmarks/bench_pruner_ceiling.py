"""Why does the data-free pruner lose a sweep's best run? What its online model says of that run
with every other run finished, and with a few (issue #33).

For each recorded sweep (the records ``bench_early_stopping.py --suite`` caches), the shipped
data-free rule (``StoppingRule(use_values=False)``, the trials' lr and dropout as covariates) is
fitted on finished runs drawn from the sweep without its best run, and asked for the best run's
$P$ at its checkpoints 2, 3 and 4 (the first quarter of training, where a pruner saves most):

* *all others*: fitted on the other runs of the sweep, the most a study can know (the smallest
  $P$ over the three checkpoints). Below ``min_probability`` (0.3): the columns themselves say
  the best run is bad, and no amount of finished runs keeps it;
* *n = 10, 20, 40*: fitted on ``--draws`` random sets of n other runs, the share of sets in which
  the rule would stop the best run at one of the three checkpoints (P < 0.3), without and with
  the novelty guard (``novelty_guard``). The online model of a replayed study sees 10 finished
  runs when it starts deciding; the share at n = 10 is its risk then;
* *P at checkpoint 1*: the same as *all others*, at the first checkpoint alone (one snapshot, no
  trajectory; the warm start cannot decide there, the model can);
* *peer share*: the best run's smallest share of runs with a lower log-lambda growth over the
  three checkpoints (what the warm start decides on before 10 runs have finished).

A random set of other runs is not the set a study has finished (a study's finished runs are the
ones its pruner kept), so this is a diagnostic of the model, not a replay.

    python benchmarks/bench_pruner_ceiling.py --work WORK --root SWEEPS [--draws 20] [--stem NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_pruner_variants import pooled  # noqa: E402

from dtg_gpu.core.files import atomic_write  # noqa: E402
from dtg_gpu.early_stopping.rule import StoppingRule  # noqa: E402
from dtg_gpu.sweeps.config import CHECKS, SUITE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CHECKPOINTS = (2, 3, 4)
SIZES = (10, 20, 40)


def best_run_p(rule: StoppingRule, best: dict, others: list[tuple]) -> float | None:
    """The smallest P the rule gives the best run over `CHECKPOINTS`, fitted on `others`."""
    ps = [rule._learned(best["records"][:k], None, others, best.get("params")) for k in CHECKPOINTS]
    ps = [p for p in ps if p is not None]
    return min(ps) if ps else None


def run_one(job: tuple[str, str, str, int]) -> dict:
    import bench_early_stopping as B

    work, root, name, draws = job
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    sweep = B.with_params(json.loads((Path(work) / f"records-v2-{name}.json").read_text()), Path(root) / name)
    runs = sweep["runs"]
    finals = np.array([r["final"] for r in runs], dtype=float)
    b = int(np.nanargmax(finals))
    best = runs[b]
    others = [(r["name"], r["records"], None, r["final"], r.get("params")) for i, r in enumerate(runs) if i != b]
    levels = np.unique(finals[np.isfinite(finals)])
    one = float(np.diff(levels).min()) if len(levels) > 1 else 0.0
    gap = float(finals[b] - np.sort(finals[np.isfinite(finals)])[-2])
    plain, guarded = StoppingRule(use_values=False, novelty_guard=False), StoppingRule(use_values=False)
    ceiling = best_run_p(plain, best, others)
    first = plain._learned(best["records"][:1], None, others, best.get("params"))
    rng = np.random.default_rng(0)
    cut: dict[str, dict[int, float]] = {"plain": {}, "guarded": {}}
    for n in SIZES:
        stops = {"plain": 0, "guarded": 0}
        for _ in range(draws):
            sub = [others[i] for i in rng.choice(len(others), n, replace=False)]
            # the same two rules for every set: a fit is cached by its set of runs, and each
            # run's feature at a checkpoint is computed once
            for key, rule in (("plain", plain), ("guarded", guarded)):
                p = best_run_p(rule, best, sub)
                stops[key] += p is not None and p < rule.min_probability
        for key in stops:
            cut[key][n] = stops[key] / draws
    peers = [(r["name"], r["records"], None) for r in runs]
    shares = [guarded._peer_probability(best["records"][:k], None, peers) for k in CHECKPOINTS]
    shares = [s for s in shares if s is not None]
    return {
        "sweep": name,
        "runs": len(runs),
        "best": float(finals[b]),
        "lead_samples": gap / one if one > 0 else None,
        "ceiling_p": ceiling,
        "first_p": first,
        "cut_plain": cut["plain"],
        "cut_guarded": cut["guarded"],
        "peer_share": min(shares) if shares else None,
        "draws": draws,
        "seconds": time.perf_counter() - t0,
    }


def table(rows: list[dict], date: str, draws: int) -> str:
    lines = [
        f"# The data-free pruner's ceiling: what its model says of a sweep's best run ({date})",
        "",
        f"`python benchmarks/bench_pruner_ceiling.py --work WORK --root SWEEPS --draws {draws}` on the records "
        "`bench_early_stopping.py --suite` cached (the suite's sweeps, then the check sweeps). The shipped "
        "data-free rule (lr and dropout as covariates) asked for the best run's P at its checkpoints 2–4 "
        "(the smallest of the three): fitted on all the other runs, and on "
        f"{draws} random sets of n other runs (share of sets that would stop it, P < 0.3: without / with the "
        "novelty guard). *Lead*: the best run's final accuracy over the runner-up's, in test samples (1: the "
        "smallest step between two runs' accuracies). *Peer share*: its smallest share of runs with lower "
        "log-lambda growth at checkpoints 2–4 (the warm start's test, before 10 runs finish: stopped below 0.3). "
        "*P at checkpoint 1*: fitted on all other runs, at the first checkpoint alone. "
        "What each column means is in the script's docstring.",
        "",
        "| sweep | best final | lead | P, all others | stopped, n = 10 | n = 20 | n = 40 | P at checkpoint 1, all others | peer share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, g = r["cut_plain"], r["cut_guarded"]

        def cell(n: int) -> str:  # keys are ints in memory, strings once read back from JSON
            return f"{c.get(n, c.get(str(n))):.0%} / {g.get(n, g.get(str(n))):.0%}"

        lead = "–" if r["lead_samples"] is None else f"{r['lead_samples']:.0f}"
        ceil = "–" if r["ceiling_p"] is None else f"{r['ceiling_p']:.2f}"
        peer = "–" if r["peer_share"] is None else f"{r['peer_share']:.2f}"
        one = "–" if r.get("first_p") is None else f"{r['first_p']:.2f}"
        lines.append(
            f"| {r['sweep']} | {r['best']:.4f} | {lead} | {ceil} | {cell(10)} | {cell(20)} | {cell(40)} | {one} | {peer} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--work", nargs="+", required=True, help="bench_early_stopping's records caches (records-v2-NAME.json)"
    )
    ap.add_argument(
        "--root", nargs="+", required=True, help="the folders holding the sweeps (for each run's lr and dropout)"
    )
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--stem", default="pruner_ceiling")
    a = ap.parse_args()
    jobs = []
    for name in (*SUITE, *CHECKS):
        work = next((w for w in a.work if (Path(w) / f"records-v2-{name}.json").exists()), None)
        root = next((r for r in a.root if (Path(r) / name).is_dir()), None)
        if work and root:
            jobs.append((work, root, name, a.draws))
    if not jobs:
        ap.error("no sweep has both its records (--work) and its folder (--root)")
    rows = pooled(
        run_one,
        jobs,
        a.jobs,
        lambda r: (
            f"{r['sweep']:>24} P(all others) {r['ceiling_p']}  stopped n=10/20/40 plain {r['cut_plain']} "
            f"guarded {r['cut_guarded']}  peer {r['peer_share']}  ({r['seconds']:.0f} s)"
        ),
    )
    date = time.strftime("%Y-%m-%d %H:%M")
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write(RESULTS / f"{a.stem}.json", json.dumps({"date": date, "draws": a.draws, "rows": rows}, indent=1))
    atomic_write(RESULTS / f"{a.stem}.md", table(rows, date, a.draws))


if __name__ == "__main__":
    main()
