"""Sidecar columns: a captioner added to a published set's caption mix is written beside its shards
(aligned by sample index), never by rewriting image bytes; the loader joins it."""

from pathlib import Path

import lance
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.lab.sync import sync_lab
from prx_assets.core.lab.table import table_uri
from prx_assets.core.manifests import ShardSetManifest, SubsetManifest
from prx_assets.core.publish.columns import SidecarMismatch
from prx_assets.core.publish.shards import ShardSettings, open_shard_set, verify_shard_set, write_shard_set
from tests.unit.test_incremental import _epoch, _files
from tests.unit.test_lab import add_captions, build

ONE = Recipe(name="r", caption_mix=(("c", 1.0),))
TWO = Recipe(name="r", caption_mix=(("c", 0.5), ("d", 0.5)))
COLS = {ONE: ("caption__c_1",), TWO: ("caption__c_1", "caption__d_1")}


@pytest.fixture
def lab(tmp_path: Path) -> tuple[DataRoot, list[dict]]:
    root = DataRoot(str(tmp_path / "root"))
    build(root, tmp_path / "photos", n=24, batch_size=100)
    ds = lance.dataset(table_uri(root, "images"))
    rows = sorted(ds.to_table(columns=["image_id", "sha256", "batch"]).to_pylist(), key=lambda r: r["image_id"])
    add_captions(root, rows, "c-1", "a photo")
    add_captions(root, rows, "d-1", "a tag list")
    sync_lab(root, captioner_ids=["c-1", "d-1"])
    return root, rows


def _publish(root: DataRoot, recipe: Recipe, ids: list[str], tag: str, previous: ShardSetManifest | None = None,
             settings: ShardSettings | None = None) -> ShardSetManifest:
    ds = lance.dataset(table_uri(root, "images"), storage_options=root.storage_options())
    sub = SubsetManifest(subset_id=f"sub-{tag}", recipe="r", recipe_hash="h", lance_uri=ds.uri,
                         lance_version=ds.version, ids="", selected=len(ids), caption_columns=COLS[recipe])
    settings = settings or ShardSettings(workers=2, size_limit=1 << 17)
    return write_shard_set(root, ds, recipe, sub, ids, ["c-1", "d-1"], settings, previous=previous)


