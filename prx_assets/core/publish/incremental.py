"""Incremental shard sets: a changed subset is published as a delta, not a rewrite.

A published shard set is a list of physical MDS streams plus a skip list:

- every stream folder holds ``samples.parquet``: the ``image_id`` and content ``digest`` of each
  sample, in the stream's sample-index order (written with the stream, never changed);
- a set whose subset differs a little from the previously published one reuses the previous
  set's streams as they are (no file is touched), adds one *delta* stream with the new samples,
  and lists the removed ones in ``skip.parquet`` (``stream``, ``index``, ``image_id``), which
  :class:`prx_assets.loader.PrxStreamingDataset` honours, so a removed sample is never yielded;
- a sample whose content changed (new original, new normalization, new published caption) is
  a removal plus an addition;
- a new column (a captioner added to a caption mix, a text tower's latents) is written as a
  *sidecar* per stream, aligned by sample index (:mod:`prx_assets.core.publish.columns`): no
  image byte is rewritten, and the sidecar's ``samples.parquet`` holds the digests as the
  samples now read;
- when the delta and skipped share of the live samples passes ``compact_above`` (or the layout
  or settings differ), the set is written fresh and whole: that is the compaction rule.

Diffs run in Arrow (anti-joins on ``image_id`` + ``digest``), not over Python object lists.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prx_assets.core.config.storage import DataRoot, read_uri
from prx_assets.core.curate.digests import content_digest
from prx_assets.core.manifests import ShardSetManifest

SAMPLES_FILE = "samples.parquet"
SKIP_FILE = "skip.parquet"
SAMPLES_SCHEMA = pa.schema([("image_id", pa.string()), ("digest", pa.string())])
SKIP_SCHEMA = pa.schema([("stream", pa.int32()), ("index", pa.int64()), ("image_id", pa.string())])
#: Default compaction rule: rewrite whole once deltas plus skipped samples pass this share of the set.
COMPACT_ABOVE = 0.2


def published_captions(row: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, str]:
    """The caption text each MDS caption column gets for a lab row (first non-empty source)."""
    return {mds_col: next((row[c] for c in sources if row[c]), "") for mds_col, sources in plan["columns"].items()}


def sample_digest(row: Mapping[str, Any], caption_columns: Sequence[str]) -> str:
    """A sample's content digest: the curated subset's per-image digest (same definition, so the
    subset's ``ids.parquet`` and a stream's ``samples.parquet`` compare directly)."""
    return content_digest(row["sha256"], row["ingest_config"], {c: row[c] for c in caption_columns})


def digest_columns(caption_columns: Sequence[str]) -> list[str]:
    """Lab columns a sample digest needs."""
    return list(dict.fromkeys(["sha256", "ingest_config", *caption_columns]))


def uri_join(base: str, name: str) -> str:
    """``base/name`` for a local folder or an object-store URI."""
    return f"{base.rstrip('/')}/{name}"


def read_table_at(uri: str, root: DataRoot) -> pa.Table:
    """A Parquet file by absolute path or URI (local or object store, with ``root``'s credentials)."""
    return pq.read_table(io.BytesIO(read_uri(uri, root.settings)))


def parquet_bytes(table: pa.Table) -> bytes:
    """A table as Parquet bytes."""
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


@dataclass(frozen=True)
class Delta:
    """What changes from the previous set: samples to add (ids) and the cumulative skip list."""

    previous: ShardSetManifest
    added: pa.Array  # image ids, sorted
    skip: pa.Table  # stream, index, image_id: every sample of the previous streams not to yield
    removed: int  # newly skipped by this change


def samples_uri(stream: Mapping[str, Any]) -> str:
    """Where a stream's current per-sample digests are: its last sidecar's ``samples.parquet`` (the
    samples as they read with every column added since), else the stream's own."""
    sidecars = stream.get("sidecars") or []
    return uri_join(sidecars[-1]["uri"] if sidecars else stream["uri"], SAMPLES_FILE)


def live_samples(root: DataRoot, manifest: ShardSetManifest,
                 samples: Mapping[int, pa.Table] | None = None) -> pa.Table | None:
    """``image_id``, ``digest``, ``stream``, ``index`` of every sample the set yields; ``None`` for sets
    written before sample maps existed (they can only be replaced whole). ``samples`` gives some
    streams' digests directly (sidecars not yet published)."""
    parts = []
    for i, s in enumerate(manifest.streams):
        try:
            t = samples[i] if samples and i in samples else read_table_at(samples_uri(s), root)
        except OSError:  # no sample map: written before they existed
            return None
        parts.append(t.select(["image_id", "digest"])
                     .append_column("stream", pa.array([i] * t.num_rows, pa.int32()))
                     .append_column("index", pa.array(range(t.num_rows), pa.int64())))
    if not parts:
        return None
    table = pa.concat_tables(parts)
    if manifest.skip_uri:
        skip = read_table_at(manifest.skip_uri, root).select(["stream", "index"])
        table = table.join(skip, keys=["stream", "index"], join_type="left anti")
    return table


def plan_delta(root: DataRoot, previous: ShardSetManifest, new: pa.Table,
               compact_above: float = COMPACT_ABOVE, live: Mapping[int, pa.Table] | None = None) -> Delta | None:
    """The delta from ``previous`` (a set with the same layout and settings) to the subset ``new``
    (``image_id``, ``digest``), or ``None`` when the set must be written whole (no sample maps,
    or past the compaction rule). ``live``: digests of some streams, as :func:`live_samples` takes."""
    if not previous.streams:
        return None
    current = live_samples(root, previous, live)
    if current is None:
        return None
    removed = current.join(new, keys=["image_id", "digest"], join_type="left anti")
    added = new.join(current.select(["image_id", "digest"]), keys=["image_id", "digest"], join_type="left anti")
    old_skip = read_table_at(previous.skip_uri, root) if previous.skip_uri else SKIP_SCHEMA.empty_table()
    skip = pa.concat_tables([old_skip.cast(SKIP_SCHEMA),
                             removed.select(["stream", "index", "image_id"]).cast(SKIP_SCHEMA)])
    delta_samples = sum(int(s["samples"]) for s in previous.streams[1:]) + added.num_rows
    if new.num_rows == 0 or (delta_samples + skip.num_rows) / new.num_rows > compact_above:
        return None
    added_ids = added.column("image_id").combine_chunks()
    return Delta(previous=previous, added=added_ids.take(pc.sort_indices(added_ids)), skip=skip,
                 removed=removed.num_rows)


def sample_map(index: Mapping[str, Any], parts: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """``samples.parquet`` of a stream merged from part folders: each part's ``image_id`` and ``digest``
    (a table in write order), placed where the merged ``index.json`` puts the part's shards (Arrow
    slices: no Python object per sample)."""
    by_folder = dict(parts)
    taken: dict[str, int] = {}
    pieces: list[pa.Table] = []
    for shard in index["shards"]:
        folder = shard["raw_data"]["basename"].rsplit("/", 1)[0] if "/" in shard["raw_data"]["basename"] else ""
        start = taken.get(folder, 0)
        rows = by_folder[folder].slice(start, int(shard["samples"]))
        taken[folder] = start + rows.num_rows
        pieces.append(rows.select(["image_id", "digest"]).cast(SAMPLES_SCHEMA))
    return pa.concat_tables(pieces).combine_chunks() if pieces else SAMPLES_SCHEMA.empty_table()
