"""Asset keys and groups are spelled once, in ``prx_assets/defs/keys.py``."""

from __future__ import annotations

import ast
from pathlib import Path

from prx_assets.core.stages import STAGES
from prx_assets.defs import keys

PACKAGE = Path(__file__).resolve().parents[2] / "prx_assets"


def test_the_keys_module_lists_every_asset_with_its_group() -> None:
    from prx_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    assert set(graph.get_all_asset_keys()) == set(keys.ASSETS)
    for key in keys.ASSETS:
        assert graph.get(key).group_name == keys.group(key), key
    assert set(STAGES) <= {k.to_user_string() for k in keys.ASSETS}


def test_no_asset_key_is_spelled_outside_the_keys_module() -> None:
    names = {k.to_user_string() for k in keys.ASSETS}
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "keys.py" or path.is_relative_to(PACKAGE / "core"):
            continue  # core/ names stages (the same names) without Dagster
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("AssetKey", "from_coercible") \
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in names:
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if isinstance(node, ast.keyword) and node.arg == "group_name" and isinstance(node.value, ast.Constant):
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.value.lineno} group_name")
    assert spelled == [], "use prx_assets.defs.keys"


def test_every_asset_has_its_fingerprint_in_the_one_table() -> None:
    from prx_assets.defs.fingerprints import FINGERPRINTS

    assert list(FINGERPRINTS) == list(keys.ASSETS)
