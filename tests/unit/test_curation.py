"""Every recipe rule with exact expected ids, determinism, and errors that name the problem."""

import io
import shutil
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.dedup import near_duplicates_phash
from prx_assets.core.curate.recipes import Dedup, Recipe, load_recipes
from prx_assets.core.curate.selection import CurationError, select
from prx_assets.core.lab.sync import embedding_column, sync_lab
from prx_assets.core.lab.table import table_uri
from prx_assets.errors import ConfigError
from tests.unit.test_lab import DIM, add_captions, add_embeddings, build


@pytest.fixture
def lab(tmp_path: Path) -> tuple[DataRoot, dict[str, dict]]:
    folder = tmp_path / "photos"
    root = DataRoot(str(tmp_path / "root"))
    from tests.helpers import write_folder_corpus

    write_folder_corpus(folder, n=8, broken=False)
    shutil.copy(folder / "img_0_000.jpg", folder / "exact_copy.jpg")
    im = Image.open(folder / "img_0_002.webp").convert("RGB")
    buf = io.BytesIO()
    im.resize((im.width - 8, im.height - 6)).save(buf, "JPEG", quality=70)  # a near duplicate
    (folder / "near_copy.jpg").write_bytes(buf.getvalue())
    build(root, folder, n=8, batch_size=100)
    by_name = {}
    for r in lance.dataset(table_uri(root, "images")).to_table(
            columns=["image_id", "uri", "sha256", "batch", "width", "height"]).to_pylist():
        by_name[Path(r["uri"]).name] = r
    return root, by_name


def ids(by_name: dict[str, dict], *names: str) -> list[str]:
    return sorted(by_name[n]["image_id"] for n in names)


ALL = ["img_0_000.jpg", "sub/img_0_001.png", "img_0_002.webp", "sub/img_0_003.jpg", "img_0_004.png",
       "sub/img_0_005.webp", "img_0_006.jpg", "sub/img_0_007.png", "exact_copy.jpg", "near_copy.jpg"]


def names_of(by_name: dict[str, dict], selected: list[str]) -> set[str]:
    rev = {v["image_id"]: k for k, v in by_name.items()}
    return {rev[i] for i in selected}


def test_predicate_resolution_buckets_and_exact_dedup(lab) -> None:
    root, by_name = lab
    ds = lance.dataset(table_uri(root, "images"))
    assert len(by_name) == 10
    s = select(ds, Recipe(name="r", dedup=Dedup(exact=True)))
    pair = sorted(["exact_copy.jpg", "img_0_000.jpg"], key=lambda n: by_name[n]["image_id"])
    # Same size, so the smaller image id wins the tie.
    assert names_of(by_name, s.image_ids) == {Path(n).name for n in ALL} - {pair[1]}
    assert s.dropped == {"dedup_exact": 1} and s.version == ds.version
    widths = sorted(r["width"] for r in by_name.values())
    s = select(ds, Recipe(name="r", where=f"width > {widths[5]}", dedup=Dedup(exact=False)))
    assert len(s.image_ids) == 4 and s.dropped == {"predicate": 6}
    s = select(ds, Recipe(name="r", min_side=200, dedup=Dedup(exact=False)))
    assert all(by_name[n]["width"] >= 200 and by_name[n]["height"] >= 200
               for n in names_of(by_name, s.image_ids))
    assert s.dropped["min_resolution"] == sum(1 for r in by_name.values() if min(r["width"], r["height"]) < 200)
    s = select(ds, Recipe(name="r", aspect_buckets=("4:3",), dedup=Dedup(exact=False)))
    assert set(s.buckets) == {"4:3"} and sum(s.buckets.values()) == len(s.image_ids)


def test_perceptual_dedup_keeps_the_larger_image(lab) -> None:
    root, by_name = lab
    ds = lance.dataset(table_uri(root, "images"))
    s = select(ds, Recipe(name="r", dedup=Dedup(exact=True, phash_distance=6)))
    chosen = names_of(by_name, s.image_ids)
    assert "img_0_002.webp" in chosen and "near_copy.jpg" not in chosen
    assert s.dropped["dedup_phash"] == 1
    assert near_duplicates_phash([0b1111, 0b1110, 0xFFFF << 40], 1) == [True, False, True]


