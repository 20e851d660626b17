"""Table creation claims: racing creators never overwrite, and a stale claim does not deadlock."""

from pathlib import Path

import pyarrow as pa

from prx_assets.core.lab.table import open_or_create

SCHEMA = pa.schema([pa.field("a", pa.int32())])


def test_stale_creation_claim_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / ".t.lance.creating").write_text("1")  # a creator died after claiming
    ds = open_or_create(str(tmp_path / "t.lance"), SCHEMA, wait_seconds=0.2)
    assert ds.version == 1 and ds.schema.names == ["a"]


def test_existing_table_is_opened_not_recreated(tmp_path: Path) -> None:
    first = open_or_create(str(tmp_path / "t.lance"), SCHEMA)
    first.insert(pa.table({"a": pa.array([1, 2], pa.int32())}))
    again = open_or_create(str(tmp_path / "t.lance"), SCHEMA)
    assert again.count_rows() == 2 and again.version == first.version
