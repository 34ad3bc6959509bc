"""The README and the docs say what the code does: every Python block runs as written, every
``dtg`` command line parses with the CLI's own parser."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from dtg_gpu.cli.main import build_parser
from dtg_gpu.sweeps import SweepConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "results" not in p.relative_to(ROOT).parts]


def _blocks(path: Path, lang: str) -> list[str]:
    """The fenced code blocks of a page whose info string matches `lang` (a regex; "" for none),
    read fence by fence so that a closing fence is never taken for an opening one."""
    blocks, current, info = [], None, ""
    for line in path.read_text().splitlines():
        fence = re.match(r"^\s*```(\S*)\s*$", line)
        if current is None and fence:
            current, info = [], fence.group(1)
        elif current is not None and fence and not fence.group(1):
            if re.fullmatch(lang, info):
                blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _pages_with_python():
    return [pytest.param(p, id=str(p.relative_to(ROOT))) for p in PAGES if _blocks(p, "python")]


@pytest.fixture(scope="module")
def sweep_dir(trained_sweep):
    """The ``SWEEP`` folder the docs' examples read."""
    cfg = SweepConfig(
        model="lenet5",
        dataset="digits",
        lrs=(0.003, 0.3),
        dropouts=(0.0, 0.5),
        seeds=2,
        epochs=1,
        checkpoint_every=1,
        checkpoint_unit="step",
    )  # 20 checkpoints
    return trained_sweep(cfg, "SWEEP").parent


@pytest.mark.parametrize("page", _pages_with_python())
def test_python_blocks_run_as_written(page, sweep_dir, monkeypatch):
    """A page's blocks run in order in one namespace, as a reader would paste them."""
    monkeypatch.chdir(sweep_dir)
    namespace = {"__name__": "__docs__"}
    try:
        for i, code in enumerate(_blocks(page, "python")):
            exec(compile(code, f"{page.name}#{i}", "exec"), namespace)
    finally:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()  # the instance a Tuner started
    check = PAGE_CHECKS.get(page.name)
    if check:
        check(namespace)


def _examples_stop_something(ns):
    """The how-to's examples show the point: the Optuna study prunes, Tune stops trials."""
    import optuna

    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in ns["study"].trials)
    assert 1 <= pruned < len(ns["study"].trials)
    iterations = [r.metrics["training_iteration"] for r in ns["results"]]
    assert 1 <= sum(i < 10 for i in iterations) < len(iterations)


PAGE_CHECKS = {"early-stopping.md": _examples_stop_something}


def _command_lines():
    out = []
    for page in PAGES:
        for block in _blocks(page, "(?:bash)?"):
            for line in block.splitlines():
                line = line.split("#")[0].strip()
                if line.startswith("dtg "):
                    out.append(pytest.param(line, id=f"{page.relative_to(ROOT)}:{line[:40]}"))
    return out


@pytest.mark.parametrize("line", _command_lines())
def test_cli_lines_parse(line):
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert callable(args.func)


RUNNABLE = {"analyze", "featurize", "evaluate", "train", "predict", "watch", "env"}


def _runnable_lines():
    """Per page, the command lines that read a sweep on disk (not those that train one, start
    a cluster or run the full demo: `dtg sweep` and `dtg demo --quick` run in test_cli)."""
    out = []
    for page in PAGES:
        lines = []
        for block in _blocks(page, "(?:bash)?"):
            for line in block.splitlines():
                line = line.split("#")[0].strip()
                args = shlex.split(line)[1:] if line.startswith("dtg ") else []
                if args and args[0] in RUNNABLE and "--ray" not in args and "/shared/" not in line:
                    lines.append(line)
        if lines:
            out.append(pytest.param(lines, id=str(page.relative_to(ROOT))))
    return out


@pytest.mark.parametrize("lines", _runnable_lines())
def test_cli_lines_run(lines, sweep_dir, monkeypatch, capsys):
    """A page's command lines that read a sweep run as written on the docs' SWEEP (in order, so
    `dtg train` writes the predictor `dtg predict` reads); `dtg watch` makes one pass."""
    from dtg_gpu.cli.main import main

    monkeypatch.chdir(sweep_dir)
    trained = False
    for line in lines:
        args = shlex.split(line.replace("NEW_SWEEP", "SWEEP").replace("RESNET", "SWEEP"))[1:]
        if args[0] == "watch" and "--once" not in args:
            args.append("--once")
        if "predictor.safetensors" in args and args[0] != "train" and not trained:
            assert main(["train", "SWEEP", "-k", "5", "--out", "predictor.safetensors", "--device", "cpu"]) == 0
        trained |= args[0] == "train"
        assert main([*args, "--device", "cpu"] if args[0] != "env" else args) == 0, line


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    for link in re.findall(r"\]\((docs/[^)#]+)\)", text):
        assert (ROOT / link).exists(), link


def _api_objects():
    import importlib
    import inspect

    out = []
    for name in re.findall(r"^::: (\S+)$", (ROOT / "docs" / "api.md").read_text(), re.M):
        module, _, attr = name.rpartition(".")
        try:
            obj = importlib.import_module(name)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr)
        out.append((name, obj))
        if inspect.isclass(obj):
            out += [
                (f"{name}.{k}", v)
                for k, v in vars(obj).items()
                if not k.startswith("_") and str(getattr(v, "__module__", "dtg_gpu")).startswith("dtg_gpu")
            ]
    return out


def test_api_page_docstrings_render_in_mkdocstrings():
    """The API page shows cross-references and formulas, not Sphinx roles or literal double
    backticks (mkdocstrings renders Markdown: [`name`][dtg_gpu.name], $x$, `code`)."""
    import inspect

    objects = _api_objects()
    assert len(objects) > 60
    for name, obj in objects:
        doc = inspect.getdoc(obj) if not isinstance(obj, (str, int, float, tuple)) else None
        if not doc:
            continue
        assert not re.search(r":(func|meth|class|attr|mod|data|math|exc|obj):`", doc), name
        assert "``" not in doc, name


def test_warns_sections_say_when():
    """Every `Warns` entry has a description (the API page's Warns table is not empty)."""
    import inspect

    for name, obj in _api_objects():
        doc = inspect.getdoc(obj) if callable(obj) else None
        if doc and "\nWarns\n-----\n" in doc:
            section = doc.split("\nWarns\n-----\n")[1].split("\n\n")[0].splitlines()
            names = [line for line in section if line and not line.startswith(" ")]
            described = [line for line in section if line.startswith("    ")]
            assert names and len(described) >= len(names), name
