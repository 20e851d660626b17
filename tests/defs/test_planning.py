"""Planning reads what changed: recorded fingerprints come from a per-asset cache keyed by event
storage id, and bulk data versions equal the per-partition lookups."""

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from prx_assets.core.config.storage import DataRoot
from prx_assets.infra.staleness import FINGERPRINT_KEY, FingerprintContext, recorded_fingerprints

KEY = dg.AssetKey("raw_images")


def _record(instance: dg.DagsterInstance, partition: str, fingerprint: str, version: str = "v") -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(
        KEY, partition=partition, metadata={FINGERPRINT_KEY: fingerprint}, tags={DATA_VERSION_TAG: version}))


def test_recorded_fingerprints_read_only_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        for i in range(5):
            _record(instance, f"p{i}", f"fp{i}")
        _record(instance, "p0", "fp0-new")
        expected = {"p0": "fp0-new", **{f"p{i}": f"fp{i}" for i in range(1, 5)}}
        assert recorded_fingerprints(instance, KEY) == expected
        assert recorded_fingerprints(instance, KEY, cache_dir=cache) == expected
        assert (cache / "raw_images.parquet").is_file()

        fetched: list[Any] = []
        real = instance.fetch_materializations

        def counting(records_filter: Any, **kw: Any) -> Any:
            if isinstance(records_filter, dg.AssetRecordsFilter) and records_filter.storage_ids:
                fetched.extend(records_filter.storage_ids)
            return real(records_filter, **kw)

        monkeypatch.setattr(instance, "fetch_materializations", counting)
        assert recorded_fingerprints(instance, KEY, cache_dir=cache) == expected
        assert fetched == []  # nothing changed: no record read

        _record(instance, "p3", "fp3-new")
        _record(instance, "p9", "fp9")
        got = recorded_fingerprints(instance, KEY, cache_dir=cache)
        assert got == {**expected, "p3": "fp3-new", "p9": "fp9"}
        assert len(fetched) == 2  # only the two partitions materialized since

        instance.wipe_assets([KEY])  # a new history: the cache no longer applies
        _record(instance, "p1", "fresh")
        assert recorded_fingerprints(instance, KEY, cache_dir=cache) == {"p1": "fresh"}


def test_bulk_data_versions_equal_per_partition_lookups(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        for i in range(4):
            _record(instance, f"p{i}", "x", version=f"v{i}")
        _record(instance, "p2", "x", version="v2b")
        one = FingerprintContext(root=DataRoot(str(tmp_path)), sources=None, instance=instance)
        bulk = FingerprintContext(root=DataRoot(str(tmp_path)), sources=None, instance=instance, bulk=True)
        for pk in ("p0", "p1", "p2", "p3", "missing"):
            assert bulk.data_version(KEY, pk) == one.data_version(KEY, pk)
        assert bulk.data_version(KEY, "p2") == "v2b"


def test_registering_keys_another_process_just_added_is_not_an_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs (or a run and the sensor) register the same new batches at once: the loser of the
    unique-key race registers what is still missing instead of failing."""
    import prx_assets.infra.partitions as partitions
    from prx_assets.cli import register_partitions

    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        monkeypatch.setattr(partitions, "missing_partitions", lambda *a, **k: {"raw_batches": ["s-00001", "s-00002"]})
        real = instance.add_dynamic_partitions
        raced: list[list[str]] = []

        def racing(name: str, keys: list[str]) -> None:
            if not raced:  # the other process inserts s-00001 between our check and our insert
                raced.append(list(keys))
                real(name, ["s-00001"])
                raise RuntimeError("UNIQUE constraint failed: dynamic_partitions.partition")
            real(name, keys)

        monkeypatch.setattr(instance, "add_dynamic_partitions", racing)
        assert register_partitions(instance, []) == ["s-00001", "s-00002"]
        assert sorted(instance.get_dynamic_partitions("raw_batches")) == ["s-00001", "s-00002"]


def test_the_data_version_tag_is_dagsters() -> None:
    """staleness.py names the tag itself (Dagster exports it only from ``dagster._core``): a Dagster
    release that renames it fails here, not in the planner."""
    from dagster._core.definitions.data_version import DATA_VERSION_TAG

    from prx_assets.infra import staleness

    assert staleness.DATA_VERSION_TAG == DATA_VERSION_TAG
