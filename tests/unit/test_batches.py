"""Batch discovery: immutable manifests, new drops in new batches, race-safe claims."""

import json
import os
from pathlib import Path

import pytest

from prx_assets.core.config.project import SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import (
    BatchManifest,
    batch_key,
    discover,
    group_units,
    load_manifest,
    load_manifests,
    manifest_path,
    parse_batch_key,
)
from prx_assets.core.ingest.sources import Unit, reader_for
from prx_assets.errors import PartitionKeyError
from tests.helpers import write_folder_corpus


def folder_source(path: Path, batch_size: int = 4) -> SourceConfig:
    return SourceConfig(name="photos", kind="folder", location=str(path), batch_size=batch_size)


def test_keys_round_trip_and_reject_garbage() -> None:
    assert parse_batch_key(batch_key("photos", 12)) == ("photos", 12)
    for bad in ("photos", "photos-12", "Photos-00001", "photos_00001"):
        with pytest.raises(PartitionKeyError, match="is not of the form"):
            parse_batch_key(bad)


def test_group_units_respects_weights() -> None:
    units = [Unit(key=str(i), size=1, stamp="", weight=w) for i, w in enumerate([3, 3, 1, 10, 2])]
    assert [[u.key for u in g] for g in group_units(units, 5)] == [["0"], ["1", "2"], ["3"], ["4"]]


def test_discovery_creates_immutable_batches_and_new_drops_get_new_ones(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=6)  # 9 files
    cfg = folder_source(folder)
    rep = discover(cfg, reader_for(cfg), root)
    assert rep.new_batches == ["photos-00001", "photos-00002", "photos-00003"]
    assert [m.weight for m in load_manifests(root, "photos")] == [4, 4, 1]
    first = root.read_bytes(manifest_path("photos", 1))

    again = discover(cfg, reader_for(cfg), root)
    assert again.new_batches == [] and again.new_units == 0 and again.known_units == 9

    write_folder_corpus(folder, n=2, seed=7, broken=False)
    (folder / "zero.jpg").write_bytes(b"changed")  # a changed file is reported, not re-batched
    os.utime(folder / "zero.jpg", ns=(1, 1))
    third = discover(cfg, reader_for(cfg), root)
    assert third.new_batches == ["photos-00004"]
    assert {u.key for u in load_manifest(root, "photos-00004").units} == {
        "img_7_000.jpg", "sub/img_7_001.png"}
    assert third.changed_units == ["zero.jpg"]
    assert root.read_bytes(manifest_path("photos", 1)) == first


def test_lost_claim_restarts_without_duplicating_units(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=3, broken=False)
    cfg = folder_source(folder, batch_size=10)
    # Another discoverer claimed batch 1 with one of the files a moment ago.
    other = BatchManifest(source="photos", seq=1, units=(reader_for(cfg).list_units()[0],))
    real_write_new = root.write_new
    calls = {"n": 0}

    def racing_write_new(rel: str, data: bytes) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            real_write_new(manifest_path("photos", 1), other.to_bytes())
        return real_write_new(rel, data)

    root.write_new = racing_write_new  # type: ignore[method-assign]
    rep = discover(cfg, reader_for(cfg), root)
    keys = [u.key for m in load_manifests(root, "photos") for u in m.units]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 3
    assert rep.new_batches == ["photos-00002"]


def test_write_new_is_create_if_absent_locally_and_on_s3(tmp_path: Path, s3_env: dict[str, str]) -> None:
    for root in (DataRoot(str(tmp_path / "r")), DataRoot(f"s3://{s3_env['BUCKET']}/prefix")):
        assert root.write_new("a/x.json", b"1") is True
        assert root.write_new("a/x.json", b"2") is False
        assert root.read_bytes("a/x.json") == b"1"
        assert root.list("a") == ["a/x.json"]


def test_missing_manifest_says_how_to_create_batches(tmp_path: Path) -> None:
    with pytest.raises(PartitionKeyError, match=r"no batch manifest for partition 'photos-00009'.*discover"):
        load_manifest(DataRoot(str(tmp_path)), "photos-00009")


def test_manifest_json_is_readable(tmp_path: Path) -> None:
    m = BatchManifest(source="a", seq=2, units=(Unit("k", 5, "t", 1),))
    doc = json.loads(m.to_bytes())
    assert doc["key"] == "a-00002" and doc["units"][0]["key"] == "k"
    assert BatchManifest.from_bytes(m.to_bytes()) == m
