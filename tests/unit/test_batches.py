"""Batch discovery: immutable manifests, new drops in new batches, race-safe claims."""

import json
import os
from pathlib import Path

import pytest

from prx_assets.core import layout
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
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.ingest.sources import Unit
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
    assert third.changed_units == []  # known files are not re-checked by an incremental listing...
    full = discover(cfg, reader_for(cfg), root, full=True)
    assert full.changed_units == ["zero.jpg"] and full.new_batches == []  # ...a full one reports them
    assert root.read_bytes(manifest_path("photos", 1)) == first


def test_an_incremental_listing_skips_unchanged_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only folders whose mtime changed are listed, and no known file is stat-ed."""
    import time

    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "photos"
    for i in range(3):
        write_folder_corpus(folder / f"day{i}", n=2, seed=i, broken=False)
    old = time.time_ns() - 10**10
    for d in [folder, *folder.rglob("*")]:
        if d.is_dir():
            os.utime(d, ns=(old, old))  # settled folders (not modified within the last second)
    cfg = folder_source(folder)
    first = discover(cfg, reader_for(cfg), root)
    assert first.new_units == 6
    listed: list[str] = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p: listed.append(str(p)) or real(p))
    write_folder_corpus(folder / "day3", n=2, seed=3, broken=False)  # a drop: a new folder
    second = discover(cfg, reader_for(cfg), root)
    assert second.new_units == 2 and second.new_batches == ["photos-00003"]
    source_dirs = sorted(Path(p).relative_to(tmp_path).as_posix() for p in listed if Path(p).is_relative_to(folder))
    assert source_dirs == ["photos", "photos/day3", "photos/day3/sub"]  # the root changed, new folders
    assert discover(cfg, reader_for(cfg), root).new_units == 0


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


def test_the_manifest_index_spares_parsing_every_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Discovery reads known units from Parquet index segments; manifests past the index (written by
    another discoverer) are parsed and then indexed; many segments are folded into one."""
    import prx_assets.core.ingest.batches as batches

    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "photos"
    cfg = folder_source(folder, batch_size=2)
    for i in range(4):
        write_folder_corpus(folder / f"drop{i}", n=2, seed=i, broken=False)
        discover(cfg, reader_for(cfg), root)
    index = root.list("ingest/batches/photos/_index")
    assert index and all(p.endswith((".parquet", ".hashes.json")) for p in index)
    known = batches.load_known(root, "photos")
    assert known.covered == known.seqs[-1]
    assert known.units == {u.key: u for m in load_manifests(root, "photos") for u in m.units}

    parsed: list[int] = []
    real = batches.BatchManifest.from_bytes
    monkeypatch.setattr(batches.BatchManifest, "from_bytes",
                        classmethod(lambda cls, data: parsed.append(1) or real(data)))
    again = discover(cfg, reader_for(cfg), root)
    assert again.new_batches == [] and not parsed  # nothing parsed: the index covers every batch

    monkeypatch.setattr(batches, "MAX_SEGMENTS", 2)
    write_folder_corpus(folder / "drop9", n=1, seed=9, broken=False)
    discover(cfg, reader_for(cfg), root)
    known = batches.load_known(root, "photos")
    assert len(known.segments) == 1 and known.covered == known.seqs[-1]  # folded into one segment
    assert known.units == {u.key: u for m in load_manifests(root, "photos") for u in m.units}
    # Planning reads manifest hashes from the files beside the segments, not the manifests.
    truth = {m.key: m.content_hash() for m in load_manifests(root, "photos")}
    parsed.clear()
    assert batches.manifest_hashes(root, "photos") == truth and not parsed
    # A manifest past the index (another discoverer's) is parsed for its hash.
    extra = batches.BatchManifest(source="photos", seq=known.seqs[-1] + 1, units=())
    root.write_bytes(batches.manifest_path("photos", extra.seq), extra.to_bytes())
    assert batches.manifest_hashes(root, "photos") == {**truth, extra.key: extra.content_hash()}


