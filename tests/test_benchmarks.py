"""The suite benchmark's transfer table: a family is held out whole (no sweep of it seen)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_suite  # noqa: E402


def _sweep(seed: int, signal: float, n: int = 40, T: int = 8) -> dict:
    rng = np.random.default_rng(seed)
    acc = rng.uniform(0, 1, n)
    raw = rng.normal(size=(n, T, 5))
    lam = np.cumsum(rng.normal(0.1, 0.05, (n, T)), axis=1)
    lam[:, 1:] += signal * acc[:, None] * np.arange(1, T)  # runs that end better grow lambda_1 faster
    k = T // 4
    return {
        "k": np.array(k),
        "T": np.array(T),
        "acc": acc,
        "usable": np.ones(n, bool),
        "spec": rng.normal(size=(n, 5 * T)),
        "stats_raw": raw,
        "lam_raw": lam,
    }


def test_transfer_holds_out_a_whole_family_and_scores_each_of_its_sweeps():
    feats = {
        "lenet5-digits": _sweep(0, 1.0),
        "lenet5-shapes-adam": _sweep(1, 1.0),
        "vgg11-digits": _sweep(2, 1.0),
        "resnet20-digits": _sweep(3, 0.0),  # no signal: the score is at chance there
    }
    t = bench_suite.transfer(feats)
    rows = t["rows"]
    assert rows["lenet5-digits"]["family"] == "lenet5"
    assert sorted(rows["lenet5-digits"]["trained_on"]) == ["resnet20-digits", "vgg11-digits"]
    assert "lenet5-shapes-adam" not in rows["lenet5-shapes-adam"]["trained_on"]
    peer = "peer score alone (no training)"
    auc, lo, hi = rows["vgg11-digits"]["auc"][peer]
    assert auc > 0.9 and lo <= auc <= hi
    assert rows["resnet20-digits"]["auc"][peer][1] < 0.5  # its interval reaches below chance
    assert t["ship"][peer] is False  # not above chance on every held-out sweep: nothing shipped
    page = bench_suite.transfer_markdown(t, "2026-12-06", "python benchmarks/bench_suite.py --transfer")
    assert "resnet20-digits (resnet20)" in page and "no pretrained prior is shipped" in page


def test_auc_interval_matches_scikit_learn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 50)
    p = np.round(rng.normal(size=50) + y, 1)  # ties
    auc, lo, hi = bench_suite.auc_interval(y, p)
    assert abs(auc - roc_auc_score(y, p)) < 1e-12
    assert lo < auc < hi


def test_blend_gives_the_informative_set_the_weight():
    import bench_blend

    rng = np.random.default_rng(2)
    n = 80
    y = np.repeat([0, 1], n // 2)
    informative = rng.normal(size=(n, 4)) + 2.0 * y[:, None]
    noise = rng.normal(size=(n, 3))
    train, test = np.arange(0, n, 2), np.arange(1, n, 2)
    out = bench_blend.combine([informative, noise], y, train, test, seed=0)
    assert out["w_log_loss"] >= 0.75  # the informative block carries the weight
    assert out["w_auc"] >= 0.5  # (AUC saturates at 1: ties go to the smaller weight)
    assert set(out["probs"]) == set(bench_blend.ROWS)
    p = out["probs"]
    assert all(v.shape == (test.size,) and np.all((v >= 0) & (v <= 1)) for v in p.values())
    np.testing.assert_allclose(
        p["equal average (the default's rule)"], (p[bench_blend.ROWS[0]] + p[bench_blend.ROWS[1]]) / 2
    )


def test_a_page_of_some_rows_says_so_and_claims_no_goal():
    cell = {m: {"mean": 0.8, "ci_low": 0.7, "ci_high": 0.9} for m in ("precision", "roc_auc")}
    table = {"lenet5-digits": {bench_suite.DEFAULT: cell, "spec (seed: dtg, MLP)": cell}}
    doc = {"date": "2026-12-06", "repeats": 2, "table": table, "leave_one_sweep_out": {}, "only": ["spec", "default"]}
    feats = {"lenet5-digits": {"k": np.array(5), "T": np.array(20)}}
    page = bench_suite.markdown(doc, feats, "python benchmarks/bench_suite.py --only spec default")
    assert "Only the rows whose name contains one of 'spec', 'default' (`--only`)" in page
    assert "## Goals" not in page  # the goals compare against every single row and the oracle
    full = bench_suite.markdown({**doc, "only": None}, feats, "python benchmarks/bench_suite.py")
    assert "Only the rows" not in full
    # with the default, every single row and the oracle among them, the goals are claimed
    every = {c: cell for c in (bench_suite.DEFAULT, bench_suite.ORACLE, *bench_suite.SINGLE_ROWS)}
    page = bench_suite.markdown({**doc, "table": {"lenet5-digits": every}}, feats, "python benchmarks/bench_suite.py")
    assert "## Goals" in page and "| lenet5-digits | 0.800 vs" in page
    assert "## The goals for each candidate as the default" in page
    # the oracle (0.8 / 0.8) does not reach 0.90: two cells apply; each row ties the best one
    assert f"| {bench_suite.DEFAULT} | 2/2 | 2/2 |" in page
    worse = {**every, bench_suite.DEFAULT: {m: {"mean": 0.69, "ci_low": 0.6, "ci_high": 0.7} for m in cell}}
    assert bench_suite.goal_cells(worse, bench_suite.DEFAULT) == [False, False, None]
    oracle = {m: {"mean": 0.95, "ci_low": 0.9, "ci_high": 0.99} for m in cell}
    assert bench_suite.goal_cells({**every, bench_suite.ORACLE: oracle}, bench_suite.DEFAULT) == [True, True, False]
    del every[bench_suite.SINGLE_ROWS[-1]]
    assert bench_suite.goals({"lenet5-digits": every}) == []


def test_the_default_against_the_seed_is_lost_held_or_won_by_the_seeds_interval():
    def cell(mean, lo, hi):
        return {m: {"mean": mean, "ci_low": lo, "ci_high": hi} for m in ("precision", "roc_auc")}

    table = {
        "lenet5-digits": {bench_suite.DEFAULT: cell(0.90, 0.88, 0.92), bench_suite.SEED: cell(0.97, 0.96, 0.99)},
        "vgg11-digits": {bench_suite.DEFAULT: cell(0.90, 0.88, 0.92), bench_suite.SEED: cell(0.82, 0.79, 0.85)},
        "resnet20-digits": {bench_suite.DEFAULT: cell(0.80, 0.77, 0.83), bench_suite.SEED: cell(0.79, 0.76, 0.82)},
    }
    rows = {line.split(" | ")[0].strip("| "): line for line in bench_suite.versus_seed(table) if line.startswith("| ")}
    assert rows["lenet5-digits"].count(": lost") == 2
    assert rows["vgg11-digits"].count(": won") == 2
    assert rows["resnet20-digits"].count(": held") == 2
    # at k = T the page shows this comparison and not the goals (defined at k = 25 %)
    doc = {"date": "2026-12-07", "repeats": 2, "fraction": 1.0, "table": table, "leave_one_sweep_out": {}}
    feats = {s: {"k": np.array(20), "T": np.array(20)} for s in table}
    page = bench_suite.markdown(doc, feats, "python benchmarks/bench_suite.py --fraction 1")
    assert "k = 100 % of the checkpoints" in page and "## The default against the seed's method" in page
    assert "## Goals" not in page
    assert bench_suite.versus_seed({"lenet5-digits": {bench_suite.DEFAULT: cell(0.9, 0.8, 1.0)}}) == []


def test_mixed_heads_average_one_model_per_block():
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=80, n_features=6, random_state=0)
    mixed = bench_suite.Mixed((4, 2), ("lr", "mlp")).fit(X, y)
    p = mixed.predict_proba(X)
    lr = bench_suite.lr_q().fit(X[:, :4], y).predict_proba(X[:, :4])
    from dtg_gpu.predictor import PerformancePredictor

    mlp = PerformancePredictor.spec(random_state=0).fit(X[:, 4:], y).predict_proba(X[:, 4:])
    np.testing.assert_allclose(p, (lr + mlp) / 2, atol=1e-9)
    assert mixed.get_params() == {"widths": (4, 2), "kinds": ("lr", "mlp"), "C": 0.1}


def test_early_stopping_ranges_span_the_sweeps_that_have_every_row():
    import bench_early_stopping as es

    def row(S, Z, R):
        return {"saved_mean": S, "regret_zero_share": Z, "regret_mean": R}

    full = {m: row(0.6, 0.9, 0.001) for m in es.README_ROWS}
    other = {m: row(0.7, 1.0, 0.0) for m in es.README_ROWS} | {"MedianPruner": row(0.8, 0.5, 0.02)}
    partial = {"MedianPruner": row(0.1, 0.0, 0.5)}  # lacks the DTG rows: left out of every range
    results = {"sweeps": {"a": {"methods": full}, "b": {"methods": other}, "c": {"methods": partial}}}
    lines = es.ranges(results)
    assert lines[0] == "## Over the 2 sweeps (the README's table)"
    assert "| MedianPruner | 0.60–0.80 | 50%–90% | 0.0010–0.0200 |" in lines
    assert "| DTGPruner+val_accuracy, value_median=None | 0.60–0.70 | 90%–100% | 0.0000–0.0010 |" in lines
    assert es.ranges({"sweeps": {"c": {"methods": partial}}}) == []
    assert not any(es.COVARIATES in line for line in lines)  # no sweep has the covariates row
    # the covariates row joins the ranges only when every sweep has it; the goals count it
    both = {
        "a": {"methods": full | {es.COVARIATES: row(0.55, 1.0, 0.0)}},
        "b": {"methods": other | {es.COVARIATES: row(0.45, 0.95, 0.0001)}},
    }
    assert "| DTGPruner+covariates (data-free) | 0.45–0.55 | 95%–100% | 0.0000–0.0001 |" in es.ranges({"sweeps": both})
    for m in both.values():
        for r in m["methods"].values():
            r.update(orderings=20, saved_ci95=0.01, regret_ci95=0.001)
    g = es.goals({"sweeps": both})
    # the goal rows are the default's (covariates="auto": the covariates rows); the checkpoints
    # alone (covariates=None) in the last column
    a, b = (next(line for line in g if line.startswith(f"| {n} |")) for n in "ab")
    assert a.startswith("| a | 100% [84%, 100%] | 0.550 ± 0.010 | met |") and a.endswith("| 90% / 0.600 (missed) |")
    assert b.startswith("| b | 95% [76%, 99%] | 0.450 ± 0.010 | missed |") and b.endswith("| 100% / 0.700 (met) |")
    assert g[-2] == "Met: data-free 1 of 2 sweeps; with the value 1 of 2; data-free from the checkpoints alone 1 of 2."
    # the with-value pruner as it ships (value_leader) is the goal row where replayed
    both["b"]["methods"][es.DEFAULT_VALUE] = row(0.9, 0.5, 0.0) | {"orderings": 20, "saved_ci95": 0, "regret_ci95": 0}
    b = next(line for line in es.goals({"sweeps": both}) if line.startswith("| b |"))
    assert "| 0.900 ± 0.000 / 0.0000 ± 0.0000 | 0.800 ± 0.010 / 0.0200 ± 0.0010 | met |" in b
    # the data-free pruner as it ships (novelty guard) is the data-free goal row where replayed
    both["b"]["methods"][es.DEFAULT_FREE] = row(0.52, 1.0, 0.0) | {"orderings": 20, "saved_ci95": 0, "regret_ci95": 0}
    b = next(line for line in es.goals({"sweeps": both}) if line.startswith("| b |"))
    assert b.startswith("| b | 100% [84%, 100%] | 0.520 ± 0.000 | met |")
    both["b"]["methods"].pop(es.DEFAULT_FREE)
    both["b"]["methods"].pop(es.DEFAULT_VALUE)
    both["b"]["methods"].pop(es.COVARIATES)
    assert not any(es.COVARIATES in line for line in es.ranges({"sweeps": both}))
    # a page replayed before the covariates rows: the goals fall back to the rows without, and say so
    old = es.goals({"sweeps": {"b": both["b"]}})
    assert "this page was replayed before they existed" in old[2] and old[-2].endswith("with the value 0 of 1.")


def test_approximate_leave_one_out_matches_refitting_without_each_run():
    """The pruner-variants benchmark's closed-form LOO (one Newton step) against real refits."""
    import bench_pruner_variants as V
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    for n, d in ((30, 60), (60, 8)):  # more features than runs (the pruner's case), and fewer
        X = rng.normal(size=(n, d))
        y = (X[:, 0] + rng.normal(size=n) > 0).astype(int)
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000)).fit(X, y)
        approx = V.loo_probabilities(clf, X, y, 1.0)
        exact = np.array(
            [clone(clf).fit(np.delete(X, i, 0), np.delete(y, i)).predict_proba(X[i : i + 1])[0, 1] for i in range(n)]
        )
        full = clf.predict_proba(X)[:, 1]
        err = np.abs(approx - exact)
        assert err.mean() < 0.03 and err.max() < 0.2, (n, d, err.mean(), err.max())
        assert np.abs(approx - exact).mean() < 0.5 * np.abs(full - exact).mean()  # closer than the full fit