def test_embedding_dedup_and_optout_lists(lab, tmp_path: Path) -> None:
    root, by_name = lab
    rows = sorted(by_name.values(), key=lambda r: r["image_id"])
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((len(rows), DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    vecs[1] = vecs[0]  # two different files that embed identically
    add_embeddings(root, rows, "e-1", vecs)
    sync_lab(root, embedder_ids=["e-1"])
    ds = lance.dataset(table_uri(root, "images"))
    s = select(ds, Recipe(name="r", dedup=Dedup(exact=False, embedding_threshold=0.99)),
               embedding_column=embedding_column("e-1"))
    assert s.dropped["dedup_embedding"] == 1
    assert len({rows[0]["image_id"], rows[1]["image_id"]} & set(s.image_ids)) == 1
    # where the cut's time went, by the stages it ran (reported with the run, not part of the subset)
    assert list(s.work["seconds"]) == ["candidates", "order", "dedup_embedding", "selected"]
    assert all(v >= 0 for v in s.work["seconds"].values())
    # the survivors' vectors are read by row id a block at a time into their order (taken or scanned)
    from prx_assets.core.curate.selection import read_by_row_ids

    by_id = {r["image_id"]: r["_rowid"] for r in ds.to_table(columns=["image_id"], with_row_id=True).to_pylist()}
    wanted = np.array([by_id[rows[2]["image_id"]], by_id[rows[0]["image_id"]], by_id[rows[5]["image_id"]]],
                      dtype=np.uint64)
    for scan in (False, True):
        got = np.full((3, DIM), np.nan, np.float32)
        blocks: list[int] = []

        def put(pos: np.ndarray, block: np.ndarray, got: np.ndarray = got, blocks: list[int] = blocks) -> None:
            got[pos] = block
            blocks.append(len(pos))
        read_by_row_ids(ds, embedding_column("e-1"), wanted, put, batch_rows=2, scan=scan)
        assert np.allclose(got, vecs[[2, 0, 5]], atol=1e-3) and max(blocks) <= 2

    (tmp_path / "ids.txt").write_text(f"# opted out\n{by_name['img_0_000.jpg']['image_id']}\n")
    (tmp_path / "uris.txt").write_text(by_name["img_0_006.jpg"]["uri"] + "\n")
    r = Recipe(name="r", dedup=Dedup(exact=False), optout_ids_file=str(tmp_path / "ids.txt"),
               optout_uris_file=str(tmp_path / "uris.txt"))
    s = select(ds, r)
    assert s.dropped == {"optout": 2}
    assert not names_of(by_name, s.image_ids) & {"img_0_000.jpg", "img_0_006.jpg"}


def test_captions_required_cap_with_seed_and_determinism(lab) -> None:
    root, by_name = lab
    rows = sorted(by_name.values(), key=lambda r: r["image_id"])
    add_captions(root, rows[:7], "detailed-0000aaaa", "a photo")
    sync_lab(root, captioner_ids=["detailed-0000aaaa"])
    ds = lance.dataset(table_uri(root, "images"))
    r = Recipe(name="r", captions=("detailed",), dedup=Dedup(exact=False), cap=4, seed=7)
    a = select(ds, r, known_captioner_ids=["detailed-0000aaaa"])
    b = select(lance.dataset(table_uri(root, "images"), version=ds.version), r,
               known_captioner_ids=["detailed-0000aaaa"])
    assert a.image_ids == b.image_ids and len(a.image_ids) == 4
    assert a.dropped == {"no_caption": 3, "cap": 3}
    assert set(a.image_ids) <= {x["image_id"] for x in rows[:7]}
    other_seed = select(ds, Recipe(name="r", captions=("detailed",), dedup=Dedup(exact=False), cap=4, seed=8),
                        known_captioner_ids=["detailed-0000aaaa"])
    assert other_seed.image_ids != a.image_ids


def test_errors_name_the_column_and_the_captioner(lab, tmp_path: Path) -> None:
    root, _ = lab
    ds = lance.dataset(table_uri(root, "images"))
    with pytest.raises(CurationError, match=r"recipe 'r': predicate .*colour.* failed: .*No field named colour"):
        select(ds, Recipe(name="r", where="colour = 'red'"))
    with pytest.raises(CurationError, match=r"recipe 'r': unknown captioner 'poetic'"):
        select(ds, Recipe(name="r", captions=("poetic",)), known_captioner_ids=["detailed-1"])
    with pytest.raises(CurationError, match=r"no embedding column"):
        select(ds, Recipe(name="r", dedup=Dedup(embedding_threshold=0.9)))
    cfg = tmp_path / "recipes.yaml"
    cfg.write_text("recipes:\n  - {name: a, dedup: {exact: true, fuzzy: 3}}\n")
    with pytest.raises(ConfigError, match=r"recipe 'a': unknown key 'dedup.fuzzy' \(fix: use one of: "
                                          r"embedding_threshold, exact, phash_distance\)"):
        load_recipes(cfg)
    cfg.write_text("recipes:\n  - {name: a, optout: {image_ids: nope.txt}}\n")
    with pytest.raises(ConfigError, match=r"opt-out image_ids file .*nope.txt' does not exist"):
        load_recipes(cfg)
    cfg.write_text("recipes:\n  - {name: a, where: 'width > 1', captions: [detailed], cap: 10, seed: 3}\n")
    (recipe,) = load_recipes(cfg).recipes
    assert recipe.cap == 10 and recipe.captions == ("detailed",) and len(recipe.recipe_hash()) == 16


def test_shard_set_with_one_sub_stream_per_bucket(lab) -> None:
    from prx_assets.core.curate.subsets import read_subset, write_subset
    from prx_assets.core.publish.shards import ShardSettings, open_stream, write_shard_set
    from prx_assets.loader import release_shared_memory

    root, _ = lab
    ds = lance.dataset(table_uri(root, "images"))
    recipe = Recipe(name="r", dedup=Dedup(exact=True))
    stored = write_subset(root, ds, recipe, select(ds, recipe))
    manifest, ids = read_subset(root, "r", stored.subset_id)
    m = write_shard_set(root, ds, recipe, manifest, ids, [], ShardSettings(by_bucket=True, workers=2))
    assert m.samples == len(ids) and sum(s["samples"] for s in m.bucket_streams.values()) == len(ids)
    whole = open_stream(m.uri)
    assert sorted(whole[i]["image_id"] for i in range(len(whole))) == ids
    release_shared_memory(whole)
    for sub, info in m.bucket_streams.items():
        part = open_stream(f"{m.uri}/{info['path']}")
        assert len(part) == info["samples"]
        buckets = {part[i]["aspect_bucket"] for i in range(len(part))}
        assert len(buckets) == 1 and sub == "bucket_" + buckets.pop().replace(":", "x")
        release_shared_memory(part)
    again = write_shard_set(root, ds, recipe, manifest, ids, [], ShardSettings(by_bucket=True, workers=2))
    assert again == m  # already published: reused, not rewritten


@pytest.mark.parametrize("value_type", [pa.float32(), pa.float16()])
def test_embedding_dedup_above_the_exact_size_holds_codes_not_vectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      value_type: pa.DataType) -> None:
    """Past EMBEDDING_EXACT_BELOW survivors, curation streams the vectors into int8 codes and takes
    the candidates' full vectors by row id: the same subset as the in-memory method."""
    import prx_assets.core.curate.selection as selection
    from prx_assets.core.curate.dedup import near_duplicates_embedding

    n, dim = 3_000, 320
    rng = np.random.default_rng(21)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs[1::10] = vecs[0::10][: len(vecs[1::10])] + 0.05 * rng.standard_normal((len(vecs[1::10]), dim)).astype(np.float32)
    ids = [f"{i:08x}" for i in range(n)]
    vecs = vecs.astype(value_type.to_pandas_dtype()).astype(np.float32)  # the values as stored
    emb = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()).cast(value_type), dim)
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"image_id": ids, "emb": emb}), uri, max_rows_per_file=700)
    order = rng.permutation(n)  # curation's order (by resolution), not the table's
    ds = lance.dataset(uri)
    by_id = dict(zip(*ds.to_table(columns=["image_id"], with_row_id=True).to_pydict().values(), strict=True))
    wanted = np.array([by_id[ids[i]] for i in order], dtype=np.uint64)
    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)
    keep = selection.embedding_keep(ds, "emb", wanted, 0.97)
    expected = near_duplicates_embedding(vecs[order], 0.97, exact_below=0)
    assert n - int(keep.sum()) > 200 and keep.tolist() == expected


