"""Lab sync by change: after a column's first sync, only source rows written since are joined."""

from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.changes import SyncState, differs
from prx_assets.core.lab.sync import caption_column, embedding_column, sync_lab
from prx_assets.core.lab.table import table_uri
from tests.unit.test_lab import DIM, add_captions, add_embeddings, build


@pytest.fixture
def lab(tmp_path: Path) -> tuple[DataRoot, list[dict]]:
    root = DataRoot(str(tmp_path / "root"))
    rows = sorted(build(root, tmp_path / "photos", n=12, batch_size=4), key=lambda r: r["image_id"])
    add_captions(root, rows, "c-1", "a photo")
    add_embeddings(root, rows, "e-1", np.eye(len(rows), DIM, dtype=np.float32))
    return root, rows


def _images(root: DataRoot) -> lance.LanceDataset:
    return lance.dataset(table_uri(root, "images"))


def _column(root: DataRoot, column: str) -> dict[str, object]:
    t = _images(root).to_table(columns=["image_id", column])
    return dict(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


def test_a_sync_joins_only_what_changed(lab) -> None:
    root, rows = lab
    cap, emb = caption_column("c-1"), embedding_column("e-1")
    first = sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    assert first.modes == {cap: "full", emb: "full"} and first.rows_updated == {cap: 12, emb: 12}
    assert set(SyncState.read(root).columns) == {cap, emb}

    # Nothing written since: nothing compared, nothing committed.
    version = _images(root).version
    again = sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    assert again.modes == {cap: "changes", emb: "changes"} and again.rows_updated == {cap: 0, emb: 0}
    assert _images(root).version == version

    # The same captions written again (a re-run): read as changed rows, equal, so no commit.
    add_captions(root, rows, "c-1", "a photo")
    assert sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"]).rows_updated[cap] == 0
    assert _images(root).version == version

    # Two new captions and one new vector: exactly those rows are rewritten.
    add_captions(root, rows[3:5], "c-1", "a recaptioned photo")
    vec = np.zeros((1, DIM), np.float32)
    vec[0, -1] = 1.0
    add_embeddings(root, rows[7:8], "e-1", vec)
    res = sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    assert res.modes == {cap: "changes", emb: "changes"} and res.rows_updated == {cap: 2, emb: 1}
    caps = _column(root, cap)
    assert caps[rows[3]["image_id"]].startswith("a recaptioned photo") and caps[rows[0]["image_id"]].startswith("a photo")
    assert _column(root, emb)[rows[7]["image_id"]][-1] == 1.0


def test_an_image_ingested_again_gets_its_caption_back(lab) -> None:
    """Deleted from the lab and inserted again (a file that went missing and came back): its caption
    row did not change, yet the sync restores the column from it."""
    root, rows = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    gone = rows[2]["image_id"]
    images = _images(root)
    row = images.to_table(filter=f"image_id = '{gone}'").drop_columns([cap])
    images.delete(f"image_id = '{gone}'")
    images = _images(root)
    images.merge_insert("image_id").when_not_matched_insert_all().execute(row)
    assert _column(root, cap)[gone] is None
    res = sync_lab(root, captioner_ids=["c-1"])
    assert res.modes[cap] == "changes" and res.rows_updated[cap] == 1
    assert _column(root, cap)[gone].startswith("a photo")


def test_a_table_restored_to_an_older_version_is_compared_whole(lab) -> None:
    root, _ = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    state = SyncState.read(root)
    SyncState(columns={cap: state.columns[cap] + 100}, images_version=state.images_version).write(root)
    assert sync_lab(root, captioner_ids=["c-1"]).modes[cap] == "full"


def test_tables_without_row_versions_sync_in_full(tmp_path: Path) -> None:
    """Tables created before row versions were tracked still sync correctly, comparing everything."""
    from prx_assets.core.lab.schema import CAPTIONS_SCHEMA, CAPTIONS_TABLE

    root = DataRoot(str(tmp_path / "root"))
    rows = build(root, tmp_path / "photos", n=4, batch_size=4)
    t = pa.Table.from_pylist([{"image_id": r["image_id"], "captioner_id": "c-1", "batch": r["batch"],
                               "sha256": r["sha256"], "caption": "old style", "tokens": 1, "seconds": 0.1,
                               "hit_max_tokens": False, "model": "m"} for r in rows], schema=CAPTIONS_SCHEMA)
    lance.write_dataset(t, table_uri(root, CAPTIONS_TABLE))  # no stable row ids
    first = sync_lab(root, captioner_ids=["c-1"])
    second = sync_lab(root, captioner_ids=["c-1"])
    cap = caption_column("c-1")
    assert first.rows_updated[cap] == 4 and second.modes[cap] == "full" and second.rows_updated[cap] == 0


def test_vector_comparison_is_vectorized_and_null_aware() -> None:
    t = pa.list_(pa.float16(), 2)
    cur = pa.array([[1, 2], None, [3, 4], None, [float("nan"), 1]], t)
    new = pa.array([[1, 2], [0, 0], [3, 5], None, [float("nan"), 1]], t)
    assert differs(cur, new).to_pylist() == [False, True, True, False, False]
    assert differs(pa.array(["a", None, None]), pa.array(["a", None, "b"])).to_pylist() == [False, False, True]


def test_a_full_comparison_finds_exactly_the_rows_that_differ(lab) -> None:
    """Two scans into key/value digests, then the differing rows read by id: the same rows as
    comparing every value (changed captions and vectors, none of the unchanged), with addresses."""
    from prx_assets.core.lab.changes import full_differences

    root, rows = lab
    cap, emb = caption_column("c-1"), embedding_column("e-1")
    sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    add_captions(root, rows[2:5], "c-1", "changed")
    vecs = np.eye(len(rows), DIM, dtype=np.float32)
    vecs[7] = vecs[8]
    add_embeddings(root, rows, "e-1", vecs)  # every row re-written, one value changed
    images = _images(root)
    captions = lance.dataset(table_uri(root, "captions"))
    got = pa.concat_tables(full_differences(captions, "caption", "captioner_id = 'c-1'", images, cap, pa.string()))
    assert sorted(got.column("image_id").to_pylist()) == sorted(r["image_id"] for r in rows[2:5])
    assert all(v.startswith("changed") for v in got.column(cap).to_pylist())
    addr = dict(zip(*images.to_table(columns=["image_id"], with_row_address=True).to_pydict().values(), strict=True))
    assert all(addr[i] == a for i, a in zip(*got.select(["image_id", "_rowaddr"]).to_pydict().values(), strict=True))
    embeddings = lance.dataset(table_uri(root, "embeddings_e-1"))
    field = images.schema.field(emb).type
    got = pa.concat_tables(full_differences(embeddings, "embedding", None, images, emb, field))
    assert got.column("image_id").to_pylist() == [rows[7]["image_id"]]


def test_a_full_comparison_handles_ids_of_any_form(tmp_path: Path) -> None:
    """Ids that are not 16 hex digits are keyed by a hash and found by a scan of the source's ids."""
    from prx_assets.core.lab.changes import full_differences, key64

    ids = [f"img-{i}" for i in range(50)] + [f"{i:016x}" for i in range(50)]
    lab = lance.write_dataset(pa.table({"image_id": ids, "c": ["old"] * 100}), str(tmp_path / "lab.lance"))
    src = lance.write_dataset(pa.table({"image_id": ids, "v": ["old"] * 90 + ["new"] * 10}), str(tmp_path / "s.lance"))
    assert len(set(key64(pa.array(ids)).tolist())) == 100
    got = pa.concat_tables(full_differences(src, "v", None, lab, "c", pa.string(), chunk=3))
    assert sorted(got.column("image_id").to_pylist()) == sorted(ids[90:]) and set(got.column("c").to_pylist()) == {"new"}


@pytest.mark.parametrize("whole_rows", [False, True])
def test_a_few_changed_rows_go_the_cheaper_way_and_keep_indexes_for_the_rest(lab, monkeypatch: pytest.MonkeyPatch,
                                                                             whole_rows: bool) -> None:
    """One changed caption in a small fragment of real images: rewriting the caption column of that
    fragment in place writes far fewer bytes than the row (its JPEG included), so the JPEG's data
    files stay and only the caption index stops covering that fragment. Forced the other way (what
    a row among many small rows gets), the row moves to a new fragment and every index stays valid
    for all other rows."""
    from prx_assets.core.lab import changes
    from prx_assets.core.lab.sync import index_coverage

    root, rows = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    before = {c["name"]: c for c in index_coverage(_images(root))}
    assert before[f"{cap}_idx"]["unindexed_rows"] == 0
    fragments = len(_images(root).get_fragments())
    jpeg_files = jpeg_data_files(_images(root))
    if whole_rows:
        monkeypatch.setattr(changes, "route_by_fragment",
                            lambda images, changed: {f.fragment_id for f in images.get_fragments()})
    add_captions(root, rows[6:7], "c-1", "one new caption")
    merged: list[dict] = []
    import prx_assets.core.lab.sync as sync_module

    real = sync_module.ensure_indexes

    def spy(ds: lance.LanceDataset, *args: object, **kwargs: object) -> list[str]:
        merged.extend(index_coverage(ds))
        return real(ds, *args, **kwargs)

    monkeypatch.setattr(sync_module, "ensure_indexes", spy)
    res = sync_lab(root, captioner_ids=["c-1"])
    assert res.rows_updated[cap] == 1 and res.indexes_created == []
    seen = {c["name"]: c for c in merged}  # coverage after the write, before any fold
    if whole_rows:
        assert len(_images(root).get_fragments()) == fragments + 1  # the row moved to a new fragment
        assert seen[f"{cap}_idx"]["indexed_rows"] == 11 and seen[f"{cap}_idx"]["unindexed_rows"] == 1
        assert seen["image_id_idx"]["indexed_rows"] == 11
    else:
        assert len(_images(root).get_fragments()) == fragments
        assert jpeg_data_files(_images(root)) == jpeg_files  # no image byte written again
        per_fragment = 12 // fragments
        assert seen[f"{cap}_idx"]["unindexed_rows"] == per_fragment  # that fragment only
        assert seen["image_id_idx"]["indexed_rows"] == 12
    assert _column(root, cap)[rows[6]["image_id"]].startswith("one new caption")
    assert _images(root).count_rows() == 12
    hits = _images(root).to_table(columns=["image_id"], full_text_query="one new caption")
    assert rows[6]["image_id"] in hits.column(0).to_pylist()  # unindexed rows are still searched


def jpeg_data_files(ds: lance.LanceDataset) -> set[str]:
    """Paths of the data files holding the ``jpeg`` column."""
    field = next(f.id() for f in ds.lance_schema.fields() if f.name() == "jpeg")
    return {df.path for f in ds.get_fragments() for df in f.data_files() if field in list(df.fields)}


def test_whole_rows_where_few_rows_of_a_large_fragment_change(tmp_path: Path) -> None:
    """The byte rule: 3 changed rows of a 5,000-row fragment (2 KB images) are cheaper rewritten
    whole than the caption column of all 5,000; all 5,000 rows changed are cheaper as the column."""
    from prx_assets.core.lab.changes import route_by_fragment

    n = 5000
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, 2048, dtype=np.uint8).tobytes() for _ in range(n)]  # incompressible
    ds = lance.write_dataset(pa.table({"image_id": [f"{i:05d}" for i in range(n)], "c": ["x" * 40] * n,
                                       "jpeg": images}), str(tmp_path / "t.lance"))
    few = pa.table({"image_id": ["00001", "00002", "00003"], "c": ["y" * 40] * 3,
                    "_rowaddr": pa.array([1, 2, 3], pa.uint64())})
    assert route_by_fragment(ds, {"c": few}) == {0}
    every = pa.table({"image_id": [f"{i:05d}" for i in range(n)], "c": ["y" * 40] * n,
                      "_rowaddr": pa.array(np.arange(n), pa.uint64())})
    assert route_by_fragment(ds, {"c": every}) == set()


