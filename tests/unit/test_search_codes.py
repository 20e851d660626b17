"""Kept search codes (core/curate/search_codes.py): the same subsets as reading every vector, and
codes that follow the Lance data files, so a rewritten column is never read from stale codes."""

from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.multi_index import SearchModels
from prx_assets.core.curate.recipes import Dedup, Recipe
from prx_assets.core.curate.search_codes import SearchCodesError, codes_key, search_codes
from prx_assets.core.curate.selection import Subset, select
from tests.unit.test_curation import _vector_lab
from tests.unit.test_dedup import spread_pairs

DIM = 64


def _lab(uri: str, vecs: np.ndarray, first: int = 0, mode: str = "create", **kw: Any) -> None:
    """A lab-shaped table of half-float vectors with stable row ids, as the lab's (see :func:`_vector_lab`)."""
    _vector_lab(uri, vecs, first, mode, value_type=np.float16, stable_row_ids=True, **kw)


RECIPE = Recipe(name="r", dedup=Dedup(exact=True, embedding_threshold=0.95))


def _cut(uri: str, root: DataRoot | None, models: SearchModels | None = None) -> Subset:
    return select(lance.dataset(uri), RECIPE, embedding_column="emb", search_models=models,
                  search_codes=search_codes(root, "emb") if root is not None else None)


