"""The lab: schema evolution without rewriting image data, indexes and pushdown, vector and
full-text search, time travel, tags, maintenance, and clear errors for bad queries."""

from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.maintenance import maintain
from prx_assets.core.lab.query import QueryError, open_lab, query
from prx_assets.core.lab.schema import CAPTIONS_SCHEMA, CAPTIONS_TABLE, embeddings_schema, embeddings_table
from prx_assets.core.lab.sync import PUBLISHED_TAG, caption_column, embedding_column, index_coverage, sync_lab
from prx_assets.core.lab.table import open_or_create, table_uri
from tests.helpers import write_folder_corpus

DIM = 16


def build(root: DataRoot, folder: Path, n: int = 12, batch_size: int = 4) -> list[dict]:
    write_folder_corpus(folder, n=n, broken=False)
    cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=batch_size,
                       ingest=IngestSettings(workers=1))
    discover(cfg, reader_for(cfg), root)
    for m in load_manifests(root, "photos"):
        ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    return lance.dataset(table_uri(root, "images"), storage_options=root.storage_options()).to_table(
        columns=["image_id", "sha256", "batch", "width"]).to_pylist()


def add_captions(root: DataRoot, rows: list[dict], cid: str, words: str) -> None:
    ds = open_or_create(table_uri(root, CAPTIONS_TABLE), CAPTIONS_SCHEMA, root.storage_options())
    t = pa.Table.from_pylist([{"image_id": r["image_id"], "captioner_id": cid, "batch": r["batch"],
                               "sha256": r["sha256"], "caption": f"{words} number {i}", "tokens": 4,
                               "seconds": 0.1, "hit_max_tokens": False, "model": "m"}
                              for i, r in enumerate(rows)], schema=CAPTIONS_SCHEMA)
    ds.merge_insert(["captioner_id", "image_id"]).when_matched_update_all().when_not_matched_insert_all().execute(t)


def add_embeddings(root: DataRoot, rows: list[dict], eid: str, vecs: np.ndarray, vector_dtype: str = "float32") -> None:
    schema = embeddings_schema(DIM, vector_dtype)
    ds = open_or_create(table_uri(root, embeddings_table(eid)), schema, root.storage_options())
    t = pa.Table.from_pylist([{"image_id": r["image_id"], "embedder_id": eid, "batch": r["batch"],
                               "sha256": r["sha256"], "embedding": v.tolist(), "model": "m"}
                              for r, v in zip(rows, vecs, strict=True)], schema=schema)
    ds.merge_insert(["embedder_id", "image_id"]).when_matched_update_all().when_not_matched_insert_all().execute(t)


def jpeg_files(ds: lance.LanceDataset) -> set[str]:
    jpeg_id = next(f.id() for f in ds.lance_schema.fields() if f.name() == "jpeg") \
        if hasattr(ds, "lance_schema") else None
    out = set()
    for frag in ds.get_fragments():
        for df in frag.data_files():
            if jpeg_id is None or jpeg_id in list(df.fields):
                out.add(df.path)
    return out


@pytest.fixture
def lab(tmp_path: Path) -> tuple[DataRoot, list[dict]]:
    root = DataRoot(str(tmp_path / "root"))
    return root, build(root, tmp_path / "photos")


def test_new_caption_column_lands_without_rewriting_image_data(lab) -> None:
    root, rows = lab
    add_captions(root, rows, "a-1", "a red car")
    first = sync_lab(root, captioner_ids=["a-1"])
    ds = lance.dataset(table_uri(root, "images"))
    before = {f.fragment_id: {df.path for df in f.data_files()} for f in ds.get_fragments()}
    assert caption_column("a-1") in first.columns_added

    add_captions(root, rows, "b-2", "a blue boat")
    second = sync_lab(root, captioner_ids=["a-1", "b-2"])
    assert second.columns_added == [caption_column("b-2")]
    assert second.rows_updated == {caption_column("a-1"): 0, caption_column("b-2"): len(rows)}
    ds = lance.dataset(table_uri(root, "images"))
    after = {f.fragment_id: {df.path for df in f.data_files()} for f in ds.get_fragments()}
    assert before.keys() == after.keys()
    for fid, files in before.items():
        assert files <= after[fid]  # every existing data file (JPEG bytes included) is still there
        assert len(after[fid] - files) == 1  # plus one new file holding only the new column
    t = ds.to_table(columns=["image_id", caption_column("a-1"), caption_column("b-2")])
    assert all(v.startswith("a red car") for v in t.column(caption_column("a-1")).to_pylist())
    assert all(v.startswith("a blue boat") for v in t.column(caption_column("b-2")).to_pylist())


