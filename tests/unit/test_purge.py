"""A lab purge leaves no byte of the erased rows in any file of the table, and pins still open."""

import os
from pathlib import Path

import lance
import pyarrow as pa

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.purge import purge_lab
from prx_assets.core.lab.sql import open_pinned


def _files_holding(folder: Path, needle: bytes) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names
            if needle in Path(d, n).read_bytes()]


def test_purge_removes_rows_and_their_bytes_from_every_version_and_moves_pins(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "root"))
    uri = root.join("lance/images.lance")
    secret = b"SECRET-IMAGE-BYTES-" * 50
    ids = [f"{i:016x}" for i in range(6)]
    payload = [secret if i == 2 else f"other-{i}".encode() * 40 for i in range(6)]
    ds = lance.write_dataset(pa.table({"image_id": ids[:3], "jpeg": payload[:3]}), uri)
    ds = lance.write_dataset(pa.table({"image_id": ids[3:], "jpeg": payload[3:]}), uri, mode="append")
    ds.tags.create("subset-all-v2", 2)  # a curated subset's pin
    ds.tags.create("published", 1)
    lance.write_dataset(pa.table({"image_id": ["x"], "note": ["unrelated"]}), root.join("lance/other.lance"))
    assert _files_holding(tmp_path, secret)

    (report,) = purge_lab(root, [ids[2], "ffffffffffffffff"])
    assert report["table"] == "images" and report["rows_deleted"] == 1
    assert sorted(report["tags_moved"]) == ["published", "subset-all-v2"] and report["bytes_kept_until"] is None
    assert _files_holding(tmp_path, secret) == []
    pinned = open_pinned({"lance_uri": uri, "lance_version": 2})  # version 2 is gone: its pin moved
    assert sorted(pinned.to_table(columns=["image_id"]).column(0).to_pylist()) == sorted(set(ids) - {ids[2]})
    assert purge_lab(root, [ids[2]]) == []  # nothing left to purge