def test_pruner_variants_table_marks_only_cells_that_meet_both_goals():
    import bench_pruner_variants as V

    row = {"regret_zero_share": 1.0}
    rows = [
        {"sweep": "a", "variant": "shipped", "saved_mean": 0.55} | row,
        {"sweep": "b", "variant": "shipped", "saved_mean": 0.45} | row,
        {"sweep": "a", "variant": "C=0.1", "saved_mean": 0.60, "regret_zero_share": 0.9},
    ]
    page = V.table(rows, 10, "2026-12-07")
    assert "| shipped | **0.550 / 100%** | 0.450 / 100% | 1 of 2 |" in page
    assert "| C=0.1 | 0.600 / 90% | – | 0 of 2 |" in page
    assert "Met on 1 of 2 held-out sweeps" in page  # C=0.1 lacks sweep b: only shipped competes


def test_pruner_variant_is_chosen_without_the_sweep_it_is_scored_on():
    import bench_pruner_variants as V

    def r(sweep, variant, s, keep):
        return {"sweep": sweep, "variant": variant, "saved_mean": s, "regret_zero_share": keep}

    rows = [r("a", "shipped", 0.6, 1.0), r("b", "shipped", 0.4, 1.0), r("c", "shipped", 0.6, 0.5)]
    rows += [r("a", "gate", 0.6, 1.0), r("b", "gate", 0.6, 1.0), r("c", "gate", 0.4, 1.0)]
    # shipped meets a; gate meets a and b. Held out a: 0 vs 1 -> gate; b: 1 vs 1 -> shipped (tie);
    # c: 1 vs 2 -> gate
    assert V.leave_one_sweep_out(rows) == {"a": "gate", "b": "shipped", "c": "gate"}


