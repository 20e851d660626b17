"""Concurrent writers in real processes: both land (Lance commit retries), nothing is lost."""

import multiprocessing as mp
from pathlib import Path
from typing import Any

import lance
import pytest

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.table import table_uri
from tests.helpers import write_folder_corpus


def _source(folder: str) -> SourceConfig:
    return SourceConfig(name="photos", kind="folder", location=folder, batch_size=6,
                        ingest=IngestSettings(workers=1))


def _ingest(root: str, folder: str, key: str, barrier: Any, rounds: int) -> None:
    from prx_assets.core.ingest.batches import load_manifest
    from prx_assets.core.ingest.pipeline import ingest_batch

    r = DataRoot(root)
    cfg = _source(folder)
    barrier.wait()
    for _ in range(rounds):  # re-ingesting too: updates race with the other writer's inserts
        ingest_batch(load_manifest(r, key), reader_for(cfg), r, cfg.ingest)


def _enrich(root: str, kind: str, model: str, barrier: Any) -> None:
    from prx_assets.core.enrich.enrichment import enrich_batch
    from prx_assets.core.lab.schema import (
        CAPTIONS_SCHEMA,
        CAPTIONS_TABLE,
        embeddings_schema,
        embeddings_table,
    )
    from prx_assets.core.models.caption_spec import CaptionerSpec
    from prx_assets.core.models.captions import TransformersCaptioner
    from prx_assets.core.models.embeddings import EmbedderSpec, ImageEmbedder

    r = DataRoot(root)
    if kind == "captions":
        cap = TransformersCaptioner(CaptionerSpec(name="c", model=model, max_new_tokens=6))
        barrier.wait()
        for key in ("photos-00001", "photos-00002"):
            enrich_batch(r, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "c-1",
                         ["caption", "tokens", "seconds", "hit_max_tokens", "model"],
                         lambda: lambda ims: [{"caption": c.text, "tokens": c.tokens, "seconds": c.seconds,
                                               "hit_max_tokens": c.hit_max_tokens, "model": "m"}
                                              for c in cap.caption(ims)])
    else:
        emb = ImageEmbedder(EmbedderSpec(model=model))
        barrier.wait()
        for key in ("photos-00001", "photos-00002"):
            enrich_batch(r, key, embeddings_table("e-1"), embeddings_schema(emb.dim), "embedder_id", "e-1",
                         ["embedding", "model"],
                         lambda: lambda ims: [{"embedding": v.tolist(), "model": "m"} for v in emb.embed(ims)])


def _run_all(procs: list[mp.Process]) -> None:
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"


@pytest.mark.parametrize("where", ["local", "gs"])
def test_two_partitions_ingested_at_once_both_land(where: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=12, broken=False)
    if where == "gs":  # concurrent Lance commits on GCS (conditional writes), not only on a filesystem
        root = DataRoot(f"gs://{request.getfixturevalue('gcs_env')['BUCKET']}/root")
    else:
        root = DataRoot(str(tmp_path / "root"))
    discover(_source(str(folder)), reader_for(_source(str(folder))), root)
    keys = [m.key for m in load_manifests(root, "photos")]
    assert keys == ["photos-00001", "photos-00002"]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    _run_all([ctx.Process(target=_ingest, args=(root.uri, str(folder), k, barrier, 3), name=k) for k in keys])
    ds = lance.dataset(table_uri(root, "images"), storage_options=root.storage_options())
    batches = ds.to_table(columns=["batch"]).column("batch").to_pylist()
    assert sorted(batches) == ["photos-00001"] * 6 + ["photos-00002"] * 6
    assert len(set(ds.to_table(columns=["image_id"]).column(0).to_pylist())) == 12


def test_recaptions_and_embeddings_at_once_both_land(tmp_path: Path, tiny_models: dict[str, str]) -> None:
    from prx_assets.core.ingest.pipeline import ingest_batch

    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=8, broken=False)
    root = DataRoot(str(tmp_path / "root"))
    cfg = _source(str(folder))
    discover(cfg, reader_for(cfg), root)
    for m in load_manifests(root, "photos"):
        ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    _run_all([ctx.Process(target=_enrich, args=(root.uri, "captions", tiny_models["vl"], barrier), name="cap"),
              ctx.Process(target=_enrich, args=(root.uri, "embeddings", tiny_models["siglip"], barrier),
                          name="emb")])
    assert lance.dataset(table_uri(root, "captions")).count_rows() == 8
    assert lance.dataset(table_uri(root, "embeddings_e-1")).count_rows() == 8
