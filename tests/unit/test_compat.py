"""Private APIs of other packages appear only in ``prx_assets/compat/``, each behind a version guard."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from prx_assets.compat import CompatError, guard

PACKAGE = Path(__file__).resolve().parents[2] / "prx_assets"
COMPAT = PACKAGE / "compat"


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(modules: list[tuple[Path, ast.Module]]) -> set[str]:
    """Every name prx_assets defines: functions, classes, variables and attributes it assigns."""
    names: set[str] = set()
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _foreign_private_uses(tree: ast.Module, own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and not node.module.startswith("prx_assets"):
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(_private(p) for p in parts):
                found.append(f"{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if not a.name.startswith("prx_assets") and any(_private(p) for p in a.name.split("."))]
        elif (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value) and node.args[1].value not in own):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_private_api_of_another_package_outside_compat() -> None:
    modules = _modules()
    own = _own_names([(p, t) for p, t in modules if not p.is_relative_to(COMPAT)])
    bad = [f"{p.relative_to(PACKAGE.parent)}:{use}" for p, tree in modules if not p.is_relative_to(COMPAT)
           for use in _foreign_private_uses(tree, own)]
    assert bad == [], "private APIs outside prx_assets/compat/ (move them into a shim there):\n" + "\n".join(bad)


def test_the_scan_sees_a_private_import_and_attribute() -> None:
    tree = ast.parse("from dagster._core.event_api import X\nimport lance\nlance.LanceDataset._take_rows\n"
                     "getattr(ds, '_storage_options')\nself._mine = 1\nself._mine\n")
    assert [u.split(":")[0] for u in _foreign_private_uses(tree, {"_mine"})] == ["1", "3", "4"]


def test_every_shim_is_guarded_and_the_installed_versions_pass() -> None:
    from prx_assets.compat import dagster_checks, lance, pillow, streaming

    for shim, dist in ((lance, "pylance"), (streaming, "mosaicml-streaming"), (dagster_checks, "dagster"),
                       (pillow, "pillow")):
        guard(dist, shim.CHECKED, f"test of {shim.__name__}", "upstream")
        source = Path(shim.__file__).read_text()
        assert f'guard("{dist}", CHECKED' in source, f"{shim.__name__} does not guard {dist}'s version"


def test_a_version_outside_the_checked_range_is_refused_with_the_fix() -> None:
    with pytest.raises(CompatError) as err:
        guard("pylance", "<1", "take_rows (rows by row id)", "lance-format/lance#3938")
    text = str(err.value)
    assert "pylance<1" in text and "lance-format/lance#3938" in text and "prx_assets/compat/" in text
    with pytest.raises(CompatError, match="not installed"):
        guard("no-such-distribution-prx", ">=1", "x", "y")
