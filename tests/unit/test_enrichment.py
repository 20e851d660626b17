"""Incremental captions and embeddings per batch: skip, coexist, reuse identical content."""

import shutil
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.enrich.enrichment import enrich_batch
from prx_assets.core.ingest.batches import discover, load_manifest
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.schema import CAPTIONS_SCHEMA, CAPTIONS_TABLE, embeddings_schema, embeddings_table
from prx_assets.core.lab.table import table_uri
from prx_assets.core.models.caption_spec import CaptionerSpec
from prx_assets.core.models.captions import TransformersCaptioner
from prx_assets.core.models.embeddings import EmbedderSpec, ImageEmbedder
from tests.helpers import write_folder_corpus


@pytest.fixture
def batch(tmp_path: Path) -> tuple[DataRoot, str, Path]:
    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=4, broken=False)
    shutil.copy(folder / "img_0_000.jpg", folder / "dup_of_000.jpg")  # identical content
    cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=100,
                       ingest=IngestSettings(workers=1))
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    return root, "photos-00001", folder


def caption_factory(model: str, calls: list[int], **kw: object):
    def factory():
        calls.append(1)
        cap = TransformersCaptioner(CaptionerSpec(name="t", model=model, max_new_tokens=10, batch_size=4, **kw))
        return lambda images: [{"caption": r.text, "tokens": r.tokens, "seconds": r.seconds,
                                "hit_max_tokens": r.hit_max_tokens, "model": model}
                               for r in cap.caption(images)]
    return factory


PAYLOAD = ["caption", "tokens", "seconds", "hit_max_tokens", "model"]


def captions(root: DataRoot, key: str) -> dict[str, str]:
    t = lance.dataset(table_uri(root, CAPTIONS_TABLE)).to_table(filter=f"captioner_id = '{key}'")
    return dict(zip(t.column("image_id").to_pylist(), t.column("caption").to_pylist(), strict=True))


def test_incremental_skip_and_no_model_load_when_nothing_missing(batch, tiny_models) -> None:
    root, key, _ = batch
    calls: list[int] = []
    res = enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "a-1", PAYLOAD,
                       caption_factory(tiny_models["vl"], calls))
    assert (res.images, res.missing, res.computed, res.reused, res.written) == (5, 5, 4, 1, 5)
    assert res.changed and calls == [1]
    again = enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "a-1", PAYLOAD,
                         caption_factory(tiny_models["vl"], calls))
    assert (again.missing, again.computed, again.written, again.changed) == (0, 0, 0, False)
    assert calls == [1] and again.version == res.version


def test_duplicates_share_one_caption_and_two_captioners_coexist(batch, tiny_models) -> None:
    root, key, _ = batch
    calls: list[int] = []
    enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "a-1", PAYLOAD,
                 caption_factory(tiny_models["vl"], calls))
    first = captions(root, "a-1")
    rows = lance.dataset(table_uri(root, "images")).to_table(columns=["image_id", "uri"]).to_pylist()
    by_name = {Path(r["uri"]).name: r["image_id"] for r in rows}
    assert first[by_name["img_0_000.jpg"]] == first[by_name["dup_of_000.jpg"]]
    images_files = {f.path for f in lance.dataset(table_uri(root, "images")).get_fragments() for f in f.data_files()}

    enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "b-2", PAYLOAD,
                 caption_factory(tiny_models["vl"], calls, prompt="Name the main color."))
    assert captions(root, "a-1") == first  # the first captioner's captions are untouched
    assert set(captions(root, "b-2")) == set(first)
    assert images_files == {f.path for f in lance.dataset(table_uri(root, "images")).get_fragments()
                            for f in f.data_files()}


def test_changed_content_is_recomputed(batch, tiny_models) -> None:
    root, key, folder = batch
    calls: list[int] = []
    enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "a-1", PAYLOAD,
                 caption_factory(tiny_models["vl"], calls))
    # The source file is replaced and its partition re-ingested: same image_id, new sha256.
    shutil.copy(folder / "sub" / "img_0_001.png", folder / "img_0_002.webp")
    cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=100,
                       ingest=IngestSettings(workers=1))
    ingest_batch(load_manifest(root, key), reader_for(cfg), root, cfg.ingest)
    res = enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "a-1", PAYLOAD,
                       caption_factory(tiny_models["vl"], calls))
    assert res.missing == 1 and res.computed == 0 and res.reused == 1  # same content as img_0_001
    assert lance.dataset(table_uri(root, CAPTIONS_TABLE)).count_rows() == 5


def test_embeddings_identical_images_identical_vectors(batch, tiny_models) -> None:
    root, key, _ = batch
    emb = ImageEmbedder(EmbedderSpec(model=tiny_models["siglip"]))
    name = embeddings_table("s-1")

    def factory():
        return lambda images: [{"embedding": v.tolist(), "model": "tiny"} for v in emb.embed(images)]

    res = enrich_batch(root, key, name, embeddings_schema(emb.dim), "embedder_id", "s-1",
                       ["embedding", "model"], factory)
    assert res.written == 5 and res.computed == 4
    t = lance.dataset(table_uri(root, name)).to_table().to_pylist()
    vecs = {r["image_id"]: np.array(r["embedding"], np.float32) for r in t}
    assert all(v.shape == (emb.dim,) and abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs.values())
    rows = lance.dataset(table_uri(root, "images")).to_table(columns=["image_id", "uri"]).to_pylist()
    by_name = {Path(r["uri"]).name: r["image_id"] for r in rows}
    assert np.array_equal(vecs[by_name["img_0_000.jpg"]], vecs[by_name["dup_of_000.jpg"]])


def test_vector_dtype_is_stored_and_in_the_embedder_id_only_when_not_float32(tmp_path: Path) -> None:
    from prx_assets.core.models.config import load_models
    from prx_assets.errors import ConfigError

    plain = EmbedderSpec(model="google/siglip2-so400m-patch14-384")
    half = EmbedderSpec(model="google/siglip2-so400m-patch14-384", vector_dtype="float16")
    assert plain.embedder_id() == "siglip-eaf90b7e"  # float32 ids are those of before the option
    assert half.embedder_id() != plain.embedder_id()
    assert embeddings_schema(8, "float16").field("embedding").type.value_type == pa.float16()
    cfg = tmp_path / "models.yaml"
    cfg.write_text("captioners: []\nembedder: {model: m, vector_dtype: float16}\n")
    assert load_models(cfg).embedder.vector_dtype == "float16"
    cfg.write_text("captioners: []\nembedder: {model: m, vector_dtype: int8}\n")
    with pytest.raises(ConfigError, match="unknown vector_dtype 'int8'"):
        load_models(cfg)
