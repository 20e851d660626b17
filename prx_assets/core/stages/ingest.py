"""The ``raw_images`` stage: one ingest batch, in-process or inside a job."""

from __future__ import annotations

from collections.abc import Callable

from prx_assets.core.ingest.batches import load_manifest, parse_batch_key
from prx_assets.core.ingest.pipeline import IngestResult, ingest_batch
from prx_assets.core.ingest.readahead import READAHEAD, BatchInputs
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.stages.settings import S3Settings, StageResources


def batch_inputs(res: StageResources, key: str) -> BatchInputs:
    """What ingesting partition ``key`` reads: its data root, source configuration and manifest."""
    cfg = res.project.sources().get(parse_batch_key(key)[0])
    root = res.storage.root()
    return BatchInputs(resources=res.to_json(), source=cfg, manifest=load_manifest(root, key),
                       reader=reader_for(cfg, s3_client=(res.s3 or S3Settings()).get_client))


def expect_batches(res: StageResources, keys: list[str]) -> None:
    """Tell the process's read-ahead that it ingests ``keys`` next, in that order (see
    :mod:`prx_assets.core.ingest.readahead`)."""
    READAHEAD.expect(keys, lambda key: batch_inputs(res, key))


def ingest_stage(res: StageResources, key: str, log: Callable[[str], None]) -> IngestResult:
    """The work of one raw_images partition. What the process read of it ahead (see
    :func:`expect_batches`) is taken over when it came from the same inputs."""
    inputs = batch_inputs(res, key)
    cfg, manifest = inputs.source, inputs.manifest
    log(f"ingesting {key}: {len(manifest.units)} units ({manifest.weight} items) "
        f"from {cfg.kind} source {cfg.location}")
    ahead = READAHEAD.take(inputs)
    result = ingest_batch(manifest, inputs.reader, res.storage.root(), cfg.ingest,
                          outcomes=ahead.outcomes() if ahead is not None else None,
                          on_drained=lambda: READAHEAD.after(key))
    if ahead is not None:
        result.read_ahead, result.read_ahead_seconds = ahead.taken, ahead.taken_after
    log(f"{key}: {result.rows} rows, {result.rejected} rejects {result.rejects}, "
        f"Lance version {result.images_version}"
        + (f", {result.read_ahead} images read ahead" if result.read_ahead else ""))
    return result
