"""``prx_assets`` imports downward only: no cycle among its modules, counting imports inside
functions and under ``TYPE_CHECKING``, and ``core/`` never imports the Dagster layer."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "prx_assets"


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package: Path = PACKAGE) -> nx.DiGraph:
    """Every ``prx_assets`` module and the ``prx_assets`` modules it imports, wherever in it."""
    files = {_module_name(p, package): p for p in package.rglob("*.py")}
    modules = set(files)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for target in targets:
                found = _resolve(target, modules)
                if found is not None and found != name:
                    graph.add_edge(name, found)
    return graph


def test_no_import_cycle_in_prx_assets() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == [], "import cycles (move the shared part down, or type against a Protocol):\n" + \
        "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("lower", ["prx_assets.core", "prx_assets.training", "prx_assets.compat"])
def test_lower_layers_do_not_import_the_dagster_layer(lower: str) -> None:
    graph = import_graph()
    upper = ("prx_assets.defs", "prx_assets.resources", "prx_assets.cli", "prx_assets.definitions")
    bad = [(a, b) for a, b in graph.edges if a.startswith(lower) and b.startswith(upper)]
    assert bad == []


def test_the_graph_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    pkg = tmp_path / "prx_assets"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from prx_assets.b import x\n")
    (pkg / "b.py").write_text("def x():\n    from . import a\n")
    assert [sorted(c) for c in nx.strongly_connected_components(import_graph(pkg)) if len(c) > 1] == \
        [["prx_assets.a", "prx_assets.b"]]


@pytest.mark.parametrize("module", ["prx_assets.definitions", "prx_assets.core.stages.ingest"])
def test_loading_the_definitions_or_an_ingest_job_imports_no_model_stack(module: str) -> None:
    """torch, transformers and streaming (which imports torch) load where a model or a shard reader
    runs, not when Dagster loads the definitions or an ingest job starts."""
    import subprocess
    import sys

    code = (f"import sys, warnings; warnings.simplefilter('ignore'); import {module}; "
            "heavy = sorted(m for m in ('torch', 'transformers', 'streaming') if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