def _cell(p: float, a: float, low: float = 0.02) -> dict:
    return {
        "precision": {"mean": p, "ci_low": p - low, "ci_high": p + low},
        "roc_auc": {"mean": a, "ci_low": a - low, "ci_high": a + low},
    }


def test_default_choice_never_sees_the_held_out_sweep_and_counts_losses_to_the_seed(tmp_path):
    import json

    import bench_default_choice as bdc

    A, B, S = bench_suite.PREVIOUS, bench_suite.DEFAULT, bench_suite.SEED
    sweeps = ["lenet5-digits", "vgg11-digits", "resnet20-digits"]
    # A wins only on lenet5-digits (by far), B on the other two; the seed beats A on vgg11-digits at k = T
    value = {"lenet5-digits": (0.99, 0.5), "vgg11-digits": (0.6, 0.7), "resnet20-digits": (0.6, 0.7)}
    for f in bdc.FRACTIONS:
        cells = {}
        for s in sweeps:
            a, b = value[s]
            seed = 0.9 if (s == "vgg11-digits" and f == 1.0) else 0.5
            cells[f"{s}|{A}"], cells[f"{s}|{B}"], cells[f"{s}|{S}"] = _cell(a, a), _cell(b, b), _cell(seed, 0.5)
        (tmp_path / bdc.cache_name(f)).write_text(json.dumps(cells))
    bdc.main(["--root", str(tmp_path), "--out", str(tmp_path / "out"), "--candidates", A, B])
    doc = json.loads((tmp_path / "out" / "prediction_default_choice.json").read_text())
    chosen = {s: v["chosen"] for s, v in doc["leave_one_sweep_out"].items()}
    # held out lenet5-digits: B wins the other two; held out either other sweep: one each, the tie to A
    assert chosen == {"lenet5-digits": B, "vgg11-digits": A, "resnet20-digits": A}
    assert doc["leave_one_sweep_out"]["lenet5-digits"]["held_out"]["1.0"]["precision"] == 0.5
    assert doc["lost_to_seed"][A]["1.0"] == ["vgg11-digits precision"] and doc["lost_to_seed"][A]["0.25"] == []
    assert doc["goals"] == {}  # no single rows or oracle scored: no goal claimed
    md = (tmp_path / "out" / "prediction_default_choice.md").read_text()
    assert "Chosen on 2 of 3 folds" in md
    # the rule on every sweep, what the default is chosen by: B ranks first on 2 of the 3 sweeps
    assert doc["mean_rank"] == pytest.approx({A: 4 / 6, B: 2 / 6})
    assert f"chosen: **{B}**" in md


