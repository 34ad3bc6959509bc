import argparse
import html
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import SMALL_SWEEP

import dtg_gpu
from dtg_gpu import channel_topology
from dtg_gpu.cli.main import SUBCOMMANDS, main
from dtg_gpu.models import build_model
from dtg_gpu.predictor.evaluation import METRICS
from dtg_gpu.sweeps import SweepConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep(trained_sweep):
    return trained_sweep(SweepConfig(**SMALL_SWEEP))


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_help_on_every_command(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0 and "usage: dtg" in capsys.readouterr().out


def test_analyze_featurize_train_predict_evaluate(sweep, tmp_path, capsys):
    assert main(["analyze", str(sweep / "run-0001"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "run-0001" in out and "skewness" in out
    assert main(["analyze", str(sweep / "run-0001"), "--json", "--device", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["timesteps"]) == 4 and data["num_nodes"] == 237
    csv = tmp_path / "f.csv"
    assert main(["featurize", str(sweep), "--timesteps", "3", "--out", str(csv), "--device", "cpu"]) == 0
    lines = csv.read_text().splitlines()
    assert len(lines) == 13 and lines[0].startswith("run,final_accuracy,mean_t1")
    pred = tmp_path / "p.safetensors"
    assert main(["train", str(sweep), "--timesteps", "3", "--out", str(pred), "--epochs", "50", "--device", "cpu"]) == 0
    assert pred.is_file()
    capsys.readouterr()
    assert main(["predict", str(pred), str(sweep / "run-0000"), str(sweep / "run-0005"), "--device", "cpu"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 2 and re.search(r"P\(sufficient\)=\d\.\d{3}", rows[0])
    assert main(["evaluate", str(sweep), "--timesteps", "2", "--repeats", "3", "--device", "cpu"]) == 0
    assert "precision" in capsys.readouterr().out
    assert main(["evaluate", str(sweep), "--timesteps", "2", "--repeats", "2", "--device", "cpu", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert set(row) == {"features", "k", *METRICS} and len(row["average_precision"]["values"]) == 2
    # the seed's features with one option: log(lambda_1) per timestep
    assert (
        main(
            [
                "featurize",
                str(sweep),
                "--timesteps",
                "2",
                "--spec",
                "--eigenvalue",
                "--out",
                str(csv),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert csv.read_text().splitlines()[0].endswith("kurtosis_t2,log_eigenvalue_t2")
    args = ["featurize", str(sweep), "--timesteps", "1", "--spec", "--per-layer", "--out", str(csv), "--device", "cpu"]
    assert main(args) == 0
    assert len(csv.read_text().splitlines()[0].split(",")) == 2 + 30
    # the default recipe, options turned off
    args = ["featurize", str(sweep), "-k", "1", "--no-weight-stats", "--no-spec-block", "--out", str(csv)]
    assert main([*args, "--device", "cpu"]) == 0
    assert csv.read_text().splitlines()[0].endswith("kurtosis_t1,log_eigenvalue_t1")
    assert "classifier.7:kurtosis_t1" in csv.read_text().splitlines()[0]
    assert (
        main(
            [
                "train",
                str(sweep),
                "--timesteps",
                "2",
                "--eigenvalue",
                "--per-layer",
                "--out",
                str(pred),
                "--epochs",
                "20",
                "--scaling",
                "quantile",
                "--select",
                "4",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    back = dtg_gpu.PerformancePredictor.load(pred)
    assert back.scaling == "quantile" and back.select == 4 and back.selected_.size == 4
    capsys.readouterr()
    assert main(["predict", str(pred), str(sweep / "run-0002"), "--device", "cpu"]) == 0
    assert "P(sufficient)=" in capsys.readouterr().out
    assert (
        main(
            [
                "evaluate",
                str(sweep),
                "--timesteps",
                "2",
                "--repeats",
                "2",
                "--scaling",
                "quantile",
                "--select",
                "3",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "precision" in capsys.readouterr().out


def test_select_must_be_a_positive_integer(tmp_path, capsys):
    for bad in ("0", "-2", "three"):
        with pytest.raises(SystemExit) as e:
            main(["evaluate", str(tmp_path), "--select", bad])
        assert e.value.code == 2 and f"expected a positive integer, got '{bad}'" in capsys.readouterr().err


def test_env_prints_versions(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "cuda available" in out


def test_errors_are_one_line_with_nonzero_exit(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "run folder not found" in err and "Traceback" not in err
    assert main(["sweep", "--out", str(tmp_path / "s"), "--lr", "-1"]) == 1
    assert "learning rates must be positive" in capsys.readouterr().err
    assert main(["featurize", str(tmp_path), "--out", "x.csv"]) == 1
    assert "no sweep.json" in capsys.readouterr().err
    assert (
        main(["sweep", "--dataset", "mnist", "--data-root", str(tmp_path), "--out", str(tmp_path / "m"), "--quiet"])
        == 1
    )
    assert "mnist was not found" in capsys.readouterr().err
    assert main(["sweep", "--model", "lenet5", "--width", "0.5", "--out", str(tmp_path / "w"), "--quiet"]) == 1
    assert "--width applies to vgg" in capsys.readouterr().err


def test_sweep_command_trains_a_narrow_vgg_grouped(tmp_path, capsys):
    out = tmp_path / "vgg"
    assert (
        main(
            [
                "sweep",
                "--model",
                "vgg11",
                "--width",
                "0.0625",
                "--lr",
                "0.01",
                "--dropout",
                "0",
                "0.5",
                "--epochs",
                "1",
                "--checkpoint-every",
                "10",
                "--checkpoint-unit",
                "step",
                "--out",
                str(out),
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    metas = [json.loads((out / f"run-{i:04d}" / "run.json").read_text()) for i in range(2)]
    assert all(m["trained_with"] == "grouped" and len(m["checkpoints"]) == 2 for m in metas)
    capsys.readouterr()
    assert main(["analyze", str(out / "run-0001"), "--json", "--device", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    narrow = build_model("vgg11", num_classes=10, in_channels=1, width=0.0625)
    assert data["num_nodes"] == channel_topology(narrow).num_nodes and len(data["timesteps"]) == 2


def test_demo_quick(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path / "demo"), "--quiet", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "precision" in out and "learning_curve" in out
    report = tmp_path / "demo" / "report"
    for f in (
        "index.html",
        "statistics_over_training.png",
        "precision_auc_vs_k.png",
        "roc_confusion.png",
        "centrality_per_layer.png",
    ):
        assert (report / f).stat().st_size > 1000
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert results["runs"] == 16 and results["timesteps"] == 10
    # "sufficient" means a run that learned: the sweep median is well above chance (10 %)
    import numpy as np

    from dtg_gpu.sweeps import load_sweep

    accs = [r.final_accuracy for r in load_sweep(tmp_path / "demo" / "sweep")]
    assert np.median(accs) > 0.5
    # the console shows the same (feature set, k) rows as the report's scores table
    page = (report / "index.html").read_text()
    scores = page[page.index('<table class="scores">') : page.index("</table>", page.index('<table class="scores">'))]
    html_rows = re.findall(r"<tr[^>]*><td>([^<]*)</td><td>(\d+)</td>", scores)
    console_rows = re.findall(r"^(\S.*?)\s+(\d+)\s+\d\.\d{3} \[", out, re.M)
    assert [(n.strip(), k) for n, k in console_rows] == [(html.unescape(n), k) for n, k in html_rows]
    assert len(html_rows) == 5 * len({k for _, k in html_rows})


def test_readme_api_example_runs_as_written(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## The API in ten lines\n\n```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "torch.Size([5, 237]) True" in out


def test_every_option_says_what_it_does_and_the_root_help_shows_the_workflow(capsys):
    from dtg_gpu.cli.main import SUBCOMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {opt.option_strings[0]}"
        for name in SUBCOMMANDS
        for opt in sub.choices[name]._actions
        if opt.option_strings and opt.help in (None, "") and opt.dest != "help"
    ]
    assert missing == []
    assert "the usual workflow" in parser.format_help() and "dtg watch" in parser.format_help()


def test_user_model_imports_from_the_working_folder(tmp_path, monkeypatch, capsys):
    import sys

    (tmp_path / "mynet_for_cli.py").write_text(
        "from torch import nn\nclass Net(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))\n"
    )
    folder = tmp_path / "run"
    folder.mkdir()
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    for t in (1, 2):
        torch.save(net.state_dict(), folder / f"ckpt-{t}.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["analyze", str(folder), "--model", "mynet_for_cli:Net", "--json"]) == 0
    assert '"num_nodes": 9' in capsys.readouterr().out


def test_dtg_help_does_not_import_torch():
    """``dtg --help`` and every sub-command's help answer without importing torch (seconds under
    load); ``import dtg_gpu`` loads the rest of the API when first used."""
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "from dtg_gpu.cli.main import main\n"
        "for argv in (['--help'], ['watch', '--help'], ['sweep', '--help'], ['analyze', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0, argv\n"
        "assert 'torch' not in sys.modules, 'torch imported by dtg --help'\n"
        "import dtg_gpu\n"
        "assert 'torch' not in sys.modules\n"
        "assert set(dtg_gpu.__all__) <= set(dir(dtg_gpu))\n"
        "assert dtg_gpu.analyze.__module__ == 'dtg_gpu.analysis' and 'torch' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import dtg_gpu

        dtg_gpu.nope  # noqa: B018