def _lab_captions(root: DataRoot, column: str) -> dict[str, str]:
    t = lance.dataset(table_uri(root, "images")).to_table(columns=["image_id", column])
    return dict(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


def test_a_new_caption_column_is_a_sidecar_not_a_rewrite(lab) -> None:
    root, rows = lab
    ids = [r["image_id"] for r in rows]
    base = _publish(root, ONE, ids[:20], "a")
    assert base.shards > 1 and base.digest_columns == ("caption__c_1",)
    before = _files(Path(base.uri))

    wider = _publish(root, TWO, ids[:20], "b", previous=base)
    assert wider.layout == "delta" and wider.extra["sidecar_columns"] == ["caption_d"]
    assert wider.skipped == 0 and wider.extra["added"] == 0 and len(wider.streams) == 1
    (side,) = wider.streams[0]["sidecars"]
    assert side["columns"] == ["caption_d"] and side["uri"].startswith(wider.uri)
    assert _files(Path(base.uri)) == before  # not one byte of the published shards changed
    written = [p for p in Path(wider.uri).rglob("*.mds")]
    assert written and all("/columns/" in p.as_posix() for p in written)
    assert wider.bytes_written < base.bytes_written / 10  # captions, not images

    lab_d = _lab_captions(root, "caption__d_1")
    with open_shard_set(wider) as sds:
        got = {s["image_id"]: (s["caption_c"], s["caption_d"], len(s["image"])) for s in sds}
    assert sorted(got) == ids[:20]
    assert all(d == lab_d[i] and c.startswith("a photo") and n > 0 for i, (c, d, n) in got.items())
    assert sorted(_epoch(wider)) == ids[:20]  # joined through DataLoader workers too
    assert verify_shard_set(wider, lance.dataset(table_uri(root, "images")), sample=20).passed

    # A later delta on top: new samples get every column, the skip list applies, the sidecar stays.
    later = _publish(root, TWO, ids[2:22], "c", previous=wider)
    assert later.layout == "delta" and later.skipped == 2 and later.extra["added"] == 2
    assert later.streams[0]["sidecars"] == wider.streams[0]["sidecars"]
    with open_shard_set(later) as sds:
        got = {s["image_id"]: s["caption_d"] for s in sds}
    assert got == {i: lab_d[i] for i in ids[2:22]}
    assert _files(Path(base.uri)) == before


def test_a_sample_whose_caption_changed_is_skipped_and_written_again(lab) -> None:
    """The sidecar path checks each published sample against the lab: a stale one is not joined with
    new columns but replaced in the delta."""
    root, rows = lab
    ids = [r["image_id"] for r in rows]
    base = _publish(root, ONE, ids[:20], "a")
    add_captions(root, [rows[3]], "c-1", "a recaptioned photo")
    sync_lab(root, captioner_ids=["c-1", "d-1"])
    wider = _publish(root, TWO, ids[:20], "b", previous=base)
    assert wider.layout == "delta" and wider.skipped == 1 and wider.extra["added"] == 1
    with open_shard_set(wider) as sds:
        got = {s["image_id"]: s["caption_c"] for s in sds}
    assert len(got) == 20 and got[ids[3]].startswith("a recaptioned photo")
    assert verify_shard_set(wider, lance.dataset(table_uri(root, "images")), sample=20).passed


def test_removed_columns_or_other_settings_write_the_set_whole(lab) -> None:
    root, rows = lab
    ids = [r["image_id"] for r in rows]
    wide = _publish(root, TWO, ids[:20], "a")
    narrower = _publish(root, ONE, ids[:20], "b", previous=wide)  # caption_d would still be read: rewrite
    assert narrower.layout == "full" and set(narrower.columns) == set(wide.columns) - {"caption_d"}
    other = _publish(root, TWO, ids[:20], "c", previous=narrower,
                     settings=ShardSettings(workers=1, size_limit=1 << 18))
    assert other.layout == "full"


def test_a_sidecar_that_does_not_line_up_is_refused(lab) -> None:
    root, rows = lab
    ids = [r["image_id"] for r in rows]
    base = _publish(root, ONE, ids[:20], "a")
    wider = _publish(root, TWO, ids[:20], "b", previous=base)
    other = _publish(root, ONE, ids[4:24], "x")  # another stream's sidecar named in the manifest
    bad = ShardSetManifest.from_json(wider.to_json())
    stream = {**bad.streams[0], "uri": other.uri}
    bad = ShardSetManifest.from_dict({**bad.to_dict(), "streams": [stream]})
    with pytest.raises(SidecarMismatch), open_shard_set(bad) as sds:
        list(sds)


def test_sidecars_on_an_s3_data_root(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """Remote sidecar shards are downloaded and cached beside the stream's shards."""
    root = DataRoot(f"s3://{s3_env['BUCKET']}/prx")
    build(root, tmp_path / "photos", n=10, batch_size=100)
    ds = lance.dataset(table_uri(root, "images"), storage_options=root.storage_options())
    rows = sorted(ds.to_table(columns=["image_id", "sha256", "batch"]).to_pylist(), key=lambda r: r["image_id"])
    add_captions(root, rows, "c-1", "a photo")
    add_captions(root, rows, "d-1", "a tag list")
    sync_lab(root, captioner_ids=["c-1", "d-1"])
    ids = [r["image_id"] for r in rows]
    base = _publish(root, ONE, ids, "a")
    wider = _publish(root, TWO, ids, "b", previous=base)
    assert wider.layout == "delta" and wider.streams[0]["sidecars"][0]["uri"].startswith("s3://")
    cache = tmp_path / "cache"
    with open_shard_set(wider, cache=str(cache), batch_size=2) as sds:
        got = {s["image_id"]: s["caption_d"] for s in sds}
    assert sorted(got) == ids and all(v.startswith("a tag list") for v in got.values())
    assert any("_prx_sidecar0" in p.as_posix() for p in cache.rglob("*.mds"))
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("prx-mds-cache-*"))
    lab = lance.dataset(table_uri(root, "images"), storage_options=root.storage_options())
    assert verify_shard_set(wider, lab, sample=4).passed
    assert set(Path(tempfile.gettempdir()).glob("prx-mds-cache-*")) == before  # the read-back cleans up


def test_precomputed_latents_added_later_are_a_sidecar(lab, tiny_models: dict[str, str]) -> None:
    """Turning precomputed latents on for a published set writes the text tower's columns beside it."""
    import numpy as np

    from prx_assets.core.models.text_encoder import TextEncoder, TextTowerSpec

    root, rows = lab
    ids = [r["image_id"] for r in rows]
    base = _publish(root, TWO, ids[:12], "a")
    before = _files(Path(base.uri))
    spec = TextTowerSpec(model=tiny_models["text"], name="tiny", max_length=8)
    with_latents = _publish(root, TWO, ids[:12], "b", previous=base,
                            settings=ShardSettings(workers=2, size_limit=1 << 17, text_tower=spec))
    assert with_latents.layout == "delta" and _files(Path(base.uri)) == before
    assert with_latents.extra["sidecar_columns"] == sorted(
        ["latent_caption_c_tiny", "attention_mask_caption_c_tiny", "latent_caption_d_tiny",
         "attention_mask_caption_d_tiny"])
    encoder = TextEncoder(spec, device="cpu")
    with open_shard_set(with_latents) as sds:
        sample = sds[0]
    expected, _ = encoder.encode_numpy([sample["caption_d"]])
    assert sample["latent_caption_d_tiny"].shape == expected[0].shape
    assert np.allclose(sample["latent_caption_d_tiny"], expected[0], atol=1e-2)
