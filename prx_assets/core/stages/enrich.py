"""The ``recaptions`` and ``image_embeddings`` stages: one batch with one model, in-process or
inside a job (a job over several partitions loads its model once)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prx_assets.core.enrich.decode import CAPTION_DECODE_PIXELS, EMBED_DECODE_PIXELS
from prx_assets.core.enrich.enrichment import Decoding, EnrichResult, enrich_batch
from prx_assets.core.lab.schema import CAPTIONS_SCHEMA, CAPTIONS_TABLE, embeddings_schema, embeddings_table
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.stages.settings import CaptionerSettings, EmbedderSettings, StageResources

#: How a recaptions partition key joins its dimensions (Dagster's multi-partition key, dimensions
#: in name order: batch, captioner).
KEY_SEPARATOR = "|"


def split_recaption_key(key: str) -> tuple[str, str]:
    """``(batch, captioner_id)`` of a recaptions partition key ``<batch>|<captioner id>``."""
    batch, sep, captioner_id = str(key).partition(KEY_SEPARATOR)
    if not sep or not batch or not captioner_id:
        raise ValueError(f"recaptions partition key {key!r} is not <batch>|<captioner id>")
    return batch, captioner_id


def recaption_stage(res: StageResources, key: str, log: Callable[[str], None]) -> EnrichResult:
    """The work of one recaptions partition."""
    batch, captioner_id = split_recaption_key(key)
    spec = res.project.models().captioner(captioner_id)
    captioner = res.captioner or CaptionerSettings()

    def factory() -> Any:
        held, started = captioner.is_loaded(spec), time.perf_counter()
        loaded = captioner.load(spec)
        if not held:
            log(f"loaded captioner {captioner_id} ({spec.model}) on {getattr(loaded, 'device', 'a server')} "
                f"in {time.perf_counter() - started:.1f} s")

        def compute(images: Any) -> list[dict[str, Any]]:
            return [{"caption": r.text, "tokens": r.tokens, "seconds": r.seconds,
                     "hit_max_tokens": r.hit_max_tokens, "model": spec.model}
                    for r in loaded.caption(images)]
        return compute

    return enrich_batch(res.storage.root(), batch, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", captioner_id,
                        ["caption", "tokens", "seconds", "hit_max_tokens", "model"], factory,
                        decoding=Decoding(count=max(1, captioner.effective(spec).batch_size) * 8,
                                          max_pixels=spec.max_pixels or CAPTION_DECODE_PIXELS))


def embedding_stage(res: StageResources, key: str, log: Callable[[str], None]) -> EnrichResult:
    """The work of one image_embeddings partition."""
    models = res.project.models()
    if models.embedder is None:
        raise ValueError(f"no embedder configured in {models.path}; add embedder: {{model: ...}}")
    spec = models.embedder
    embedder = res.embedder or EmbedderSettings()
    root = res.storage.root()
    load_seconds = 0.0

    def model() -> Any:
        nonlocal load_seconds
        if embedder.is_loaded(spec):
            return embedder.load(spec)
        started = time.perf_counter()
        loaded = embedder.load(spec)
        load_seconds = time.perf_counter() - started
        log(f"loaded embedder {spec.embedder_id()} ({spec.model}) in {load_seconds:.1f} s")
        return loaded

    def factory() -> Any:
        loaded = model()

        def compute(images: Any) -> list[dict[str, Any]]:
            return [{"embedding": v.tolist(), "model": spec.model} for v in loaded.embed(images)]
        return compute

    name = embeddings_table(spec.embedder_id())
    existing = open_table(table_uri(root, name), root.storage_options())
    dim = existing.schema.field("embedding").type.list_size if existing is not None else model().dim
    result = enrich_batch(root, key, name, embeddings_schema(dim, spec.vector_dtype), "embedder_id", spec.embedder_id(),
                          ["embedding", "model"], factory,
                          decoding=Decoding(count=max(1, spec.batch_size), max_pixels=EMBED_DECODE_PIXELS))
    result.load_seconds = load_seconds  # including a load for the first batch's vector size
    return result
