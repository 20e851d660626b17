"""The Lance SQL seam: quoting, IN lists, chunked lookups by id, pinned versions; layout paths."""

import doctest
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from prx_assets.core import layout
from prx_assets.core.lab import sql


def test_doctests() -> None:
    for mod in (sql, layout):
        res = doctest.testmod(mod)
        assert res.failed == 0 and res.attempted > 0, mod.__name__


def test_literal_quotes_and_types() -> None:
    assert sql.literal("a'b") == "'a''b'"
    assert sql.literal(3) == "3"
    assert sql.literal(True) == "true"
    with pytest.raises(TypeError, match="Lance SQL literal"):
        sql.literal(None)  # type: ignore[arg-type]


def test_where_all_parenthesizes() -> None:
    assert sql.where_all() is None
    assert sql.where_all("a = 1", None) == "a = 1"
    assert sql.where_all("a = 1 OR b = 2", "c = 3") == "(a = 1 OR b = 2) AND (c = 3)"


def test_rows_by_ids_chunks_quotes_and_reports_missing(tmp_path: Path) -> None:
    ids = [f"id{i:03d}" for i in range(25)] + ["o'hara"]
    ds = lance.write_dataset(pa.table({"image_id": ids, "n": list(range(len(ids)))}), tmp_path / "t.lance")
    asked = ["o'hara", "id007", "missing", "id020"]
    seen = {}
    chunks = 0
    for part, rows in sql.rows_by_ids(ds, asked, ["n"], chunk=2):
        chunks += 1
        assert len(part) <= 2
        seen.update(rows)
    assert chunks == 2
    assert {k: v["n"] for k, v in seen.items()} == {"o'hara": 25, "id007": 7, "id020": 20}
    assert sql.table_by_ids(ds, [], ["n"]).num_rows == 0
    assert ds.to_table(filter=sql.where_in("image_id", [])).num_rows == 0


def test_open_pinned_reads_the_recorded_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"a": [1]}), uri)
    lance.write_dataset(pa.table({"a": [2]}), uri, mode="append")
    assert sql.open_pinned({"lance_uri": uri, "lance_version": 1}).count_rows() == 1
    with pytest.raises(ValueError, match="names no Lance"):
        sql.open_pinned({"subset_id": "v1-x"})


def test_layout_round_trips() -> None:
    assert layout.manifest_of("s3://b/mds/r/x/") == "s3://b/mds/r/x/manifest.json"
    assert layout.manifest_of("mds/r/x/manifest.json") == "mds/r/x/manifest.json"
    assert layout.table_name(layout.table("images")) == "images"
    assert layout.table_name("lance/notes.txt") is None
    assert layout.batch_manifest("photos", 3) == "ingest/batches/photos/00003.json"