def test_an_image_whose_caption_and_vector_changed_is_rewritten_once(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync by change compares every column's changes in one lookup and rewrites each changed row
    whole once, with all its changed columns set (one merge, not one per column)."""
    from prx_assets.core.lab import changes

    root, rows = lab
    cap, emb = caption_column("c-1"), embedding_column("e-1")
    sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    monkeypatch.setattr(changes, "route_by_fragment",  # every change as whole rows (what tiny rows get)
                        lambda images, changed: {f.fragment_id for f in images.get_fragments()})
    monkeypatch.setattr(changes, "ROWS_MODE_SHARE", 1.0)  # 2 of 12 rows is a large share of this small lab
    merges: list[int] = []
    real = lance.LanceDataset.merge_insert

    def counting(self: lance.LanceDataset, *a: object, **kw: object) -> object:
        merges.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "merge_insert", counting)
    add_captions(root, rows[3:5], "c-1", "both changed")
    vecs = np.eye(len(rows), DIM, dtype=np.float32)
    vecs[3:5] = vecs[0]
    add_embeddings(root, rows[3:5], "e-1", vecs[3:5])
    merges.clear()
    res = sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    assert res.modes == {cap: "changes", emb: "changes"} and res.rows_updated == {cap: 2, emb: 2}
    assert len(merges) == 1
    got = _images(root).to_table(columns=["image_id", cap, emb], filter=f"image_id IN ('{rows[3]['image_id']}', "
                                 f"'{rows[4]['image_id']}')")
    assert all(c.startswith("both changed") for c in got.column(cap).to_pylist())
    assert all(np.allclose(v, vecs[0]) for v in got.column(emb).to_pylist())
    assert _images(root).count_rows() == 12


def test_a_full_comparison_writes_its_differences_together(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Differences arriving in many parts are written in one go (a merge costs a pass over the
    table), or in several once they pass the byte budget; the result is the same."""
    import prx_assets.core.lab.sync as sync_module
    from prx_assets.core import layout
    from prx_assets.core.lab import changes

    root, rows = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    add_captions(root, rows, "c-1", "a new caption")
    monkeypatch.setattr(sync_module, "full_differences",  # the differences arrive in many small parts
                        lambda *a, **kw: changes.full_differences(*a, **kw, chunk=1))
    writes: list[int] = []
    real = changes.write_changed
    monkeypatch.setattr(sync_module, "write_changed",
                        lambda images, column, changed: writes.append(changed.num_rows) or real(images, column, changed))
    Path(root.join(layout.lab_sync_state())).unlink()  # no cursor: a full comparison
    res = sync_lab(root, captioner_ids=["c-1"])
    assert res.modes[cap] == "full" and res.rows_updated[cap] == len(rows)
    assert writes == [len(rows)]
    assert all(v.startswith("a new caption") for v in _column(root, cap).values())

    add_captions(root, rows, "c-1", "third")
    monkeypatch.setattr(sync_module, "FULL_WRITE_BYTES", 1)  # every range past the budget
    writes.clear()
    Path(root.join(layout.lab_sync_state())).unlink()
    assert sync_lab(root, captioner_ids=["c-1"]).rows_updated[cap] == len(rows)
    assert len(writes) > 1 and sum(writes) == len(rows)
    assert all(v.startswith("third") for v in _column(root, cap).values())


def test_change_examples_hold() -> None:
    import doctest

    from prx_assets.core.lab import changes

    assert doctest.testmod(changes).failed == 0


def test_changed_rows_scan_only_fragments_written_since(tmp_path: Path) -> None:
    """Rows written after a version live in fragments new since then or whose data files changed;
    the scan for them reads only those (here: 2 changed rows, 1 fragment of 4), and a cleaned-up
    version falls back to scanning everything."""
    from prx_assets.core.lab.changes import changed_rows, fragments_since

    uri = str(tmp_path / "src.lance")
    for k in range(3):  # three fragments of 100 rows
        lance.write_dataset(pa.table({"image_id": [f"{k}-{i:03d}" for i in range(100)], "caption": ["old"] * 100}),
                            uri, mode="append" if k else "create", enable_stable_row_ids=True)
    src = lance.dataset(uri)
    since = src.version
    src.merge_insert("image_id").when_matched_update_all().execute(
        pa.table({"image_id": ["0-005", "2-042"], "caption": ["new", "new"]}))
    src = lance.dataset(uri)
    fresh = fragments_since(src, since)
    assert len(src.get_fragments()) == 4 and [f.count_rows() for f in fresh] == [2]
    stats: list[int] = []
    real_scanner = src.scanner

    def counting(*a: object, **kw: object) -> object:
        stats.append(len(kw.get("fragments") or src.get_fragments()))
        return real_scanner(*a, **kw)

    src.scanner = counting  # type: ignore[method-assign]
    got = pa.concat_tables(changed_rows(src, "caption", None, since, src, None))
    assert sorted(got.column("image_id").to_pylist()) == ["0-005", "2-042"] and stats == [1]
    assert set(got.column("value").to_pylist()) == {"new"}
    assert fragments_since(src, since + 50) is None  # not there: the caller scans every fragment


def test_a_new_batchs_columns_are_written_in_place_without_a_merge(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captions and vectors of a fragment whose rows all changed go the column path: each fragment
    joins its own rows by row id, one commit per column, no ``merge_insert`` (whose key scan grows
    with the table); the JPEG files stay, the matched rows' versions move, the others' do not, and
    a fragment with a deleted row keeps it deleted."""
    root, rows = lab
    cap, emb = caption_column("c-1"), embedding_column("e-1")
    sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    images = _images(root)
    frag0 = images.get_fragments()[0]
    ids0 = frag0.to_table(columns=["image_id"]).column(0).to_pylist()
    images.delete(f"image_id = '{ids0[0]}'")  # a deletion inside the fragment about to change
    jpeg_files = jpeg_data_files(_images(root))
    merges: list[int] = []
    real = lance.LanceDataset.merge_insert
    monkeypatch.setattr(lance.LanceDataset, "merge_insert",
                        lambda self, *a, **kw: merges.append(1) or real(self, *a, **kw))
    commits: list[str] = []
    real_commit = lance.LanceDataset.commit
    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(
        lambda base, op, *a, **kw: commits.append(type(op).__name__) or real_commit(base, op, *a, **kw)))
    changed = [r for r in rows if r["image_id"] in ids0[1:]]
    add_captions(root, changed, "c-1", "a new batch caption")
    vecs = np.zeros((len(changed), DIM), np.float32)
    vecs[:, -1] = 1.0
    add_embeddings(root, changed, "e-1", vecs)
    before = {r["image_id"]: r["_row_last_updated_at_version"] for r in _images(root).to_table(
        columns=["image_id", "_row_last_updated_at_version"]).to_pylist()}
    merges.clear()
    commits.clear()
    res = sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    assert res.rows_updated == {cap: len(changed), emb: len(changed)}
    assert merges == [] and commits == ["Update", "Update"]
    assert jpeg_data_files(_images(root)) == jpeg_files
    after = _images(root).to_table(columns=["image_id", cap, emb, "_row_last_updated_at_version"]).to_pylist()
    assert len(after) == 11 and ids0[0] not in {r["image_id"] for r in after}
    for r in after:
        if r["image_id"] in ids0:
            assert r[cap].startswith("a new batch caption") and r[emb][-1] == 1.0
            assert r["_row_last_updated_at_version"] > before[r["image_id"]]
        else:
            assert r[cap].startswith("a photo") and r["_row_last_updated_at_version"] == before[r["image_id"]]
    hits = _images(root).to_table(columns=["image_id"], filter=f"{cap} = '{after[0][cap]}'")
    assert hits.num_rows == sum(r[cap] == after[0][cap] for r in after)  # the caption index sees the new values


def test_a_conflicting_commit_falls_back_to_the_merge_by_key(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A concurrent writer deletes a row of the fragments being rewritten in place, between the read
    and the commit: Lance refuses the in-place commit (a real ``CommitConflictError``), and the rows
    are written by key (``merge_insert``) instead, with the same result. Any other commit error is
    raised."""
    from lance.commit import CommitConflictError

    from prx_assets.core.lab import changes

    root, rows = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    gone = sorted(r["image_id"] for r in rows)[0]
    real_commit = lance.LanceDataset.commit
    conflicts: list[str] = []

    def racing(base: object, op: object, *a: object, **kw: object) -> lance.LanceDataset:
        if isinstance(op, lance.LanceOperation.Update) and not conflicts:
            _images(root).delete(f"image_id = '{gone}'")  # another process, between read and commit
            try:
                return real_commit(base, op, *a, **kw)
            except CommitConflictError as e:
                conflicts.append(str(e))
                raise
        return real_commit(base, op, *a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(racing))
    monkeypatch.setattr(changes, "route_by_fragment", lambda images, changed: set())  # the column path
    add_captions(root, rows, "c-1", "after a conflict")
    sync_lab(root, captioner_ids=["c-1"])
    assert len(conflicts) == 1 and "conflict" in conflicts[0].lower()
    got = _column(root, cap)
    assert gone not in got and len(got) == len(rows) - 1
    assert all(v.startswith("after a conflict") for v in got.values())

    def refused(*a: object, **kw: object) -> None:
        raise OSError("permission denied")

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(refused))
    add_captions(root, rows, "c-1", "not a conflict")
    with pytest.raises(OSError, match="permission denied"):
        sync_lab(root, captioner_ids=["c-1"])


def test_a_new_batch_is_found_in_the_lab_without_a_lookup_by_key(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Images ingested since the last sync carry their row ids from the scan of the new fragments, so
    their captions and vectors are compared and written without looking a single id up in the lab."""
    from prx_assets.core.lab import changes
    from prx_assets.core.lab.schema import IMAGES_SCHEMA
    from prx_assets.core.lab.table import replace_partition

    root, rows = lab
    cap, emb = caption_column("c-1"), embedding_column("e-1")
    sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    fresh = _images(root).to_table(columns=IMAGES_SCHEMA.names, limit=4)
    new_ids = [f"{0xABC0 + i:016x}" for i in range(4)]
    fresh = fresh.set_column(fresh.schema.get_field_index("image_id"), "image_id", pa.array(new_ids)) \
        .set_column(fresh.schema.get_field_index("batch"), "batch", pa.array(["photos-new"] * 4))
    replace_partition(table_uri(root, "images"), IMAGES_SCHEMA, "batch", "photos-new", fresh.to_batches())
    new_rows = [{"image_id": i, "batch": "photos-new", "sha256": f"s{i}"} for i in new_ids]
    add_captions(root, new_rows, "c-1", "a fresh caption")
    add_embeddings(root, new_rows, "e-1", np.eye(4, DIM, dtype=np.float32))
    lookups: list[tuple[str, int]] = []
    real = changes.table_by_ids
    monkeypatch.setattr(changes, "table_by_ids",
                        lambda ds, ids, *a, **kw: lookups.append((ds.uri, len(ids))) or real(ds, ids, *a, **kw))
    taken: list[list[str]] = []
    real_take = lance.LanceDataset._take_rows
    monkeypatch.setattr(lance.LanceDataset, "_take_rows",
                        lambda self, ids, columns=None, **kw: taken.append(list(columns or [])) or real_take(
                            self, ids, columns=columns, **kw))
    read: list[list[str]] = []
    real_current = changes.current_rows
    monkeypatch.setattr(changes, "current_rows", lambda *a, **kw: (
        lambda t: read.append(t.column_names) or t)(real_current(*a, **kw)))
    res = sync_lab(root, captioner_ids=["c-1"], embedder_ids=["e-1"])
    assert res.rows_updated == {cap: 4, emb: 4}
    assert read == [["image_id", "_rowaddr", "_rowid"]]  # known null: no column of nulls built
    assert [n for uri, n in lookups if n] == []  # neither the lab nor a source looked up by key
    assert taken == [["image_id", "_rowaddr"]]  # the new fragment holds no caption or vector file: not read
    caps, embs = _column(root, cap), _column(root, emb)
    assert all(caps[i].startswith("a fresh caption") for i in new_ids)
    assert [embs[i][k] for k, i in enumerate(new_ids)] == [1.0] * 4
    assert all(caps[r["image_id"]].startswith("a photo") for r in rows)


def test_rows_taken_by_a_stale_row_id_are_looked_up_by_key(lab) -> None:
    """A row id that no longer names the image (deleted or moved since the scan) is not trusted: the
    image is looked up by its id instead."""
    from prx_assets.core.lab.changes import current_rows

    root, _ = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    images = _images(root)
    t = images.to_table(columns=["image_id", "_rowaddr"], with_row_id=True).sort_by("image_id")
    ids = t.column("image_id").combine_chunks()
    right, addrs = t.column("_rowid").to_pylist(), t.column("_rowaddr").to_pylist()
    for stale in ([1, 1], [0, None]):  # another image's row (and address); a row id that is gone
        wrong = pa.table({"image_id": ids[:2], "value": ["x", "y"],
                          "_rowid": pa.array([10**9 if i is None else right[i] for i in stale], pa.uint64()),
                          "_rowaddr": pa.array([0 if i is None else addrs[i] for i in stale], pa.uint64())})
        got = current_rows(images, [wrong], ids.slice(0, 3), [cap]).sort_by("image_id")
        assert got.column("image_id").to_pylist() == ids.slice(0, 3).to_pylist()
        assert got.column("_rowid").to_pylist() == right[:3]
        assert got.column("_rowaddr").to_pylist() == t.column("_rowaddr").to_pylist()[:3]


def test_a_row_moved_earlier_in_the_sync_is_written_where_it_now_lives(lab) -> None:
    """A new batch's row rewritten whole by an earlier write (moved to a new fragment, same stable
    row id) is read with its address as the lab has it now, so the column path writes that fragment
    and not the one the row left."""
    from prx_assets.core.lab.changes import current_rows

    root, _ = lab
    cap = caption_column("c-1")
    sync_lab(root, captioner_ids=["c-1"])
    images = _images(root)
    before = images.to_table(columns=["image_id", "_rowaddr"], with_row_id=True).sort_by("image_id")
    moved = before.column("image_id")[0].as_py()
    images.merge_insert("image_id").when_matched_update_all().use_index(False).execute(
        images.to_table(filter=f"image_id = '{moved}'"))
    images = _images(root)
    now = images.to_table(columns=["image_id", "_rowaddr"], with_row_id=True, filter=f"image_id = '{moved}'")
    assert now.column("_rowid")[0] == before.column("_rowid")[0] and now.column("_rowaddr")[0] != before.column("_rowaddr")[0]
    part = pa.table({"image_id": [moved], "value": ["x"], "_rowid": pa.array([now.column("_rowid")[0].as_py()], pa.uint64())})
    got = current_rows(images, [part], pa.array([moved]), [cap])
    assert got.column("_rowaddr").to_pylist() == now.column("_rowaddr").to_pylist()


def test_changed_values_match_by_key_in_any_order() -> None:
    """Values are matched to the lab's rows by 64-bit key in any order and for ids of any form; an id
    twice in the lab pairs with each row; a column absent from ``current`` (known null) makes every
    non-null value a change and no null one."""
    from prx_assets.core.lab.changes import changed_values

    ids = ["00000000000000a1", "00000000000000b2", "not-a-hex-id", "00000000000000c3"]
    values = pa.table({"image_id": ids, "value": ["x", "y", None, "w"]})
    current = pa.table({"image_id": [ids[3], ids[1], ids[2], ids[0], ids[3]], "c": ["w", "old", "z", None, "old"],
                        "_rowid": pa.array([3, 1, 2, 0, 9], pa.uint64())})
    got = changed_values("c", pa.string(), values, current)
    assert list(zip(got.column("image_id").to_pylist(), got.column("c").to_pylist(),
                    got.column("_rowid").to_pylist(), strict=True)) == [
        (ids[0], "x", 0), (ids[1], "y", 1), (ids[2], None, 2), (ids[3], "w", 9)]
    unknown = changed_values("c", pa.string(), values, current.drop_columns(["c"]))
    assert sorted(unknown.column("_rowid").to_pylist()) == [0, 1, 3, 9]  # the null value is no change
    outside = changed_values("c", pa.string(), values, current.slice(1, 1))
    assert outside.column("image_id").to_pylist() == [ids[1]]  # ids not in the lab are not written
