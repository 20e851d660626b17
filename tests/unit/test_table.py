"""Table creation claims: racing creators never overwrite, and a stale claim does not deadlock."""

import threading
import time
from pathlib import Path

import lance
import pyarrow as pa

from prx_assets.core.lab.table import open_or_create

SCHEMA = pa.schema([pa.field("a", pa.int32())])


def test_stale_creation_claim_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / ".t.lance.creating").write_text("1")  # a creator died after claiming
    ds = open_or_create(str(tmp_path / "t.lance"), SCHEMA, wait_seconds=0.2)
    assert ds.version == 1 and ds.schema.names == ["a"]


def test_an_old_claim_left_beside_a_missing_table_is_not_waited_for(tmp_path: Path) -> None:
    """A data root copied without a table, or a table deleted, keeps its claim marker: the next
    creator does not wait out the claim (it used to wait 60 s on every such create)."""
    (tmp_path / ".t.lance.creating").write_text(repr(time.time() - 3600))
    started = time.monotonic()
    ds = open_or_create(str(tmp_path / "t.lance"), SCHEMA)  # the default wait: 60 s
    assert ds.version == 1 and time.monotonic() - started < 30


def test_a_fresh_claim_is_waited_for_and_its_table_opened(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    (tmp_path / ".t.lance.creating").write_text(repr(time.time()))  # another writer is creating it

    def create() -> None:
        time.sleep(0.5)
        lance.write_dataset(pa.table({"a": pa.array([7], pa.int32())}), uri, mode="create")

    creator = threading.Thread(target=create)
    creator.start()
    ds = open_or_create(uri, SCHEMA, wait_seconds=30)
    creator.join()
    assert ds.count_rows() == 1  # the other writer's table, not an empty one of ours


def test_existing_table_is_opened_not_recreated(tmp_path: Path) -> None:
    first = open_or_create(str(tmp_path / "t.lance"), SCHEMA)
    first.insert(pa.table({"a": pa.array([1, 2], pa.int32())}))
    again = open_or_create(str(tmp_path / "t.lance"), SCHEMA)
    assert again.count_rows() == 2 and again.version == first.version


def test_replace_partition_commits_only_when_the_partition_changes(tmp_path: Path) -> None:
    import pyarrow as pa

    from prx_assets.core.lab.table import replace_partition

    schema = pa.schema([("image_id", pa.string()), ("batch", pa.string()), ("v", pa.int64())])
    uri = str(tmp_path / "t.lance")

    def rows(*pairs: tuple[str, int], batch: str = "b1") -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pylist([{"image_id": k, "batch": batch, "v": v} for k, v in pairs], schema=schema)]

    first = replace_partition(uri, schema, "batch", "b1", rows(("a", 1), ("b", 2)))
    replace_partition(uri, schema, "batch", "b2", rows(("c", 3), batch="b2"))
    same = replace_partition(uri, schema, "batch", "b1", rows(("b", 2), ("a", 1)))  # order does not matter
    assert (same.inserted, same.updated, same.deleted) == (0, 0, 0) and same.version == first.version + 1
    changed = replace_partition(uri, schema, "batch", "b1", rows(("a", 1), ("b", 5)))
    assert changed.version == same.version + 1 and changed.updated == 2  # no unchanged_if: all matched rewritten
    fewer = replace_partition(uri, schema, "batch", "b1", rows(("a", 1)))
    assert fewer.deleted == 1 and fewer.version == changed.version + 1
    empty_again = replace_partition(uri, schema, "batch", "b3", [])
    assert empty_again.version == fewer.version  # nothing to write and nothing stored: no commit


def test_a_new_partition_is_appended_once_and_a_second_writer_merges(tmp_path: Path) -> None:
    """The first writer of a new partition appends (cost independent of the table); a writer that
    finds the partition claimed by another merges on the key, so no key is ever stored twice."""
    import lance

    from prx_assets.core.lab.table import replace_partition

    schema = pa.schema([("image_id", pa.string()), ("batch", pa.string()), ("v", pa.int64())])
    uri = str(tmp_path / "t.lance")
    part = [pa.RecordBatch.from_pylist([{"image_id": k, "batch": "b1", "v": 1} for k in "ab"], schema=schema)]
    first = replace_partition(uri, schema, "batch", "b1", part)
    assert first.inserted == 2 and (tmp_path / ".t.lance.appended" / "b1").exists()
    (tmp_path / ".t.lance.appended" / "b2").write_text("1")  # claimed by a concurrent writer
    other = [pa.RecordBatch.from_pylist([{"image_id": k, "batch": "b2", "v": 2} for k in "cd"], schema=schema)]
    replace_partition(uri, schema, "batch", "b2", other)
    replace_partition(uri, schema, "batch", "b2", other)
    ids = lance.dataset(uri).to_table(columns=["image_id"]).column(0).to_pylist()
    assert sorted(ids) == ["a", "b", "c", "d"]


def test_claims_decide_appends_without_counting_and_tables_without_the_marker_still_count(tmp_path: Path) -> None:
    """A table created with claims appends a newly claimed partition without reading the partition
    index; a table created before claims (no marker) counts the partition first, so an unclaimed
    partition that already holds rows is merged, never appended twice."""
    import lance

    from prx_assets.core.lab.table import replace_partition

    schema = pa.schema([("image_id", pa.string()), ("batch", pa.string()), ("v", pa.int64())])

    def part(batch: str, *keys: str) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pylist([{"image_id": k, "batch": batch, "v": 1} for k in keys], schema=schema)]

    uri = str(tmp_path / "t.lance")
    replace_partition(uri, schema, "batch", "b1", part("b1", "a", "b"))
    assert (tmp_path / ".t.lance.appended" / ".every-partition-claimed").exists()
    again = replace_partition(uri, schema, "batch", "b1", part("b1", "a", "b"))  # claim taken: count, equal
    assert (again.inserted, again.updated, again.deleted) == (0, 0, 0)

    legacy = str(tmp_path / "old.lance")
    lance.write_dataset(pa.Table.from_batches(part("b1", "a", "b")), legacy, enable_stable_row_ids=True)
    moved = replace_partition(legacy, schema, "batch", "b1", part("b1", "a", "c"))  # unclaimed but stored
    assert (moved.inserted, moved.deleted) == (1, 1)
    assert sorted(lance.dataset(legacy).to_table(columns=["image_id"]).column(0).to_pylist()) == ["a", "c"]
