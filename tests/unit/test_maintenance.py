"""Compaction costs what accumulated: large fragments stay, small ones merge, a run is bounded."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa

from prx_assets.core.lab.maintenance import compact_bounded, settled_fragments


def _files(ds: lance.LanceDataset) -> dict[int, set[str]]:
    return {f.fragment_id: {d.path for d in f.data_files()} for f in ds.get_fragments()}


def _table(tmp_path: Path) -> lance.LanceDataset:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"a": list(range(900))}), uri, max_rows_per_file=300)  # 3 x 300
    for i in range(6):  # six small appends, as ingest partitions make
        lance.write_dataset(pa.table({"a": list(range(1000 + 5 * i, 1005 + 5 * i))}), uri, mode="append")
    return lance.dataset(uri)


def test_large_fragments_are_left_alone_and_small_ones_merged(tmp_path: Path) -> None:
    ds = _table(tmp_path)
    ds.delete("a < 40")  # 40 of fragment 0's 300 rows: past the 10% share, so it is rewritten
    before = _files(ds)
    assert settled_fragments(ds.get_fragments(), 1000) == [1, 2]
    compact_bounded(ds, 1000, max_bytes=1 << 40)
    after = _files(ds)
    assert after[1] == before[1] and after[2] == before[2]  # not rewritten
    assert 0 not in after and len(after) == 4  # fragment 0 rewritten, the six small ones merged into one
    assert ds.count_rows() == 900 - 40 + 30
    assert compact_bounded(ds, 1000, max_bytes=1 << 40) is None  # nothing left to do


def test_one_run_is_bounded_by_bytes_and_the_next_continues(tmp_path: Path) -> None:
    ds = _table(tmp_path)
    ds.delete("a < 40")  # two tasks: fragment 0, and the small fragments
    compact_bounded(ds, 1000, max_bytes=1)  # over the cap at once: still one task
    assert len(ds.get_fragments()) == 3 + 6  # fragment 0 rewritten in place of itself, the rest waits
    compact_bounded(ds, 1000, max_bytes=1)
    assert len(ds.get_fragments()) == 4 and ds.count_rows() == 890


def test_a_table_made_before_a_column_encoding_gets_it_from_maintenance(tmp_path: Path) -> None:
    from prx_assets.core import layout
    from prx_assets.core.config.storage import DataRoot
    from prx_assets.core.lab.maintenance import maintain_table
    from prx_assets.core.lab.schema import IMAGES_SCHEMA, STORED_AS_IS
    from prx_assets.core.lab.table import missing_encodings, open_or_create

    root = DataRoot(str(tmp_path))
    jpeg = IMAGES_SCHEMA.field("jpeg")
    older = pa.schema([IMAGES_SCHEMA.field("image_id"),
                       jpeg.with_metadata({k: v for k, v in jpeg.metadata.items() if not k.startswith(b"lance-encoding:")})])
    uri = root.join(layout.table("images"))
    open_or_create(uri, older)
    for i in range(3):  # small appends for the compaction to merge
        rows = pa.table({"image_id": [f"{i}-{j}" for j in range(4)], "jpeg": [bytes([i, j]) * 300 for j in range(4)]},
                        schema=older)
        lance.write_dataset(rows, uri, mode="append")
    before = lance.dataset(uri)
    assert missing_encodings(before, IMAGES_SCHEMA) == {"jpeg": STORED_AS_IS}
    values = before.to_table().sort_by("image_id")

    rep = maintain_table(root, "images")
    assert rep is not None and rep.encodings_applied == {"jpeg": STORED_AS_IS}
    after = lance.dataset(uri)
    assert after.schema.field("jpeg").metadata[b"lance-encoding:compression"] == b"none"
    assert after.schema.field("jpeg").metadata[b"doc"] == jpeg.metadata[b"doc"]  # the rest is kept
    assert len(after.get_fragments()) < 3  # compacted, the same values read back
    assert after.to_table().sort_by("image_id").equals(values)
    again = maintain_table(root, "images")
    assert again is not None and again.encodings_applied == {} and missing_encodings(after, IMAGES_SCHEMA) == {}

    # What the encoding does: a later append writes even compressible bytes as they are (Lance's
    # default writes these 400 KB of repeated bytes in under a kilobyte).
    old_ids = {f.fragment_id for f in after.get_fragments()}
    lance.write_dataset(pa.table({"image_id": ["z0", "z1"], "jpeg": [bytes(200_000), b"\1" * 200_000]}, schema=older), uri,
                        mode="append")
    new = [f for f in lance.dataset(uri).get_fragments() if f.fragment_id not in old_ids]
    written = sum((Path(uri) / "data" / d.path).stat().st_size
                  for f in new for d in f.data_files())
    assert written >= 400_000


def test_a_new_images_table_stores_its_image_bytes_as_they_are(tmp_path: Path) -> None:
    from prx_assets.core.lab.schema import IMAGES_SCHEMA
    from prx_assets.core.lab.table import missing_encodings, open_or_create

    ds = open_or_create(str(tmp_path / "images.lance"), IMAGES_SCHEMA)
    assert ds.schema.field("jpeg").metadata[b"lance-encoding:compression"] == b"none"
    assert missing_encodings(ds, IMAGES_SCHEMA) == {}
