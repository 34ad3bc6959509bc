"""The house keeps its shape: subpackages in layers, each importing only from layers below
it (counting imports inside functions, which are still dependencies), no import cycle, and
no private name imported across subpackages. docs/contributing.md draws the layers."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dtg_gpu"

#: lowest first; a module may import from its own layer's other modules and from lower layers
LAYERS = [
    {"exceptions", "core"},
    {"topology", "centrality", "models"},
    {"io", "graph"},
    {"features"},
    {"engine"},
    {"analysis"},
    {"predictor"},
    {"early_stopping"},
    {"sweeps"},
    {"workflow", "testing"},
    {"integrations"},
    {"cli"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `module` imports anywhere in its body."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        deps |= {n for n in names if n in known and n != module}
    return deps


def _graph() -> nx.DiGraph:
    known = _modules()
    g = nx.DiGraph()
    for module, path in known.items():
        g.add_node(module)
        g.add_edges_from((module, dep) for dep in _imports(module, path, known))
    return g


def _part(module: str) -> str:
    """`dtg_gpu.engine.solve` -> `engine`; the package root -> `""`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_subpackage_has_a_layer():
    tops = {_part(m) for m in _modules()} - {""}
    assert tops <= set(LAYER_OF), f"put {sorted(tops - set(LAYER_OF))} in a layer (and in docs/contributing.md)"


def test_no_import_cycle_counting_imports_inside_functions():
    g = _graph()
    g.remove_node("dtg_gpu")  # the root only re-exports, lazily; nothing below imports it
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not cycles, cycles[:5]


def test_nothing_imports_the_package_root():
    g = _graph()
    assert list(g.predecessors("dtg_gpu")) == []


def test_lower_layers_never_import_higher_ones():
    bad = [
        f"{a} (layer {LAYER_OF[_part(a)]}) imports {b} (layer {LAYER_OF[_part(b)]})"
        for a, b in _graph().edges
        if _part(a) and _part(b) and LAYER_OF[_part(b)] > LAYER_OF[_part(a)]
    ]
    assert not bad, bad


def test_no_private_name_is_imported_across_subpackages():
    bad = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dtg_gpu"):
                for a in node.names:
                    private = a.name.startswith("_") and not a.name.startswith("__")
                    if private and _part(node.module) != _part(module):
                        bad.append(f"{module} imports {a.name} from {node.module}")
    assert not bad, bad


@pytest.mark.parametrize("limit", [100])
def test_no_function_is_longer_than_a_screen(limit):
    long = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert not long, long


def test_the_layer_checks_see_a_violation(tmp_path, monkeypatch):
    """The checks can fail: an import of a higher layer, planted, is found."""
    known = _modules()
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from dtg_gpu.cli.main import main\n")
    assert _imports("dtg_gpu.core.planted", planted, known) == {"dtg_gpu.cli.main"}
