"""Kept content digests (core/curate/kept_digests.py): the same subsets, drops and ids as hashing
every candidate, and digests that follow the Lance data files, so re-written captions are never
read from stale digests."""

from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.kept_digests import KeptDigestsError, hex_to_bytes, kept_digests
from prx_assets.core.curate.phash_pairs import phash_pairs_kept
from prx_assets.core.curate.recipes import Dedup, Recipe
from prx_assets.core.curate.selection import Subset, select
from prx_assets.core.hexdigits import bytes_hex

CAPTION = "caption__c_1"
RECIPE = Recipe(name="r", captions=("c-1",), dedup=Dedup(exact=True, phash_distance=2))
NO_CAPTIONS = Recipe(name="plain", dedup=Dedup(exact=True))


def _captions(first: int, n: int, tag: str) -> list[str | None]:
    """Plain texts, texts JSON must escape (quotes, non-ASCII), empty texts and nulls."""
    out: list[str | None] = []
    for i in range(first, first + n):
        k = i % 10
        out.append(None if k == 0 else "" if k == 1 else f'a "quoted" {tag} {i}' if k == 2
                   else f"café {tag} {i}" if k == 3 else f"a photo {tag} {i}")
    return out


def _lab(uri: str, first: int, n: int, mode: str = "create", **kw: object) -> None:
    """A lab-shaped table with one caption column, 500 rows a fragment, stable row ids; every 7th row
    repeats an earlier original (exact duplicates)."""
    ids = [f"{first + i:012x}" for i in range(n)]
    sha = [f"{(first + i) if i % 7 else first:064x}" for i in range(n)]
    t = pa.table({"image_id": ids, "uri": [f"/d/{i}.jpg" for i in ids], "sha256": sha,
                  "ingest_config": ["q92"] * n,
                  "phash": pa.array(np.arange(first, first + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)),
                  "width": pa.array(np.full(n, 512), pa.int32()), "height": pa.array(np.full(n, 512), pa.int32()),
                  "aspect_bucket": ["1:1"] * n, CAPTION: pa.array(_captions(first, n, "v1"), pa.string())})
    lance.write_dataset(t, uri, mode=mode, max_rows_per_file=500, enable_stable_row_ids=True, **kw)


def _cut(ds: lance.LanceDataset, root: DataRoot | None, recipe: Recipe = RECIPE) -> Subset:
    """A cut with the digests and pHash pairs kept under ``root`` (``None``: nothing kept)."""
    return select(ds, recipe, ["c-1"], digests=kept_digests(root) if root is not None else None,
                  phash_pairs=phash_pairs_kept(root, recipe.name) if root is not None else None)


def _same(a: Subset, b: Subset) -> None:
    assert a.image_ids == b.image_ids and a.digests == b.digests
    assert a.dropped == b.dropped and a.content_hash == b.content_hash


def _recaption(uri: str, fragment: int, tag: str) -> None:
    """Write new captions over one fragment in place, as the lab sync's ``update_columns`` does."""
    ds = lance.dataset(uri)
    frag = ds.get_fragment(fragment)
    t = frag.to_table(columns=["image_id"], with_row_id=True)
    first = int(t.column("image_id")[0].as_py(), 16)
    up = pa.table({"_rowid": t.column("_rowid"), CAPTION: pa.array(_captions(first, t.num_rows, tag), pa.string())})
    meta, fields = frag.update_columns(up)
    lance.LanceDataset.commit(uri, lance.LanceOperation.Update(updated_fragments=[meta], fields_modified=fields),
                              read_version=ds.version)


def test_hex_digests_round_trip() -> None:
    digests = pa.array(["0123456789abcdef", "ffffffffffffffff", "0000000000000000"])
    assert bytes_hex(hex_to_bytes(digests)).equals(digests)
    with pytest.raises(KeptDigestsError, match=r"16 lowercase hex digits; 'abc' \(row 0\)"):
        hex_to_bytes(pa.array(["abc"]))
    with pytest.raises(KeptDigestsError, match="0123456789ABCDEF"):
        hex_to_bytes(pa.array(["0123456789ABCDEF"]))