def _rewrite(uri: str, fragment: int, vectors: np.ndarray) -> None:
    """Write ``vectors`` over one fragment's ``emb`` column in place, as the lab sync's
    ``update_columns`` does (a new data file for the fragment)."""
    ds = lance.dataset(uri)
    frag = ds.get_fragment(fragment)
    rowids = frag.to_table(columns=["image_id"], with_row_id=True).column("_rowid")
    up = pa.table({"_rowid": rowids, "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.ravel().astype(np.float16)), DIM)})
    meta, fields = frag.update_columns(up)
    lance.LanceDataset.commit(uri, lance.LanceOperation.Update(updated_fragments=[meta], fields_modified=fields),
                              read_version=ds.version)


def _same(a: Subset, b: Subset) -> None:
    assert a.image_ids == b.image_ids and a.dropped == b.dropped and a.content_hash == b.content_hash


def test_kept_codes_give_the_same_subset_and_follow_the_data_files(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Codes are computed once per data file and read on later cuts; a new batch computes its own
    file only; a column rewritten in place (the lab sync's ``update_columns``) gets a new data file,
    so its codes are computed again and the old file's are deleted; deletions reuse what is kept.
    Every cut equals one that reads every vector."""
    import prx_assets.core.curate.selection as selection

    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    vecs, _ = spread_pairs(4_000, DIM, seed=7)
    _lab(uri, vecs)

    cold = _cut(uri, root)
    _same(cold, _cut(uri, None))
    assert cold.dropped["dedup_embedding"] > 300
    assert cold.work["search_codes"] == {"kept": 0, "computed": 4, "rows_computed": 4_000, "pruned": 0}
    warm = _cut(uri, root)
    _same(warm, cold)
    assert warm.work["search_codes"] == {"kept": 4, "computed": 0, "rows_computed": 0, "pruned": 0}

    new = np.random.default_rng(8).standard_normal((300, DIM)).astype(np.float32)
    new[1::2] = new[0::2] + 0.01 * new[1::2]  # near copies among the new rows
    _lab(uri, new / np.linalg.norm(new, axis=1, keepdims=True), first=10**6, mode="append")
    grown = _cut(uri, root)
    _same(grown, _cut(uri, None))
    assert grown.work["search_codes"] == {"kept": 4, "computed": 1, "rows_computed": 300, "pruned": 0}
    assert grown.dropped["dedup_embedding"] >= cold.dropped["dedup_embedding"] + 140

    # Rewrite fragment 2's vectors in place: every row a near copy of the row before it in fragment 1.
    _rewrite(uri, 2, vecs[1_000:2_000] + 0.001 * vecs[2_000:3_000])
    rewritten = _cut(uri, root)
    _same(rewritten, _cut(uri, None))
    assert rewritten.dropped["dedup_embedding"] > grown.dropped["dedup_embedding"] + 800  # stale codes would miss these
    assert rewritten.work["search_codes"] == {"kept": 4, "computed": 1, "rows_computed": 1_000, "pruned": 1}

    ds = lance.dataset(uri)
    ds.delete("image_id < '000000000100'")
    deleted = _cut(uri, root)
    _same(deleted, _cut(uri, None))
    assert deleted.work["search_codes"] == {"kept": 5, "computed": 0, "rows_computed": 0, "pruned": 0}

    _lab(uri, vecs[:500], first=2 * 10**6, mode="append", with_vectors=False)  # no vectors yet: no codes
    unsynced = _cut(uri, root)
    _same(unsynced, _cut(uri, None))
    assert unsynced.work["search_codes"] == {"kept": 5, "computed": 0, "rows_computed": 0, "pruned": 0}
    assert unsynced.count == deleted.count + 500  # rows without a vector are never embedding duplicates

    older = select(lance.dataset(uri, version=1), RECIPE, embedding_column="emb", search_codes=search_codes(root, "emb"))
    assert older.work["search_codes"]["pruned"] == 0  # a cut of an older version deletes nothing
    _same(older, cold)
    assert _cut(uri, root).work["search_codes"]["pruned"] == 1  # the codes the older cut computed again
    gone = tmp_path / "data" / layout.search_codes_dir("emb_of_a_dropped_embedder") / "k" / "f.npz"
    gone.parent.mkdir(parents=True)
    gone.write_bytes(b"codes of a column the lab no longer has")
    assert _cut(uri, root).work["search_codes"]["pruned"] == 1 and not gone.exists()

    key = codes_key(np.zeros(0))  # another map's key: no kept file is filed under it
    kept = sorted((tmp_path / "data" / layout.search_codes_dir("emb")).rglob("*.npz"))
    assert kept and all(p.parent.name != key for p in kept)
    kept[0].write_bytes(b"not codes")
    with pytest.raises(SearchCodesError, match=str(kept[0])):
        _cut(uri, root)


def test_small_cuts_compare_every_pair_and_keep_no_codes(tmp_path: Path) -> None:
    """Below the exact method's size every pair is compared on the vectors: no codes are read or kept."""
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    vecs, _ = spread_pairs(500, DIM, seed=9)
    _lab(uri, vecs)
    sub = _cut(uri, root)
    _same(sub, _cut(uri, None))
    assert "search_codes" not in sub.work
    assert not (tmp_path / "data" / layout.search_codes_dir("emb")).exists()


def test_kept_codes_on_an_s3_data_root(tmp_path: Path, s3_env: dict[str, str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab and the kept codes, cells and pairs on the moto S3 endpoint: kept, read back, deleted
    with their data file (the pairs searched again for a compacted file's rows)."""
    import prx_assets.core.curate.selection as selection
    from prx_assets.core.curate.search_pairs import search_pairs

    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)
    root = DataRoot(f"s3://{s3_env['BUCKET']}/data")
    uri = root.join("lance/lab.lance")
    vecs, _ = spread_pairs(2_000, DIM, seed=11)
    _lab(uri, vecs, storage_options=root.storage_options())
    models = SearchModels.in_memory()

    def cut(codes: bool) -> Subset:
        return select(lance.dataset(uri, storage_options=root.storage_options()), RECIPE, embedding_column="emb",
                      search_codes=search_codes(root, "emb") if codes else None, search_models=models,
                      search_pairs=search_pairs(root, "r") if codes else None)

    first = cut(True)
    assert first.work["search_codes"] == {"kept": 0, "computed": 2, "rows_computed": 2_000, "pruned": 0,
                                          "cells_computed": 4}
    assert len(root.list(layout.search_codes_dir("emb"))) == 2 + 4  # codes, and cells in 2 tables
    again = cut(True)
    # every pair is kept and no row is new: no cells are read
    assert again.work["search_codes"] == {"kept": 2, "computed": 0, "rows_computed": 0, "pruned": 0}
    _same(first, again)
    _same(first, cut(False))
    assert first.work["search_pairs"]["rows_new"] == 2_000 and again.work["search_pairs"]["rows_new"] == 0
    assert len(root.list(layout.search_model("r", "", 0).rpartition("/")[0])) == 1  # one kept pairs file
    ds = lance.dataset(uri, storage_options=root.storage_options())
    ds.optimize.compact_files(target_rows_per_fragment=4_000)  # one new fragment, one new data file
    compacted = cut(True)
    assert compacted.work["search_codes"] == {"kept": 0, "computed": 1, "rows_computed": 2_000, "pruned": 6,
                                              "cells_computed": 2}
    _same(compacted, first)
    assert compacted.work["search_pairs"]["rows_new"] == 2_000
    assert len(root.list(layout.search_codes_dir("emb"))) == 1 + 2


def test_kept_cells_give_the_same_pairs_and_follow_the_data_files(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With a kept search model, each row's cells in its tables are kept beside its codes: computed
    once per data file and table, read on later cuts, computed for a new batch's file only, and
    deleted with their data file. Every cut equals one that files every row again under the same model."""
    import prx_assets.core.curate.selection as selection

    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    vecs, _ = spread_pairs(3_000, DIM, seed=7)  # + 300 rows stay in its size generation
    _lab(uri, vecs)
    models = SearchModels.in_memory()

    def cells(sub: Subset) -> tuple[int, int]:
        return sub.work["search_codes"].get("cells_kept", 0), sub.work["search_codes"].get("cells_computed", 0)

    cold = _cut(uri, root, models)
    assert models.trained and cells(cold) == (0, 6)  # 3 data files x 2 tables
    _same(cold, _cut(uri, None, models))
    assert cold.dropped["dedup_embedding"] > 200
    folder = tmp_path / "data" / layout.search_codes_dir("emb")
    assert len(list(folder.rglob("*.cells-*.npy"))) == 6
    warm = _cut(uri, root, models)
    _same(warm, cold)
    assert cells(warm) == (6, 0)

    new = np.random.default_rng(8).standard_normal((300, DIM)).astype(np.float32)
    new[1::2] = new[0::2] + 0.01 * new[1::2]
    _lab(uri, new / np.linalg.norm(new, axis=1, keepdims=True), first=10**6, mode="append")
    grown = _cut(uri, root, models)
    assert cells(grown) == (6, 2)  # only the new batch's file is filed
    _same(grown, _cut(uri, None, models))
    assert grown.dropped["dedup_embedding"] >= cold.dropped["dedup_embedding"] + 140

    ds = lance.dataset(uri)
    ds.optimize.compact_files(target_rows_per_fragment=10_000)  # one new data file: its cells computed
    compacted = _cut(uri, root, models)
    assert cells(compacted) == (0, 2) and compacted.work["search_codes"]["pruned"] == 4 * 3  # codes + 2 cells each
    _same(compacted, grown)
    assert len(list(folder.rglob("*.cells-*.npy"))) == 2

    kept = sorted(folder.rglob("*.cells-*.npy"))[0]
    kept.write_bytes(b"not cells")
    with pytest.raises(SearchCodesError, match=str(kept)):
        _cut(uri, root, models)


def test_kept_pairs_give_the_same_subset_as_a_whole_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With kept search pairs a cut searches only pairs with a row no earlier cut searched: none
    when nothing changed, a new batch's rows (near copies of earlier rows among them), the rows of a
    data file rewritten in place or compacted; rows deleted since leave their pairs out. Every cut
    equals one that searches every pair with the same model. A cut of an older version keeps
    nothing; a kept file that cannot be read is an error naming it."""
    import prx_assets.core.curate.selection as selection
    from prx_assets.core.curate.search_pairs import search_pairs

    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    vecs, _ = spread_pairs(3_000, DIM, seed=7)
    _lab(uri, vecs)
    models = SearchModels.in_memory()
    pairs = search_pairs(root, "r")

    def cut(version: int | None = None) -> Subset:
        ds = lance.dataset(uri, version=version)
        sub = select(ds, RECIPE, embedding_column="emb", search_models=models, search_codes=search_codes(root, "emb"),
                     search_pairs=pairs)
        whole = select(ds, RECIPE, embedding_column="emb", search_models=models,
                       search_codes=search_codes(root, "emb"))
        _same(sub, whole)
        assert "search_pairs" not in whole.work
        return sub

    cold = cut()
    assert cold.work["search_pairs"]["rows_new"] == 3_000 and cold.work["search_pairs"]["kept"]
    assert cold.dropped["dedup_embedding"] > 200
    warm = cut()
    assert warm.work["search_pairs"] == {"rows_new": 0, "pairs_kept": warm.work["search_pairs"]["pairs_kept"],
                                         "pairs_found": 0, "kept": True}
    assert warm.work["search_pairs"]["pairs_kept"] >= cold.dropped["dedup_embedding"]
    _same(warm, cold)

    rng = np.random.default_rng(8)
    src = rng.choice(3_000, 200, replace=False)
    near = vecs[src] + 0.05 * rng.standard_normal((200, DIM)).astype(np.float32) / np.sqrt(DIM)
    _lab(uri, near / np.linalg.norm(near, axis=1, keepdims=True), first=10**6, mode="append")
    grown = cut()
    assert grown.work["search_pairs"]["rows_new"] == 200 and grown.work["search_pairs"]["pairs_found"] >= 150
    assert grown.dropped["dedup_embedding"] >= cold.dropped["dedup_embedding"] + 150  # new rows that copy old ones

    _rewrite(uri, 1, vecs[:1_000] + 0.001 * vecs[1_000:2_000])  # fragment 1: near copies of fragment 0
    rewritten = cut()
    assert rewritten.work["search_pairs"]["rows_new"] == 1_000
    assert rewritten.dropped["dedup_embedding"] > grown.dropped["dedup_embedding"] + 800

    lance.dataset(uri).delete("image_id < '000000000100'")
    deleted = cut()
    assert deleted.work["search_pairs"]["rows_new"] == 0

    older = cut(version=1)
    assert older.work["search_pairs"]["kept"] is False  # nothing kept from an older version
    _same(older, cold)
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=10_000)
    compacted = cut()
    assert compacted.work["search_pairs"]["rows_new"] == compacted.count + compacted.dropped["dedup_embedding"]
    _same(compacted, deleted)
    kept = sorted((tmp_path / "data").rglob("pairs-*.npz"))
    assert len(kept) == 1
    kept[0].write_bytes(b"not pairs")
    with pytest.raises(SearchCodesError, match=str(kept[0])):
        cut()
