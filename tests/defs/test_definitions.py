"""Contract of the whole graph: a snapshot of every asset, dependency, partitioning, group, kind,
owner, check, code version, job, sensor and schedule.

A change to the graph fails here and shows in review. When the change is intended, run
``PRX_UPDATE_SNAPSHOT=1 pytest tests/defs/test_definitions.py`` and commit the new
``tests/golden/definitions.json`` with the change.
"""

import json
import os
from pathlib import Path
from typing import Any

import dagster as dg

from prx_assets.definitions import defs

GOLDEN = Path(__file__).parents[1] / "golden" / "definitions.json"


def _partitions(pdef: dg.PartitionsDefinition | None) -> Any:
    if pdef is None:
        return None
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        return {d.name: _partitions(d.partitions_def) for d in pdef.partitions_defs}
    if isinstance(pdef, dg.DynamicPartitionsDefinition):
        return f"dynamic:{pdef.name}"
    return type(pdef).__name__


def snapshot() -> dict[str, Any]:
    """Everything about the Definitions that other tools, the UI and users rely on."""
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in graph.toposorted_asset_keys:
        a = defs.resolve_assets_def(key)
        spec = next(s for s in a.specs if s.key == key)
        assets[key.to_user_string()] = {
            "deps": sorted(d.asset_key.to_user_string() for d in spec.deps),
            "partitions": _partitions(a.partitions_def),
            "group": spec.group_name,
            "kinds": sorted(spec.kinds),
            "owners": sorted(spec.owners),
            "tags": dict(sorted(spec.tags.items())),
            "code_version": spec.code_version,
            "backfill_policy": str(a.backfill_policy) if a.backfill_policy else None,
            "has_description": bool(spec.description),
        }
    checks = {}
    for c in defs.asset_checks or []:
        for s in c.check_specs:
            checks[f"{s.asset_key.to_user_string()}:{s.name}"] = {"blocking": s.blocking}
    return {
        "assets": assets,
        "checks": dict(sorted(checks.items())),
        "jobs": sorted(j.name for j in defs.jobs or []),
        "sensors": sorted(s.name for s in defs.sensors or []),
        "schedules": sorted(s.name for s in defs.schedules or []),
        "resources": sorted((defs.resources or {}).keys()),
    }


def test_definitions_match_the_snapshot() -> None:
    got = snapshot()
    if os.environ.get("PRX_UPDATE_SNAPSHOT") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: run PRX_UPDATE_SNAPSHOT=1 pytest {__file__} and commit it"
    want = json.loads(GOLDEN.read_text())
    assert got == want, ("the asset graph changed; if intended, run PRX_UPDATE_SNAPSHOT=1 pytest "
                         "tests/defs/test_definitions.py and commit tests/golden/definitions.json")


def test_every_asset_is_documented_and_versioned() -> None:
    for name, a in snapshot()["assets"].items():
        assert a["has_description"] and a["code_version"] and a["owners"], name


def test_definitions_load_without_touching_the_environment(monkeypatch: Any, tmp_path: Path) -> None:
    """Nothing runs at import: a missing config folder and data root do not matter until a run."""
    import importlib

    import prx_assets.definitions as mod

    monkeypatch.setenv("PRX_CONFIG_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PRX_DATA_ROOT", str(tmp_path / "nothing"))
    importlib.reload(mod)
    assert not (tmp_path / "nothing").exists()
    assert len(list(mod.defs.resolve_asset_graph().get_all_asset_keys())) == len(snapshot()["assets"])