def test_scalar_indexes_are_used_and_scan_less(lab) -> None:
    root, rows = lab
    res = sync_lab(root)
    names = {ix["name"]: ix for ix in res.indexes}
    assert names["width_idx"]["type"] == "BTree" and names["source_idx"]["type"] == "Bitmap"
    assert all(ix["unindexed_rows"] == 0 for ix in res.indexes)
    ds = open_lab(root)
    threshold = sorted(r["width"] for r in rows)[-2]
    q = query(ds, where=f"width >= {threshold}", columns=["image_id", "width"], explain=True)
    assert "ScalarIndexQuery" in q.plan and "width_idx(BTree)" in q.plan
    assert q.table.num_rows == 2 and q.stats["rows_scanned"] < q.stats["table_rows"]
    q = query(ds, where="source = 'photos' AND aspect_bucket = '1:1'", explain=True)
    assert "source_idx(Bitmap)" in q.plan or "aspect_bucket_idx(Bitmap)" in q.plan


def test_indexes_follow_new_batches(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "root"))
    build(root, tmp_path / "photos", n=4)
    sync_lab(root)
    rows = build(root, tmp_path / "photos", n=8)  # the rest of the files arrive as a new batch
    res = sync_lab(root)
    width = next(ix for ix in res.indexes if ix["name"] == "width_idx")
    assert width["indexed_rows"] == len(rows) and width["unindexed_rows"] == 0