def test_a_check_sweep_outside_the_suite_is_scored_by_name(tmp_path):
    """`--sweeps NAME`: a folder under --root that is no preset (a held-out check sweep) is
    featurised and scored; the suite's presets are not looked for."""
    import json

    from dtg_gpu.sweeps import SweepConfig, run_sweep

    cfg = SweepConfig(model="lenet5", lrs=(0.003, 0.3), dropouts=(0.0,), seeds=3, epochs=4)
    run_sweep(cfg, tmp_path / "my-check", progress=False, device="cpu")
    bench_suite.main(
        ["--root", str(tmp_path), "--sweeps", "my-check", "--repeats", "3", "--only", "library default"]
        + ["--out", str(tmp_path / "out"), "--stem", "check"]
    )
    doc = json.loads((tmp_path / "out" / "check.json").read_text())
    assert list(doc["table"]) == ["my-check"] and list(doc["table"]["my-check"]) == [bench_suite.DEFAULT]
    assert 0 <= doc["table"]["my-check"][bench_suite.DEFAULT]["roc_auc"]["mean"] <= 1
    assert (tmp_path / "my-check.features.npz").is_file()
    assert "--sweeps my-check" in (tmp_path / "out" / "check.md").read_text()


def test_default_choice_counts_check_sweeps_only_when_asked(tmp_path):
    """`--checks-root`: the check sweeps' cells join the suite's (a what-if of the choice with
    them); without it the choice sees the suite only, even if a cache names a check sweep."""
    import json

    import bench_default_choice as bdc

    from dtg_gpu.sweeps.config import CHECKS

    A, B, S = bench_suite.PREVIOUS, bench_suite.DEFAULT, bench_suite.SEED
    suite, checks = tmp_path / "suite", tmp_path / "checks"
    for root, names in ((suite, ["lenet5-digits", "vgg11-digits", CHECKS[0]]), (checks, list(CHECKS))):
        root.mkdir()
        for f in bdc.FRACTIONS:
            cells = {f"{s}|{c}": _cell(0.8, 0.8) for s in names for c in (A, B, S)}
            (root / bdc.cache_name(f)).write_text(json.dumps(cells))
    args = ["--root", str(suite), "--out", str(tmp_path / "out"), "--candidates", A, B]
    bdc.main(args)
    assert json.loads((tmp_path / "out" / "prediction_default_choice.json").read_text())["sweeps"] == [
        "lenet5-digits",
        "vgg11-digits",
    ]
    bdc.main(args + ["--checks-root", str(checks)])
    doc = json.loads((tmp_path / "out" / "prediction_default_choice.json").read_text())
    assert doc["sweeps"] == ["lenet5-digits", "vgg11-digits", *CHECKS]
    assert set(doc["leave_one_sweep_out"]) == set(doc["sweeps"])


def test_pruner_ceiling_table_reads_its_rows_fresh_or_from_json():
    import json

    import bench_pruner_ceiling as C

    row = {
        "sweep": "s",
        "best": 0.99,
        "lead_samples": 1.0,
        "ceiling_p": 0.18,
        "cut_plain": {10: 0.58, 20: 0.6, 40: 0.64},
        "cut_guarded": {10: 0.5, 20: 0.6, 40: 0.64},
        "peer_share": 0.35,
        "first_p": 0.05,
    }
    line = "| s | 0.9900 | 1 | 0.18 | 58% / 50% | 60% / 60% | 64% / 64% | 0.05 | 0.35 |"
    assert line in C.table([row], "2026-12-08", 50)
    assert line in C.table(json.loads(json.dumps([row])), "2026-12-08", 50)  # keys "10", "20", "40"
