"""The HTML report a user acts on: every run with its out-of-fold P(sufficient) and verdict."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from dtg_gpu import label_runs
from dtg_gpu.cli.main import main
from dtg_gpu.sweeps import SweepConfig, load_sweep
from dtg_gpu.workflow import default_predictor, feature_sets, featurize_sweep, run_verdicts


@pytest.fixture(scope="module")
def sweep(trained_sweep):
    cfg = SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.002, 0.02, 0.3),
        dropouts=(0.0, 0.5),
        seeds=2,
        epochs=1,
        checkpoint_every=5,
        checkpoint_unit="step",
    )
    return trained_sweep(cfg)


def test_verdicts_are_out_of_fold(sweep):
    sf = featurize_sweep(load_sweep(sweep), device="cpu")
    v = run_verdicts(sf, [2, 4], seed=0)
    y = label_runs(sf.accuracies, "median")
    assert v["label"].tolist() == y.tolist()
    assert v["threshold"] == pytest.approx(float(np.median(sf.accuracies)))
    for j, k in enumerate([2, 4]):  # each run predicted by a model fitted without it
        X = feature_sets(sf, k, ["default"])["default"]
        expected = np.empty(len(y))
        for train, test in StratifiedKFold(5, shuffle=True, random_state=0).split(X, y):
            clf = default_predictor(sf, X.shape[1], random_state=0)
            expected[test] = clf.fit(X[train], y[train]).predict_proba(X[test])[:, 1]
        np.testing.assert_allclose(v["proba"][:, j], expected)


def test_evaluate_writes_a_sortable_report_of_every_run(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert (
        main(["evaluate", str(sweep), "--timesteps", "3", "--repeats", "2", "--device", "cpu", "--report", str(out)])
        == 0
    )
    page = (out / "index.html").read_text()
    start = page.index('<table class="sortable">')
    table = page[start : page.index("</table>", start)]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table)
    assert len(rows) == 1 + 12
    for row in rows[1:]:
        cells = re.findall(r'data-v="([^"]*)"[^>]*>([^<]*)<', row)
        p, verdict = float(cells[-2][0]), cells[-1][1]
        assert 0 <= p <= 1 and verdict == ("continue" if p >= 0.3 else "stop")  # as dtg watch / predict
    assert "P(sufficient) k=3" in table and "addEventListener" in page
    # the top box: what stopping at P < 0.3 costs, counted from the runs table itself
    box = page[page.index('<div class="box">') : page.index("</div>")]
    stops = sum(re.findall(r'data-v="([^"]*)"[^>]*>([^<]*)<', r)[-1][1] == "stop" for r in rows[1:])
    m = re.search(r"stop (\d+) of (\d+) runs &rarr; <b>(\d+)% of the remaining 5-step intervals saved", box)
    assert m and int(m[1]) == stops and int(m[2]) == 12 and int(m[3]) == round(100 * stops / 12)
    labels = [re.findall(r'data-v="([^"]*)"', r)[5] for r in rows[1:]]
    lost = sum(
        lab == "sufficient" and re.findall(r'data-v="([^"]*)"[^>]*>([^<]*)<', r)[-1][1] == "stop"
        for lab, r in zip(labels, rows[1:])
    )
    assert f"{lost} of the {labels.count('sufficient')} sufficient runs lost" in box
    # scores: an HTML table with the best row marked, not a <pre> block
    assert '<table class="scores">' in page and '<tr class="best">' in page and "<pre>" not in page
    for png in ("statistics_over_training.png", "precision_auc_vs_k.png", "roc_confusion.png"):
        assert (out / png).stat().st_size > 1000


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed (optional check)")
def test_report_renders_in_a_real_browser(sweep, tmp_path):
    out = tmp_path / "report"
    assert (
        main(["evaluate", str(sweep), "--timesteps", "2", "--repeats", "2", "--device", "cpu", "--report", str(out)])
        == 0
    )
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            (out / "index.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file() and shot.stat().st_size > 20_000, proc.stderr[-500:]
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", (out / "index.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    start = dom.index('<table class="sortable">')
    assert dom[start : dom.index("</table>", start)].count("<tr") == 1 + 12 and "Every run" in dom
    start = dom.index('<table class="scores">')
    assert dom[start : dom.index("</table>", start)].count('<tr class="best">') == 1
    assert "What acting on the verdicts costs" in dom
