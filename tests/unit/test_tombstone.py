"""Erased samples are blanked in the shards that hold them, and only there; streams stay whole."""

import os
from pathlib import Path

import numpy as np
from streaming import MDSWriter, StreamingDataset

from prx_assets.core.publish.integrity import check_stream
from prx_assets.core.publish.tombstone import blank_stream
from prx_assets.loader import release_shared_memory

COLUMNS = {"image": "bytes", "image_id": "str", "caption": "str", "width": "int32",
           "latent": "ndarray:float16:4,2", "meta": "json"}


def _write(out: Path, n: int, compression: str | None) -> None:
    with MDSWriter(out=str(out), columns=COLUMNS, compression=compression, hashes=["xxh64"], size_limit=4096) as w:
        for i in range(n):
            w.write({"image": bytes([i]) * 900, "image_id": f"{i:016x}", "caption": f"caption {i}", "width": 64 + i,
                     "latent": np.full((4, 2), i, np.float16), "meta": {"i": i}})


def _read(folder: Path) -> list[dict]:
    ds = StreamingDataset(local=str(folder), batch_size=1, shuffle=False)
    try:
        return [ds[i] for i in range(ds.num_samples)]
    finally:
        release_shared_memory(ds)


def test_blanking_rewrites_only_the_shards_holding_erased_samples(tmp_path: Path) -> None:
    for compression in (None, "zstd"):
        folder = tmp_path / f"s-{compression}"
        _write(folder, 12, compression)
        names = sorted(p.name for p in folder.iterdir() if p.name.startswith("shard."))
        before = {n: (folder / n).read_bytes() for n in names}
        gone = {f"{3:016x}", f"{4:016x}"}  # (no samples.parquet: ids read from the shards themselves)

        done = blank_stream(folder, gone)
        assert done is not None and done.positions == (3, 4) and done.shards_total > 2
        changed = [n for n in names if (folder / n).read_bytes() != before[n]]
        assert 1 <= len(changed) <= 2 and len(changed) == len(done.shards_rewritten)
        assert check_stream(str(folder)).corrupt == ()  # index.json hashes follow the new files
        samples = _read(folder)
        assert len(samples) == 12
        for i, s in enumerate(samples):
            if s["image_id"] in gone:
                assert s["image"] == b"" and s["caption"] == "" and s["width"] == 0 and s["meta"] == {}
                assert not s["latent"].any()
            else:
                assert s["image"] == bytes([i]) * 900 and s["caption"] == f"caption {i}"
        assert all(bytes([3]) * 900 not in p.read_bytes() for p in folder.iterdir() if p.is_file())
        assert blank_stream(folder, {"ffffffffffffffff"}) is None


def test_an_unreadable_shard_is_deleted_in_quarantine_and_refused_elsewhere(tmp_path: Path) -> None:
    import pytest

    from prx_assets.errors import PrxError

    for where in ("mds/all/set", "mds/all/.quarantine/set"):
        folder = tmp_path / where
        _write(folder, 12, None)
        first = folder / "shard.00000.mds"
        first.write_bytes(b"\0" * 8)  # truncated: no sample can be read
        if ".quarantine" in where:
            done = blank_stream(folder, {f"{0:016x}"})
            assert done is not None and "deleted" in done.shards_rewritten[0] and not first.exists()
        else:
            with pytest.raises(PrxError, match="doctor --verify --repair"):
                blank_stream(folder, {f"{0:016x}"})


def test_a_merged_index_over_compressed_parts_and_an_interrupted_erasure_leave_no_copy(tmp_path: Path) -> None:
    """A set's merged ``index.json`` names ``part-*/shard.*`` files; scratch left by an interrupted
    erasure (decoded bytes) goes with the next one."""
    from prx_assets.core.config.storage import DataRoot
    from prx_assets.core.publish.shards import merge_part_indexes
    from prx_assets.core.publish.tombstone import blank_streams

    root = DataRoot(str(tmp_path / "root"))
    folder = tmp_path / "root" / "mds" / "all" / "set"
    _write(folder / "part-00000", 6, "zstd")
    merge_part_indexes(folder, [folder / "part-00000"])
    leftover = folder / ".erase-x"
    leftover.mkdir()
    (leftover / "shard.00000.mds").write_bytes(bytes([2]) * 900)
    done = blank_streams(root, {f"{2:016x}"})
    assert not leftover.exists()
    assert {os.path.relpath(e.stream, folder) for e in done} == {".", "part-00000"}
    assert sum(len(e.shards_rewritten) for e in done) == 1  # the shared file, once
    assert check_stream(str(folder)).corrupt == () and check_stream(str(folder / "part-00000")).corrupt == ()
    assert [s["image"] for s in _read(folder)][2] == b""