def test_a_drop_is_found_without_turning_every_known_unit_into_objects(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Incremental discovery looks up the changed folders' files in the index segments (Arrow)
    instead of building a dict of every known unit."""
    import prx_assets.core.ingest.batches as batches

    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "photos"
    cfg = folder_source(folder, batch_size=3)
    write_folder_corpus(folder / "old", n=6, seed=1, broken=False)
    discover(cfg, reader_for(cfg), root)
    write_folder_corpus(folder / "old", n=8, seed=1, broken=False)  # two more files in a known folder
    write_folder_corpus(folder / "new", n=2, seed=2, broken=False)
    import os
    import time as _time
    past = _time.time() - 10
    for d in (folder, folder / "old", folder / "new"):
        os.utime(d, (past, past))

    def refuse(self: object) -> None:
        raise AssertionError("every known unit was materialized")

    monkeypatch.setattr(batches.KnownUnits, "units", property(refuse))
    report = discover(cfg, reader_for(cfg), root)
    assert report.new_units == 4 and report.known_units == 6
    monkeypatch.undo()
    everything = {u.key for m in load_manifests(root, "photos") for u in m.units}
    assert len(everything) == 10


def test_an_index_from_before_hash_files_gets_them_on_the_next_discovery(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments written before `.hashes.json` existed: the next discovery fills the gap once, and
    planning then reads hash files, not manifests."""
    import prx_assets.core.ingest.batches as batches

    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "photos"
    cfg = folder_source(folder, batch_size=2)
    write_folder_corpus(folder / "a", n=4, seed=1, broken=False)
    discover(cfg, reader_for(cfg), root)
    for p in root.list("ingest/batches/photos/_index"):
        if p.endswith(".hashes.json"):
            Path(root.join(p)).unlink()  # as an older version left it
    write_folder_corpus(folder / "b", n=2, seed=2, broken=False)
    discover(cfg, reader_for(cfg), root)
    truth = {m.key: m.content_hash() for m in load_manifests(root, "photos")}
    parsed: list[int] = []
    real = batches.BatchManifest.from_bytes
    monkeypatch.setattr(batches.BatchManifest, "from_bytes",
                        classmethod(lambda cls, data: parsed.append(1) or real(data)))
    assert batches.manifest_hashes(root, "photos") == truth and not parsed


def test_an_s3_prefix_is_listed_after_its_cursor_and_fully_once_a_period(tmp_path: Path, s3_env: dict[str, str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Between full listings an S3 source lists only keys after the last one listed (StartAfter):
    a drop under later keys is found at its cost; one under earlier keys waits for the next full
    listing (or ``discover --full``), which also reports objects that changed in place."""
    import boto3

    bucket = s3_env["BUCKET"]
    s3 = boto3.client("s3")
    for key in ("in/2026-11-01/a.jpg", "in/2026-11-01/b.jpg", "in/2026-11-01/notes.txt"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    cfg = SourceConfig(name="pub", kind="s3", location=f"s3://{bucket}/in/", batch_size=10)
    root = DataRoot(str(tmp_path / "root"))
    assert discover(cfg, reader_for(cfg), root).new_units == 2
    state = json.loads(root.read_bytes(f"{layout.batches_dir('pub')}/_listing.json"))
    assert state["start_after"] == "in/2026-11-01/notes.txt"  # the last key listed, wanted or not

    listed: list[dict] = []
    reader = reader_for(cfg)
    real = reader.s3.get_paginator

    def spy(name: str):  # records the listing's arguments
        pager = real(name)
        orig = pager.paginate

        def paginate(**kw):
            listed.append(kw)
            return orig(**kw)

        pager.paginate = paginate
        return pager

    monkeypatch.setattr(reader.s3, "get_paginator", spy)
    s3.put_object(Bucket=bucket, Key="in/2026-11-02/c.jpg", Body=b"x")
    s3.put_object(Bucket=bucket, Key="in/2026-10-31/early.jpg", Body=b"x")  # sorts before the cursor
    rep = discover(cfg, reader, root)
    assert rep.new_units == 1 and listed[-1]["StartAfter"] == "in/2026-11-01/notes.txt"
    assert [u.key for u in load_manifest(root, rep.new_batches[0]).units] == ["2026-11-02/c.jpg"]

    monkeypatch.setenv("PRX_S3_FULL_LISTING_HOURS", "0")  # a full listing is due
    rep = discover(cfg, reader, root)
    assert rep.new_units == 1 and "StartAfter" not in listed[-1]
    assert [u.key for u in load_manifest(root, rep.new_batches[0]).units] == [
        "2026-10-31/early.jpg"]


def test_manifests_from_before_relative_keys_are_known_migrated_and_guard_a_re_pointed_source(
        tmp_path: Path) -> None:
    """Manifests of an earlier release name Parquet files by absolute path. Discovery reads them as
    the relative keys they are under the source's location (nothing new); re-pointed before
    ``prx-assets migrate`` it refuses instead of batching every file again; migrated, re-pointing
    a copy of the files finds nothing new."""
    import shutil

    from prx_assets.core.ingest.batches import relativize_manifests
    from prx_assets.errors import ConfigError
    from tests.unit.test_sources import parquet_file

    data = tmp_path / "cat"
    parquet_file(data / "a.parquet", 4)
    parquet_file(data / "sub" / "b.parquet", 4)
    cfg = SourceConfig(name="cat", kind="parquet", location=str(data), image_column="img", batch_size=100)
    root = DataRoot(str(tmp_path / "root"))
    units = reader_for(cfg).list_units()
    legacy = tuple(Unit(key=f"{data}/{u.key}", size=u.size, stamp=u.stamp, weight=u.weight) for u in units)
    root.write_bytes(manifest_path("cat", 1), BatchManifest("cat", 1, legacy).to_bytes())
    assert discover(cfg, reader_for(cfg), root).new_units == 0

    moved = tmp_path / "moved"
    shutil.copytree(data, moved, copy_function=shutil.copy2)
    re_pointed = SourceConfig(name="cat", kind="parquet", location=str(moved), image_column="img", batch_size=100)
    with pytest.raises(ConfigError, match="prx-assets migrate"):
        discover(re_pointed, reader_for(re_pointed), root)
    with pytest.raises(ConfigError, match="prx-assets migrate"):
        relativize_manifests(root, re_pointed)

    assert relativize_manifests(root, cfg) == 1
    assert relativize_manifests(root, cfg) == 0
    assert {u.key for u in load_manifest(root, "cat-00001").units} == {u.key for u in units}
    assert discover(re_pointed, reader_for(re_pointed), root).new_units == 0
    items = [it for u in load_manifest(root, "cat-00001").units for it in reader_for(re_pointed).read_unit(u)]
    assert len(items) == 8 and all(it.uri.startswith(str(moved)) and not it.key.startswith("/") for it in items)