def test_kept_digests_give_the_same_subsets_and_follow_the_data_files(tmp_path: Path) -> None:
    """Digests are computed once per fragment's data files and read on later cuts; re-written captions
    (a new data file) are hashed again and the old file's digests deleted; a new batch, deletions, a
    compaction, an older version and a recipe without caption columns all give what hashing every
    candidate gives."""
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    _lab(uri, 0, 2_000)

    cold = _cut(lance.dataset(uri), root)
    _same(cold, _cut(lance.dataset(uri), None))
    assert cold.dropped["no_caption"] == 400 and cold.dropped["dedup_exact"] > 100
    assert cold.work["digests"] == {"kept": 0, "computed": 4, "rows_computed": 2_000, "pruned": 0}
    warm = _cut(lance.dataset(uri), root)
    _same(warm, cold)
    assert warm.work["digests"] == {"kept": 4, "computed": 0, "rows_computed": 0, "pruned": 0}

    _recaption(uri, 1, "v2")  # fragment 1's captions re-written in place: a new data file
    recaptioned = _cut(lance.dataset(uri), root)
    _same(recaptioned, _cut(lance.dataset(uri), None))
    assert recaptioned.content_hash != cold.content_hash  # stale digests would keep the old id
    assert recaptioned.work["digests"] == {"kept": 3, "computed": 1, "rows_computed": 500, "pruned": 1}

    _lab(uri, 10**6, 700, mode="append")
    grown = _cut(lance.dataset(uri), root)
    _same(grown, _cut(lance.dataset(uri), None))
    assert grown.work["digests"] == {"kept": 4, "computed": 2, "rows_computed": 700, "pruned": 0}

    lance.dataset(uri).delete("image_id < '000000000100'")
    deleted = _cut(lance.dataset(uri), root)
    _same(deleted, _cut(lance.dataset(uri), None))
    assert deleted.work["digests"]["computed"] == 0

    plain = _cut(lance.dataset(uri), root, NO_CAPTIONS)  # no caption columns: a folder of its own
    _same(plain, _cut(lance.dataset(uri), None, NO_CAPTIONS))
    assert plain.work["digests"]["computed"] == 6
    assert len(root.list(layout.kept_digests_dir("_none"))) == 6
    assert _cut(lance.dataset(uri), root).work["digests"]["kept"] == 6  # the caption recipe's files stay

    older = _cut(lance.dataset(uri, version=1), root)  # fragment 1's first captions: hashed again, none deleted
    _same(older, cold)
    assert older.work["digests"] == {"kept": 3, "computed": 1, "rows_computed": 500, "pruned": 0}

    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=10_000)
    compacted = _cut(lance.dataset(uri), root)
    _same(compacted, _cut(lance.dataset(uri), None))
    assert compacted.work["digests"]["computed"] == 1 and compacted.work["digests"]["pruned"] == 7
    assert compacted.content_hash == deleted.content_hash  # the same content: the same subset id


def test_rows_a_kept_file_does_not_know_are_hashed_and_merged(tmp_path: Path) -> None:
    """Digests kept after a deletion know only the live rows; a cut of the version before it asks for
    the deleted ones, so the fragment is hashed again and the two merged (the same data files give
    the same values), and a file that cannot be read is an error naming it."""
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    _lab(uri, 0, 1_000)
    lance.dataset(uri).delete("image_id < '000000000040'")
    after = _cut(lance.dataset(uri), root)
    assert after.work["digests"] == {"kept": 0, "computed": 2, "rows_computed": 1_000, "pruned": 0}
    before = _cut(lance.dataset(uri, version=1), root)
    _same(before, _cut(lance.dataset(uri, version=1), None))
    assert before.work["digests"] == {"kept": 2, "computed": 1, "rows_computed": 500, "pruned": 0}
    assert _cut(lance.dataset(uri, version=1), root).work["digests"]["computed"] == 0  # merged and kept

    kept = sorted(root.list(layout.kept_digests_dir(CAPTION)))
    assert len(kept) == 2
    (tmp_path / "data" / kept[0]).write_bytes(b"not digests")
    with pytest.raises(KeptDigestsError, match=kept[0].rpartition("/")[2]):
        _cut(lance.dataset(uri), root)


def test_digests_of_dropped_caption_columns_are_deleted(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    _lab(uri, 0, 600)
    gone = tmp_path / "data" / layout.kept_digests("caption__gone+caption__c_1", "k")
    gone.parent.mkdir(parents=True)
    gone.write_bytes(b"digests over a caption column the lab no longer has")
    assert _cut(lance.dataset(uri), root).work["digests"]["pruned"] == 1 and not gone.exists()


def test_kept_digests_on_an_s3_data_root(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """The lab, the kept digests and pHash pairs on the moto S3 endpoint: kept, read back (the digests
    ahead of the scan), the digests deleted with their data files."""
    root = DataRoot(f"s3://{s3_env['BUCKET']}/data")
    uri = root.join("lance/lab.lance")
    _lab(uri, 0, 1_500, storage_options=root.storage_options())

    def ds() -> lance.LanceDataset:
        return lance.dataset(uri, storage_options=root.storage_options())

    first = _cut(ds(), root)
    _same(first, _cut(ds(), None))
    assert first.work["digests"]["computed"] == 3
    again = _cut(ds(), root)
    _same(again, first)
    assert again.work["digests"] == {"kept": 3, "computed": 0, "rows_computed": 0, "pruned": 0}
    assert first.work["phash_pairs"]["hashes_new"] > 1_000 and again.work["phash_pairs"]["hashes_new"] == 0
    assert root.list(layout.phash_pairs("r", 1, 2).rpartition("/")[0]) == [layout.phash_pairs("r", 1, 2)]
    ds().optimize.compact_files(target_rows_per_fragment=10_000)
    compacted = _cut(ds(), root)
    _same(compacted, first)
    assert compacted.work["digests"] == {"kept": 0, "computed": 1, "rows_computed": 1_500, "pruned": 3}