def test_rules_per_scan_batch_match_the_row_by_row_definition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row rules applied batch by batch inside the scan, exact dedup on 32-byte sha keys and dedup on
    the survivors' positions give what the definition gives row by row: the same ids and counts,
    whatever the scan's batch size, with real hex hashes, their uppercase forms (other texts) and
    texts that are no hash at all mixed in one batch."""
    import hashlib

    from prx_assets.core.curate import selection
    from prx_assets.core.curate.dedup import greedy_keep, phash_pairs
    from prx_assets.core.curate.optout import new_request

    rng = np.random.default_rng(5)
    n = 300
    ids_ = [f"{i:016x}" for i in rng.permutation(10**6)[:n]]
    shas = [hashlib.sha256(str(i % 170).encode()).hexdigest() for i in range(n)]  # exact duplicates
    shas[7], shas[8], shas[9], shas[10] = shas[7].upper(), "not-a-hash", "not-a-hash", None
    phash = rng.integers(0, 2**63, n, dtype=np.int64)
    phash[200:260] = phash[0:60] ^ (1 << rng.integers(0, 63, 60))  # near duplicates
    w, h = rng.integers(100, 400, n), rng.integers(100, 400, n)
    caption = [None if i % 11 == 0 else ("" if i % 13 == 0 else f"c{i}") for i in range(n)]
    t = pa.table({"image_id": ids_, "uri": [f"/d/{i}.jpg" for i in ids_], "sha256": shas, "ingest_config": ["q92"] * n,
                  "phash": pa.array(phash.astype(np.uint64)), "width": pa.array(w, pa.int32()),
                  "height": pa.array(h, pa.int32()), "aspect_bucket": ["1:1" if i % 3 else "4:3" for i in range(n)],
                  "caption__x": caption})
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(t, uri)
    (tmp_path / "ids.txt").write_text(f"{ids_[3]}\n{ids_[4]}\n")
    req = new_request(image_ids=(ids_[4], ids_[5]), uris=(f"/d/{ids_[6]}.jpg",), reason="takedown")
    recipe = Recipe(name="r", min_side=120, captions=("x",), optout_ids_file=str(tmp_path / "ids.txt"),
                    dedup=Dedup(exact=True, phash_distance=3))

    rows = [r for r in t.to_pylist() if r["width"] >= 120 and r["height"] >= 120]
    want: dict[str, int] = {"min_resolution": n - len(rows)}
    for rule, gone in (("optout", lambda r: r["image_id"] in {ids_[3], ids_[4]}),
                       ("request", lambda r: r["image_id"] in {ids_[4], ids_[5]} or r["uri"] == f"/d/{ids_[6]}.jpg"),
                       ("no_caption", lambda r: not r["caption__x"])):
        want[rule] = sum(map(gone, rows))
        rows = [r for r in rows if not gone(r)]
    rows.sort(key=lambda r: (-r["width"] * r["height"], r["image_id"]))
    seen: set = set()
    firsts = [r for r in rows if not (r["sha256"] in seen or seen.add(r["sha256"]))]
    want["dedup_exact"] = len(rows) - len(firsts)
    later, earlier = phash_pairs(np.array([r["phash"] for r in firsts], np.uint64), 3)
    keep = greedy_keep(len(firsts), later, earlier)
    want["dedup_phash"] = int((~keep).sum())
    expected = sorted(r["image_id"] for r, k in zip(firsts, keep, strict=True) if k)

    for batch_rows in (7, 64, selection.SCAN_ROWS):
        monkeypatch.setattr(selection, "SCAN_ROWS", batch_rows)
        s = select(lance.dataset(uri), recipe, [], optouts=[req])
        assert s.image_ids == expected
        assert s.dropped == {"min_resolution": want["min_resolution"], "optout": want["optout"],
                             "optout_requests": want["request"], "no_caption": want["no_caption"],
                             "dedup_exact": want["dedup_exact"], "dedup_phash": want["dedup_phash"]}
        assert list(s.dropped) == ["min_resolution", "optout", "optout_requests", "no_caption", "dedup_exact",
                                   "dedup_phash"]
        assert s.optout_dropped == {req.request_id: want["request"]}
        assert sum(s.buckets.values()) == len(expected)

    # the scan reads the URIs only for a rule that drops by URI: here the request; without it, the
    # id list alone, not at all (the same cut otherwise)
    read: list[list[str]] = []
    scanner = lance.LanceDataset.scanner

    def recording(self: lance.LanceDataset, *args: object, **kwargs: object) -> object:
        read.append(list(kwargs.get("columns") or []))
        return scanner(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "scanner", recording)
    select(lance.dataset(uri), recipe, [], optouts=[req])
    assert "uri" in read[-1]
    ids_only = new_request(image_ids=(ids_[4], ids_[5]), uris=(), reason="takedown")
    s = select(lance.dataset(uri), recipe, [], optouts=[ids_only])
    assert "uri" not in read[-1] and "image_id" in read[-1]
    passing = [r["image_id"] for r in t.to_pylist() if min(r["width"], r["height"]) >= 120
               and r["image_id"] not in {ids_[3], ids_[4]}]
    assert s.optout_dropped == {ids_only.request_id: passing.count(ids_[5])}


def _vector_lab(uri: str, vecs: np.ndarray, first: int = 0, mode: str = "create", value_type: type = np.float32,
                stable_row_ids: bool = False, storage_options: dict[str, str] | None = None,
                with_vectors: bool = True) -> None:
    """A lab-shaped table of ``vecs`` (one row each, distinct hashes, one bucket) written or appended,
    1,000 rows a fragment (``with_vectors=False``: appended without the column, as a batch ingested
    before its embeddings are synced, so no data file of its fragments holds it)."""
    n, dim = vecs.shape
    ids_ = [f"{first + i:012x}" for i in range(n)]
    t = pa.table({"image_id": ids_, "uri": [f"/d/{i}.jpg" for i in ids_],
                  "sha256": [f"{first + i:064x}" for i in range(n)], "ingest_config": ["q92"] * n,
                  "phash": pa.array(np.arange(first, first + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)),
                  "width": pa.array(np.full(n, 512), pa.int32()), "height": pa.array(np.full(n, 512), pa.int32()),
                  "aspect_bucket": ["1:1"] * n,
                  "emb": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel().astype(value_type)), dim)})
    if not with_vectors:
        t = t.drop_columns(["emb"])
    lance.write_dataset(t, uri, mode=mode, max_rows_per_file=1_000, enable_stable_row_ids=stable_row_ids,
                        storage_options=storage_options)


def test_kept_search_models_leave_earlier_rows_as_they_were(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the exact method's size, a cut keeps its trained search model under the data root and
    records it in the subset's lineage; a later cut of the same size generation files its rows with
    the same model, so images added later that duplicate nothing leave every earlier decision as it
    was. A model file that cannot be read is an error naming it, never silently replaced."""
    import prx_assets.core.curate.selection as selection
    from prx_assets.core import layout
    from prx_assets.core.curate.multi_index import SearchModelError
    from prx_assets.core.curate.search_models import model_key, search_models
    from prx_assets.core.curate.subsets import write_subset
    from tests.unit.test_dedup import spread_pairs

    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    old, _ = spread_pairs(4_000, 64, seed=3)
    _vector_lab(uri, old)
    recipe = Recipe(name="r", dedup=Dedup(exact=True, embedding_threshold=0.95))
    first = select(lance.dataset(uri), recipe, embedding_column="emb", search_models=search_models(root, recipe, "emb"))
    model = first.lineage["search_model"]
    assert model["trained_now"] and model["generation"] == 11  # 4,000 survivors: 2**11 <= n < 2**12
    kept = root.join(layout.search_model("r", model_key(recipe, "emb"), 11))
    assert Path(kept).is_file()
    assert write_subset(root, lance.dataset(uri), recipe, first).manifest.extra["search_model"] == model
    assert first.dropped["dedup_embedding"] > 300

    new = np.random.default_rng(4).standard_normal((80, 64)).astype(np.float32)  # far from every old row
    _vector_lab(uri, new / np.linalg.norm(new, axis=1, keepdims=True), first=10**6, mode="append")
    again = select(lance.dataset(uri), recipe, embedding_column="emb", search_models=search_models(root, recipe, "emb"))
    assert again.lineage["search_model"] == {**model, "trained_now": False}
    old_ids = {f"{i:012x}" for i in range(len(old))}
    assert {i for i in again.image_ids if i in old_ids} == set(first.image_ids)

    models = search_models(root, recipe, "emb")  # one object for two cuts: each records only its own model
    assert "search_model" in select(lance.dataset(uri), recipe, embedding_column="emb", search_models=models).lineage
    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 10**6)  # every pair compared: no model used
    assert "search_model" not in select(lance.dataset(uri), recipe, embedding_column="emb",
                                        search_models=models).lineage
    monkeypatch.setattr(selection, "EMBEDDING_EXACT_BELOW", 100)

    Path(kept).write_bytes(b"not a model")
    with pytest.raises(SearchModelError, match=str(kept)):
        select(lance.dataset(uri), recipe, embedding_column="emb", search_models=search_models(root, recipe, "emb"))