@pytest.mark.parametrize("vector_dtype", ["float32", "float16"])
def test_vector_search_returns_the_planted_neighbour(lab, vector_dtype: str) -> None:
    """Vectors stored as float32 or float16 (half the bytes): the lab column keeps the stored type,
    exact and IVF_PQ search find the neighbour."""
    root, rows = lab
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((len(rows), DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    planted = vecs[0] + 0.01 * rng.standard_normal(DIM).astype(np.float32)
    vecs[5] = planted / np.linalg.norm(planted)
    add_embeddings(root, rows, "e-1", vecs, vector_dtype)
    for min_rows in (10**6, 8):  # exact search, then IVF_PQ with refine
        res = sync_lab(root, embedder_ids=["e-1"], vector_index_min_rows=min_rows)
        kinds = {ix["type"] for ix in res.indexes}
        assert ("IVF_PQ" in kinds) == (min_rows == 8)
        hits = query(open_lab(root), near=rows[0]["image_id"], k=3, columns=["image_id"]).table
        assert hits.column("image_id").to_pylist()[:2] == [rows[0]["image_id"], rows[5]["image_id"]]
    col = embedding_column("e-1")
    lab_ds = open_lab(root)
    assert lab_ds.schema.field(col).type.value_type == embeddings_schema(DIM, vector_dtype).field("embedding").type.value_type
    stored = lab_ds.to_table(columns=[col], filter=f"image_id = '{rows[5]['image_id']}'")
    assert np.allclose(stored.column(0)[0].values.to_numpy().astype(np.float32), vecs[5], atol=1e-3)


def test_full_text_search_over_captions(lab) -> None:
    root, rows = lab
    add_captions(root, rows[:3], "a-1", "a red car")
    add_captions(root, rows[3:], "a-1", "a quiet lake")
    sync_lab(root, captioner_ids=["a-1"])
    hits = query(open_lab(root), text="car", columns=["image_id"]).table
    assert set(hits.column("image_id").to_pylist()) == {r["image_id"] for r in rows[:3]}


def test_time_travel_tags_and_maintenance(lab) -> None:
    root, rows = lab
    v1 = sync_lab(root).version
    assert open_lab(root, tag=PUBLISHED_TAG).version == v1
    add_captions(root, rows, "a-1", "a red car")
    v2 = sync_lab(root, captioner_ids=["a-1"]).version
    assert v2 > v1
    assert caption_column("a-1") not in open_lab(root, version=v1).schema.names
    assert caption_column("a-1") in open_lab(root, version=v2).schema.names
    ds = lance.dataset(table_uri(root, "images"))
    ds.tags.create("subset-demo", v1)
    frags = len(ds.get_fragments())
    assert frags >= 3
    (rep,) = [r for r in maintain(root, older_than=timedelta(seconds=0)) if r.table == "images"]
    assert rep.fragments_after < frags and rep.versions_removed > 0
    old = open_lab(root, tag="subset-demo")
    assert old.version == v1 and old.count_rows() == len(rows)
    assert open_lab(root).count_rows() == len(rows)
    with pytest.raises(QueryError, match=r"cannot open version 2 of"):
        open_lab(root, version=2)  # removed by cleanup


def test_bad_queries_name_the_problem(lab) -> None:
    root, _ = lab
    ds = open_lab(root)
    with pytest.raises(QueryError, match=r"predicate 'widht > 3' failed: .*No field named widht"):
        query(ds, where="widht > 3")
    with pytest.raises(QueryError, match=r"predicate 'width >>> 3' failed"):
        query(ds, where="width >>> 3")
    with pytest.raises(QueryError, match=r"unknown columns \['nope'\]"):
        query(ds, columns=["nope"])
    with pytest.raises(QueryError, match=r"no embedding column yet"):
        query(ds, near="abc")
    with pytest.raises(QueryError, match=r"cannot open tag 'missing'"):
        open_lab(root, tag="missing")


def test_maintenance_is_requested_when_a_table_passes_its_bounds(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The maintenance sensor reads manifests and index statistics, requests lance_maintenance
    once a table has too many fragments or unindexed rows, and is quiet after maintenance."""
    import dagster as dg

    import prx_assets.core.lab.maintenance as maintenance
    from prx_assets.defs.lab import lance_maintenance_sensor
    from prx_assets.resources.storage import StorageResource

    root, _ = lab
    sync_lab(root)  # indexes
    health = maintenance.table_health(root, "images")
    assert health is not None and health.fragments == 3 and health.rows == 12
    assert health.needs_maintenance() is None
    assert health.needs_maintenance(max_fragments=2) == "images: 3 fragments to compact > 2"
    storage = StorageResource(data_root=root.uri)

    def evaluate() -> dg.SensorResult:
        with dg.build_sensor_context(resources={"storage": storage}) as ctx:
            return lance_maintenance_sensor(ctx)

    assert evaluate().skip_reason is not None
    monkeypatch.setattr(maintenance, "MAX_FRAGMENTS", 2)
    (request,) = evaluate().run_requests
    assert "images: 3 fragments to compact > 2" in request.tags["prx/maintenance_reasons"]
    maintain(root)
    assert maintenance.table_health(root, "images").fragments == 1
    assert evaluate().skip_reason is not None


def test_a_sync_folds_new_rows_as_a_delta_segment_and_maintenance_merges_them(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Folding new rows into an index must cost what changed: a sync adds a delta segment over
    the unindexed rows (the existing segment is not rewritten), the health check counts segments,
    and maintenance merges them back into one."""
    import prx_assets.core.lab.maintenance as maintenance
    import prx_assets.core.lab.sync as sync_module

    root, rows = lab
    sync_lab(root, captioner_ids=[])
    monkeypatch.setattr(sync_module, "FOLD_ABOVE_ROWS", 0)  # fold whatever is unindexed
    for k in range(3):
        add_captions(root, rows[k:k + 1], "a-1", f"caption {k}")
        sync_lab(root, captioner_ids=["a-1"])
    ds = lance.dataset(table_uri(root, "images"))
    segments = {ix.name: len(ix.segments) for ix in ds.describe_indices()}
    assert segments[f"{caption_column('a-1')}_idx"] >= 2 and all(c["unindexed_rows"] == 0 for c in index_coverage(ds))
    health = maintenance.table_health(root, "images")
    assert health.segments == max(segments.values())
    monkeypatch.setattr(maintenance, "MAX_SEGMENTS", 1)
    assert "segments > 1" in (health.needs_maintenance() or "")
    maintain(root)
    assert maintenance.table_health(root, "images").segments == 1


def test_tagging_at_once_from_many_handles_never_conflicts(tmp_path) -> None:
    """Runs cutting the same subset tag the same version at once (seen with four CLI runs beside a UI
    backfill): every writer succeeds and the tag points at the version."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"x": [1]}), uri)
    lance.write_dataset(pa.table({"x": [2]}), uri, mode="append")
    with ProcessPoolExecutor(8, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_tag_many, [uri] * 8))
    tags = lance.dataset(uri).tags.list()
    assert {t: tags[t]["version"] for t in tags} == {f"subset-{k}": 1 + (k % 2) for k in range(15)}


def _tag_many(uri: str) -> None:
    from prx_assets.core.lab.sync import tag_version

    ds = lance.dataset(uri)
    for k in range(15):
        tag_version(ds, f"subset-{k}", 1 + (k % 2))


def test_index_coverage_from_the_manifest_equals_lances_index_statistics(tmp_path: Path) -> None:
    """Coverage is computed from the manifest (segments' fragment lists less deletions); it must
    give Lance's own ``index_statistics`` figures after appends, deletions, a delta segment, a
    column rewritten in place (its index leaves that fragment) and on a vector index."""
    import doctest

    import prx_assets.core.lab.table as table_module

    def rows(a: int, n: int) -> pa.Table:
        v = np.random.default_rng(a).standard_normal((n, 8)).astype(np.float32)
        return pa.table({"id": pa.array(range(a, a + n)), "c": [f"x{i}" for i in range(a, a + n)],
                         "k": pa.array(np.arange(a, a + n) % 7),
                         "v": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 8)})

    uri = str(tmp_path / "t.lance")
    ds = lance.write_dataset(rows(0, 1000), uri, enable_stable_row_ids=True, max_rows_per_file=300)
    ds.create_scalar_index("id", "BTREE")
    ds.create_scalar_index("c", "BTREE")
    ds.create_scalar_index("k", "BITMAP")
    ds.create_index("v", index_type="IVF_PQ", num_partitions=2, num_sub_vectors=2, metric="cosine")
    ds = lance.write_dataset(rows(1000, 500), uri, mode="append")
    ds.delete("id < 50 OR (id >= 1000 AND id < 1010)")
    ds.optimize.optimize_indices(index_names=["id_idx"], num_indices_to_merge=0)
    fragment = ds.get_fragment(0)
    old = fragment.to_table(columns=["c"], with_row_id=True)
    meta, modified, matched = fragment.update_columns(
        pa.table({"_rowid": old.column("_rowid"), "c": pa.array(["y"] * old.num_rows)}), left_on="_rowid",
        with_offsets=True)
    ds = lance.LanceDataset.commit(ds, lance.LanceOperation.Update(
        updated_fragments=[meta], fields_modified=sorted(int(f) for f in modified), update_mode="rewrite_columns",
        updated_fragment_offsets={0: matched}), read_version=ds.version)
    got = {c["name"]: c for c in index_coverage(ds)}
    assert {n: (c["indexed_rows"], c["unindexed_rows"]) for n, c in got.items()} == {
        ix.name: (ds.stats.index_stats(ix.name)["num_indexed_rows"], ds.stats.index_stats(ix.name)["num_unindexed_rows"])
        for ix in ds.describe_indices()}
    assert got["id_idx"]["unindexed_rows"] == 0 and got["id_idx"]["segments"] == 2
    assert got["c_idx"]["unindexed_rows"] == 250 + 490  # fragment 0 (rewritten) and the append
    assert doctest.testmod(table_module).failed == 0
