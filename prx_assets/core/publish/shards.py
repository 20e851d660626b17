"""MDS shard sets: immutable, atomically published serializations of curated subsets.

A shard set is written from a subset (image ids pinned to a Lance version) with the
exact stored JPEG bytes (never re-encoded), the chosen caption column(s) and metadata
(see ``MDS_BASE_COLUMNS``). Parallel writers each write a part folder and
``merge_index`` joins their indexes. Publication is atomic: on a filesystem the set is
written in a staging folder and renamed into place; on an object store the shard files
are uploaded first and ``index.json`` then ``manifest.json`` last, so a reader (which
needs ``index.json``) never sees a partial set. ``manifest.json`` records the lineage.

Caption columns: with ``captions: [a, b]`` the set has one ``caption`` column holding the
first available caption in that order; with ``caption_mix: {a: w, b: w}`` it has one
column per captioner, ``caption_<name>``, and the weights are in the manifest for the
trainer to sample from.

Text latents are not in the shards by default: the trainer encodes captions on the fly, so
the text encoder can change without rewriting shards. With ``ShardSettings.text_tower`` set
(``precomputed_latents``), every caption column also gets
``latent_{caption_key}_{tower}`` (float16, ``max_length`` x hidden size) and
``attention_mask_{caption_key}_{tower}`` (uint8) columns, PRX's naming.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot, is_remote, read_uri
from prx_assets.core.config.stores import split_object_uri
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.faults import crash_point
from prx_assets.core.lab.schema import MDS_BASE_COLUMNS, MDS_FROM_LAB
from prx_assets.core.lab.sql import ID_CHUNK, fetch_by_ids, rows_by_ids, where_eq
from prx_assets.core.lab.sync import caption_column
from prx_assets.core.layout import SIDECAR_DIR
from prx_assets.core.manifests import ShardSetManifest, SubsetManifest
from prx_assets.core.models.text_encoder import TextEncoder, TextTowerSpec, latent_column, mask_column
from prx_assets.core.publish.incremental import (
    COMPACT_ABOVE,
    SAMPLES_FILE,
    SAMPLES_SCHEMA,
    SKIP_FILE,
    Delta,
    digest_columns,
    parquet_bytes,
    plan_delta,
    published_captions,
    read_table_at,
    sample_digest,
    sample_map,
    samples_uri,
    uri_join,
)
from prx_assets.core.publish.integrity import check_shard_set
from prx_assets.core.scratch import make_scratch, reap, release
from prx_assets.errors import IntegrityError, PrxError

SHARDS_CODE_VERSION = "shards-1"
#: Cache bound (index and metadata, each) of the lab handle a shard set is written from: the rows
#: are looked up by id in id order, so consecutive chunks use the same index pages and a small cache
#: serves them; with Lance's defaults (6 GB + 1 GB) a whole write's caches grow with the samples up
#: to those caps (160-190 MB at 500k samples, and no faster for it; see docs/benchmark-notes.md).
LAB_CACHE_BYTES = 256 * 2**20


class ShardError(PrxError):
    """A shard set cannot be written or verified."""


@dataclass(frozen=True)
class ShardSettings:
    """How a shard set is written (part of its identity)."""

    size_limit: int = 64 * 1024 * 1024
    compression: str | None = None
    hashes: tuple[str, ...] = ("xxh64",)
    workers: int = 2
    by_bucket: bool = False
    text_tower: TextTowerSpec | None = None  # precomputed_latents: encode captions into the shards

    def key(self) -> str:
        """Short identity of the settings that change the files."""
        tower = None if self.text_tower is None else [self.text_tower.tower(), self.text_tower.identity()]
        payload = json.dumps({"size_limit": self.size_limit, "compression": self.compression,
                              "hashes": list(self.hashes), "by_bucket": self.by_bucket,
                              "code": SHARDS_CODE_VERSION, **({"text_tower": tower} if tower else {})},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:8]


def caption_plan(recipe: Recipe, caption_columns: Sequence[str], captioner_ids: Sequence[str]) -> dict[str, Any]:
    """MDS caption columns and where each comes from (see module docs)."""
    def col_for(name: str) -> str:
        ids = [i for i in captioner_ids if i == name or i.rsplit("-", 1)[0] == name]
        cols = [caption_column(i) for i in ids] or [caption_column(name)]
        found = next((c for c in cols if c in caption_columns), None)
        if found is None:
            raise ShardError(f"recipe {recipe.name!r}: captioner {name!r} has no caption column in the subset")
        return found

    if recipe.caption_mix:
        return {"mode": "mix", "columns": {f"caption_{n}": [col_for(n)] for n, _ in recipe.caption_mix},
                "weights": {f"caption_{n}": w for n, w in recipe.caption_mix}}
    if recipe.captions:
        return {"mode": "first_available", "columns": {"caption": [col_for(n) for n in recipe.captions]},
                "weights": {"caption": 1.0}}
    return {"mode": "none", "columns": {}, "weights": {}}


def _caption_samples(rows: dict[str, dict[str, Any]], chunk: Sequence[str], plan: dict[str, Any],
                     lab_version: int, *, missing_ok: bool = False) -> list[dict[str, Any]]:
    """``image_id`` and the published caption columns of each id (``""`` for ids the lab lacks
    when ``missing_ok``: a sidecar row of a sample that is skipped anyway)."""
    out = []
    for image_id in chunk:
        r = rows.get(image_id)
        if r is None and not missing_ok:
            raise ShardError(f"image {image_id!r} is in the subset but not in Lance version {lab_version}")
        out.append({"image_id": image_id, **(published_captions(r, plan) if r is not None
                                             else {c: "" for c in plan["columns"]})})
    return out


def _add_latents(samples: list[dict[str, Any]], encoder: TextEncoder, caption_keys: Sequence[str]) -> None:
    """Encode the caption columns ``caption_keys`` of ``samples`` into their latent and mask columns."""
    tower = encoder.spec.tower()
    for mds_col in caption_keys:
        for j in range(0, len(samples), 64):
            part = samples[j:j + 64]
            lat, mask = encoder.encode_numpy([s[mds_col] for s in part])
            for s, la, ma in zip(part, lat, mask, strict=True):
                s[latent_column(mds_col, tower)] = la
                s[mask_column(mds_col, tower)] = ma


#: Image ids as handed between the shard writer's steps: one Arrow string array (never a Python list
#: of a whole subset: 10^8 ids are about 4 GB as Arrow and several times that as Python strings).
Ids = pa.Array


def as_ids(ids: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """``ids`` as one Arrow string array (a Python list is converted; Arrow input is not copied
    unless it comes in several chunks)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    elif not isinstance(ids, pa.Array):
        ids = pa.array(list(ids), pa.string())
    return ids.cast(pa.string()) if ids.type != pa.string() else ids


def id_chunks(ids: Ids, size: int = ID_CHUNK) -> Iterator[list[str]]:
    """Consecutive chunks of ``ids`` as Python lists of at most ``size`` ids (the only Python objects
    a step holds)."""
    for start in range(0, len(ids), size):
        yield ids.slice(start, size).to_pylist()


def _write_part(lab: lance.LanceDataset, ids: Ids, out: str, columns: dict[str, str],
                plan: dict[str, Any], settings: ShardSettings, encoder: TextEncoder | None = None,
                caption_columns: Sequence[str] = ()) -> pa.Table:
    """Write ``ids`` as one MDS part; return its ``image_id`` and ``digest`` per sample in write order
    (Arrow, built a chunk of ids at a time)."""
    from streaming import MDSWriter

    sources = [c for cs in plan["columns"].values() for c in cs]
    checked = ["stored_sha256"] if "stored_sha256" in lab.schema.names else []
    lab_cols = list(dict.fromkeys([*MDS_FROM_LAB.values(), *sources, *digest_columns(caption_columns), *checked]))
    digests: list[pa.Array] = []
    with MDSWriter(out=out, columns=columns, compression=settings.compression,
                   hashes=list(settings.hashes) or None, size_limit=settings.size_limit) as writer:
        for part in id_chunks(ids):
            (chunk, rows), = rows_by_ids(lab, part, lab_cols, chunk=len(part))
            check_stored(rows, lab.version)
            samples = _caption_samples(rows, chunk, plan, lab.version)
            chunk_digests = []
            for image_id, sample in zip(chunk, samples, strict=True):
                r = rows[image_id]
                sample.update({k: r[v] for k, v in MDS_FROM_LAB.items()})
                chunk_digests.append(sample_digest(r, caption_columns))
            digests.append(pa.array(chunk_digests, pa.string()))
            if encoder is not None:
                _add_latents(samples, encoder, list(plan["columns"]))
            for sample in samples:
                writer.write(sample)
    return pa.table({"image_id": ids, "digest": pa.chunked_array(digests, pa.string())}, schema=SAMPLES_SCHEMA)


def check_stored(rows: dict[str, dict[str, Any]], version: int) -> None:
    """Refuse to publish stored bytes whose sha256 is not the one ingest recorded (rows written before
    the digest existed carry none and pass; ``prx-assets migrate`` records theirs).

    Raises
    ------
    IntegrityError
        Naming the corrupt images and the fix.
    """
    bad = [i for i, r in rows.items()
           if r.get("stored_sha256") and hashlib.sha256(r["jpeg"]).hexdigest() != r["stored_sha256"]]
    if bad:
        raise IntegrityError(
            f"{len(bad)} images in lab version {version} do not match the digest recorded at ingest (e.g. "
            f"{', '.join(bad[:5])}): their stored bytes are corrupt and are not published. Run `prx-assets doctor "
            "--verify` to find every corrupt row and `--repair` to ingest them again from their sources")


def subset_digests(lab: lance.LanceDataset, ids: Sequence[str] | pa.Array | pa.ChunkedArray,
                   caption_columns: Sequence[str]) -> pa.Table:
    """``image_id`` and content ``digest`` of every subset sample, from the lab (for subsets written
    before their ``ids.parquet`` kept digests), built a chunk of ids at a time."""
    ids = as_ids(ids)
    digests: list[pa.Array] = []
    for part in id_chunks(ids):
        (chunk, rows), = rows_by_ids(lab, part, digest_columns(caption_columns), chunk=len(part))
        missing = next((i for i in chunk if i not in rows), None)
        if missing is not None:
            raise ShardError(f"image {missing!r} is in the subset but not in Lance version {lab.version}")
        digests.append(pa.array([sample_digest(rows[i], caption_columns) for i in chunk], pa.string()))
    return pa.table({"image_id": ids, "digest": pa.chunked_array(digests, pa.string())}, schema=SAMPLES_SCHEMA)


def merge_part_indexes(root: Path, parts: Sequence[Path]) -> None:
    """Write ``root/index.json`` over part folders at any depth (``merge_index`` handles one level)."""
    shards = []
    for d in parts:
        rel = d.relative_to(root).as_posix()
        for sh in json.loads((d / "index.json").read_text())["shards"]:
            for key in ("raw_data", "zip_data"):
                if sh.get(key):
                    sh[key]["basename"] = f"{rel}/{sh[key]['basename']}"
            shards.append(sh)
    (root / "index.json").write_text(json.dumps({"version": 2, "shards": shards}, sort_keys=True))


def bucket_dir(bucket: str) -> str:
    """Folder name of an aspect bucket's sub-stream (``16:9`` -> ``bucket_16x9``)."""
    return "bucket_" + bucket.replace(":", "x")


def mds_columns(plan: dict[str, Any], encoder: TextEncoder | None = None) -> dict[str, str]:
    """MDS column encodings of a shard set with this caption plan (and precomputed latents)."""
    cols = {**MDS_BASE_COLUMNS, **{c: "str" for c in plan["columns"]}}
    if encoder is not None:
        tower, length = encoder.spec.tower(), encoder.spec.max_length
        for c in plan["columns"]:
            cols[latent_column(c, tower)] = f"ndarray:float16:{length},{encoder.dim}"
            cols[mask_column(c, tower)] = f"ndarray:uint8:{length}"
    return cols


def shard_set_id(subset_id: str, settings: ShardSettings, plan: dict[str, Any]) -> str:
    """Identity of a shard set: what it holds (the subset's content id and the caption plan that
    picks the published captions) and how it is written (settings that change the files)."""
    plan_key = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:6]
    return f"{subset_id}-s{settings.key()}{plan_key}"


def write_shard_set(root: DataRoot, lab: lance.LanceDataset, recipe: Recipe, subset_manifest: SubsetManifest,
                    ids: Sequence[str] | pa.Array | pa.ChunkedArray, captioner_ids: Sequence[str],
                    settings: ShardSettings,
                    lineage: dict[str, Any] | None = None, previous: ShardSetManifest | None = None,
                    compact_above: float = COMPACT_ABOVE, digests: pa.Table | None = None) -> ShardSetManifest:
    """Write and publish the shard set of a subset; return its manifest (reused if already published).

    With ``previous`` (the recipe's currently published set), a subset that differs by a small
    share is published as a delta: the previous streams stay as they are, the new samples go
    into one delta stream and removed ones into the skip list (see
    :mod:`prx_assets.core.publish.incremental`); past ``compact_above`` it is written whole.
    ``digests`` (``image_id``, ``digest``: the subset's ``ids.parquet``) spares reading them from the lab.
    ``ids`` may be Arrow (a subset's ``image_id`` column): it is never turned into one Python list.
    """
    ids = as_ids(ids)
    if len(ids) == 0:
        raise ShardError(f"recipe {recipe.name!r} selected no images at Lance version "
                         f"{subset_manifest.lance_version}; loosen the recipe (see curated_subsets' "
                         "dropped_by_rule) before writing shards")
    plan = caption_plan(recipe, subset_manifest.caption_columns, captioner_ids)
    set_id = shard_set_id(subset_manifest.subset_id, settings, plan)
    rel = layout.shard_set_dir(recipe.name, set_id)
    _reap_staging(root, recipe.name)
    if root.exists(layout.shard_set_manifest(recipe.name, set_id)):
        return read_shard_set_manifest(root, recipe.name, set_id)
    previous, rebuilt = _reusable(previous)
    encoder = TextEncoder(settings.text_tower, device="auto") if settings.text_tower is not None else None
    if encoder is not None and not plan["columns"]:
        raise ShardError(f"recipe {recipe.name!r} has no caption columns to precompute latents for; set captions: "
                         "or caption_mix: in the recipe, or turn precomputed_latents off")
    columns = mds_columns(plan, encoder)
    job = _SetJob(root=root, lab=lab, set_id=set_id, rel=rel, uri=root.join(rel), plan=plan, columns=columns,
                  settings=settings, encoder=encoder, caption_columns=tuple(subset_manifest.caption_columns))
    started = time.perf_counter()
    staging = make_scratch(None, f"prx-mds-{recipe.name}-") if root.remote else \
        make_scratch(root.join(layout.recipe_shards_dir(recipe.name)),
                     Path(layout.shard_set_staging(recipe.name, set_id, "")).name)
    try:
        written = _write_streams(job, staging, ids, previous, digests, compact_above)
        manifest = _set_manifest(job, recipe, subset_manifest, captioner_ids, ids, written, staging,
                                 seconds=time.perf_counter() - started, lineage=dict(lineage or {}),
                                 rebuilt=rebuilt)
        (staging / layout.SHARD_SET_MANIFEST).write_bytes(manifest.to_json())
        crash_point("shards.before_publish")
        _publish(root, staging, rel)
        crash_point("shards.after_publish")
        return manifest
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
        release(staging)


def _reap_staging(root: DataRoot, recipe: str) -> None:
    """Remove the staging folders that killed writers of ``recipe``'s sets left (their process is gone)."""
    if root.remote:
        reap(None, f"prx-mds-{recipe}-*")
    else:
        reap(root.join(layout.recipe_shards_dir(recipe)), ".staging-*")


def _reusable(previous: ShardSetManifest | None) -> tuple[ShardSetManifest | None, dict[str, Any]]:
    """``previous`` when its streams may be reused; a corrupt stream never is: then ``None`` and why."""
    if previous is None:
        return None, {}
    corrupt = [c for check in check_shard_set(previous) for c in check.corrupt]
    if corrupt:
        return None, {"not_a_delta_of": previous.shard_set_id, "corrupt_previous_shards": corrupt[:20]}
    return previous, {}


@dataclass(frozen=True)
class _SetJob:
    """What every part of one shard set's writing shares."""

    root: DataRoot
    lab: lance.LanceDataset
    set_id: str
    rel: str
    uri: str
    plan: dict[str, Any]
    columns: dict[str, str]
    settings: ShardSettings
    encoder: TextEncoder | None
    caption_columns: tuple[str, ...]

    def written_settings(self) -> dict[str, Any]:
        """The settings that decide the set's bytes, as its manifest records them."""
        s = self.settings
        return {"size_limit": s.size_limit, "compression": s.compression, "hashes": list(s.hashes),
                "by_bucket": s.by_bucket}


@dataclass
class _Written:
    """What writing a set's streams produced in its staging folder."""

    streams: list[Any]
    bucket_streams: Any
    writers: int
    shards: int
    delta: Any = None
    added_columns: dict[str, Any] | None = None
    skip_uri: str | None = None
    skipped: int = 0
    skip_sha256: str | None = None


def _write_streams(job: _SetJob, staging: Path, ids: pa.Array, previous: ShardSetManifest | None,
                   digests: pa.Table | None, compact_above: float) -> _Written:
    """Write the set into ``staging``: as a delta of ``previous`` (sidecars for new columns, a delta
    stream, a skip list) where that is small enough, else whole."""
    kw = {"uri": job.uri, "set_id": job.set_id, "caption_columns": job.caption_columns}
    added_columns = extension_of(previous, job.columns, job.plan, job.written_settings()) \
        if previous is not None else None
    delta = None
    if added_columns is not None and previous is not None:
        if digests is None or "digest" not in digests.column_names:
            digests = subset_digests(job.lab, ids, job.caption_columns)
        base, live = previous, None
        if added_columns:  # new columns for the published samples: sidecars, not a rewrite
            base, live = _write_sidecars(job.root, staging, job.lab, previous, added_columns, job.plan, job.encoder,
                                         job.settings, job.caption_columns, uri=job.uri, set_id=job.set_id)
        delta = plan_delta(job.root, base, digests.select(["image_id", "digest"]), compact_above, live=live)
        if delta is None:
            shutil.rmtree(staging / SIDECAR_DIR, ignore_errors=True)
    if delta is None:
        streams, bucket_streams, writers = _write_whole(staging, job.lab, ids, job.columns, job.plan, job.settings,
                                                         job.encoder, **kw)
        shards = len(json.loads((staging / layout.MDS_INDEX).read_text())["shards"])
        return _Written(streams, bucket_streams, writers, shards)
    streams, bucket_streams, writers = _write_delta(staging, job.lab, delta, job.columns, job.plan, job.settings,
                                                    job.encoder, **kw)
    skip_bytes = parquet_bytes(delta.skip)
    (staging / SKIP_FILE).write_bytes(skip_bytes)
    shards = delta.previous.shards + (len(json.loads((staging / "delta" / layout.MDS_INDEX).read_text())["shards"])
                                      if len(delta.added) else 0)
    return _Written(streams, bucket_streams, writers, shards, delta=delta, added_columns=added_columns,
                    skip_uri=job.root.join(job.rel, SKIP_FILE), skipped=delta.skip.num_rows,
                    skip_sha256=hashlib.sha256(skip_bytes).hexdigest())


def _set_manifest(job: _SetJob, recipe: Recipe, subset: SubsetManifest, captioner_ids: Sequence[str],
                  ids: pa.Array, written: _Written, staging: Path, seconds: float,
                  lineage: dict[str, Any], rebuilt: dict[str, Any]) -> ShardSetManifest:
    """The manifest of the set written into ``staging``."""
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    delta, plan, encoder = written.delta, job.plan, job.encoder
    extra = dict(lineage)
    if delta is not None:
        extra = {**extra, "previous_shard_set_id": delta.previous.shard_set_id, "added": len(delta.added),
                 "removed": delta.removed, "sidecar_columns": sorted(written.added_columns or {})}
    if subset.optout_requests:
        extra = {**extra, "optout_requests": dict(subset.optout_requests)}
    extra.update(rebuilt)
    return ShardSetManifest(
        shard_set_id=job.set_id, recipe=recipe.name, recipe_hash=recipe.recipe_hash(),
        subset_id=subset.subset_id, lance_uri=subset.lance_uri,
        lance_version=subset.lance_version, lance_tag=subset.lance_tag,
        captioner_ids=tuple(c for c in captioner_ids if any(caption_column(c) in cs
                                                            for cs in plan["columns"].values())),
        caption_plan=plan, columns=job.columns, code_version=SHARDS_CODE_VERSION,
        samples=len(ids), shards=written.shards,
        bytes=(delta.previous.bytes if delta else 0) + sum(
            p.stat().st_size for p in files if p.name.endswith(".mds") or ".mds." in p.name),
        settings={**job.written_settings(), "parallel_writers": written.writers},
        text_latents=None if encoder is None else {
            "tower": encoder.spec.tower(), "model": encoder.spec.model, "identity": encoder.spec.identity(),
            "max_length": encoder.spec.max_length, "layer": encoder.spec.layer, "dim": encoder.dim,
            "columns": {c: [latent_column(c, encoder.spec.tower()), mask_column(c, encoder.spec.tower())]
                        for c in plan["columns"]}},
        bucket_streams=written.bucket_streams, uri=job.uri, seconds=round(seconds, 3),
        streams=tuple(written.streams), skip_uri=written.skip_uri, skip_sha256=written.skip_sha256,
        skipped=written.skipped, layout="full" if delta is None else "delta",
        bytes_written=sum(p.stat().st_size for p in files), digest_columns=job.caption_columns, extra=extra)


def extension_of(previous: ShardSetManifest, columns: dict[str, str], plan: dict[str, Any],
                 written_settings: dict[str, Any]) -> dict[str, str] | None:
    """How a new set relates to the ``previous`` published one: ``None`` when it must be written
    whole (other writer settings, bucket sub-streams, a column removed or fed differently), else
    the columns it adds (``{}``: the same columns; a delta and skip list suffice).

    Caption weights are not compared: they live in the manifest, not in the shards.
    """
    if not previous.streams or written_settings["by_bucket"] or previous.bucket_streams:
        return None
    if {k: previous.settings.get(k) for k in written_settings} != written_settings:
        return None
    if any(columns.get(k) != v for k, v in previous.columns.items()):
        return None
    old_sources = previous.caption_plan.get("columns", {})
    if any(plan["columns"].get(c) != src for c, src in old_sources.items()):
        return None
    added = {k: v for k, v in columns.items() if k not in previous.columns}
    if added and previous.digest_columns is None:
        return None  # written before digests named their columns: cannot tell stale samples apart
    return added


def write_aligned(out: str, columns: dict[str, str], settings: ShardSettings, counts: Sequence[int],
                  samples: Iterable[dict[str, Any]]) -> None:
    """Write ``samples`` as MDS shards holding exactly ``counts[j]`` samples each (empty ones too), so
    shard ``j`` lines up with shard ``j`` of the stream a sidecar extends."""
    from streaming import MDSWriter

    from prx_assets.compat.streaming import flush_shard

    bounds = list(itertools.accumulate(counts))
    j = 0
    with MDSWriter(out=out, columns=columns, compression=settings.compression,
                   hashes=list(settings.hashes) or None, size_limit=None) as writer:
        for n, sample in enumerate(itertools.chain([None], samples)):
            if sample is not None:
                writer.write(sample)
            while j < len(bounds) and bounds[j] == n:
                flush_shard(writer)
                j += 1
    if j != len(bounds):
        raise ShardError(f"{out}: wrote {n} samples for shards of {list(counts)[:8]}... samples; the stream's "
                         "samples.parquet and index.json disagree: republish the set whole (compact_above: 0)")


def _write_sidecars(root: DataRoot, staging: Path, lab: lance.LanceDataset, previous: ShardSetManifest,
                    added: dict[str, str], plan: dict[str, Any], encoder: TextEncoder | None,
                    settings: ShardSettings, caption_columns: Sequence[str], *, uri: str,
                    set_id: str) -> tuple[ShardSetManifest, dict[int, pa.Table]]:
    """Write the ``added`` columns of every sample of ``previous``'s streams as sidecars (see
    :mod:`prx_assets.core.publish.columns`); return ``previous`` with the sidecars listed under its
    streams, and each stream's samples with their digests as they now read.

    A sample whose published content no longer matches the lab (its digest under the previous
    set's digest columns changed, or it left the lab) gets an empty digest: it is skipped and, if
    still selected, written again in the delta. Only caption columns are read, never image bytes.
    """
    old_cols = tuple(previous.digest_columns or ())
    new_keys = [c for c in plan["columns"] if c in added]
    latent_keys = [c for c in plan["columns"] if encoder is not None and
                   latent_column(c, encoder.spec.tower()) in added]
    sources = [s for c in dict.fromkeys([*new_keys, *latent_keys]) for s in plan["columns"][c]]
    lab_cols = list(dict.fromkeys([*sources, *digest_columns(old_cols), *digest_columns(caption_columns)]))
    side_columns = {"image_id": "str", **added}
    streams: list[dict[str, Any]] = []
    tables: dict[int, pa.Table] = {}
    for i, stream in enumerate(previous.streams):
        own_table = read_table_at(uri_join(stream["uri"], SAMPLES_FILE), root)
        current = samples_uri(stream)  # the stream's own map unless an earlier sidecar superseded it
        own = own_table.column("image_id")
        stored = (own_table if current == uri_join(stream["uri"], SAMPLES_FILE)
                  else read_table_at(current, root)).column("digest")
        index = json.loads(read_uri(uri_join(stream["uri"], layout.MDS_INDEX), root.settings))
        counts = [int(sh["samples"]) for sh in index["shards"]]
        folder = staging / SIDECAR_DIR / f"s{i}"
        new_digests: list[pa.Array] = []

        def rows_of(own: pa.ChunkedArray = own, stored: pa.ChunkedArray = stored,
                    out: list[pa.Array] = new_digests) -> Iterator[dict[str, Any]]:
            for start in range(0, len(own), ID_CHUNK):  # Python objects for one chunk at a time
                ids = own.slice(start, ID_CHUNK).to_pylist()
                was = stored.slice(start, ID_CHUNK).to_pylist()
                (_, rows), = rows_by_ids(lab, ids, lab_cols, chunk=len(ids))
                samples = _caption_samples(rows, ids, plan, lab.version, missing_ok=True)
                if latent_keys and encoder is not None:
                    _add_latents(samples, encoder, latent_keys)
                now = []
                for image_id, old, sample in zip(ids, was, samples, strict=True):
                    r = rows.get(image_id)
                    fresh = r is not None and sample_digest(r, old_cols) == old
                    now.append(sample_digest(r, caption_columns) if fresh and r is not None else "")
                    yield {k: sample[k] for k in side_columns}
                out.append(pa.array(now, pa.string()))

        write_aligned(str(folder), side_columns, settings, counts, rows_of())
        tables[i] = pa.table({"image_id": own, "digest": pa.chunked_array(new_digests, pa.string())},
                             schema=SAMPLES_SCHEMA)
        (folder / SAMPLES_FILE).write_bytes(parquet_bytes(tables[i]))
        side = {"uri": uri_join(uri, f"{SIDECAR_DIR}/s{i}"), "columns": sorted(added), "written_by": set_id}
        streams.append({**stream, "sidecars": [*stream.get("sidecars", []), side]})
    return dataclasses.replace(previous, streams=tuple(streams)), tables


def _write_whole(staging: Path, lab: lance.LanceDataset, ids: Ids, columns: dict[str, str],
                 plan: dict[str, Any], settings: ShardSettings, encoder: TextEncoder | None, *, uri: str,
                 set_id: str, caption_columns: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """The whole subset as one stream (plus per-bucket sub-streams when asked); its sample map."""
    from streaming.base.util import merge_index

    groups: dict[str, Ids] = {"": ids}
    if settings.by_bucket:  # one sub-stream (folder with its own index.json) per aspect bucket
        groups = {}
        table = pa.concat_tables([fetch_by_ids(lab, part, ["image_id", "aspect_bucket"])
                                  for part in id_chunks(ids, 1000)])  # ids are never empty here
        for bucket in sorted(pc.unique(table.column("aspect_bucket")).to_pylist(), key=bucket_dir):
            members = as_ids(table.filter(pc.equal(table.column("aspect_bucket"), bucket)).column("image_id"))
            groups[bucket_dir(bucket)] = members.take(pc.sort_indices(members))
    jobs: list[tuple[str, Ids]] = []
    for sub, sub_ids in groups.items():
        workers = max(1, min(settings.workers, len(sub_ids) // 256 or 1))
        for i in range(workers):  # every ``workers``-th id from ``i``: the split the sets were always written with
            folder = f"{sub}/part-{len(jobs):05d}" if sub else f"part-{len(jobs):05d}"
            jobs.append((folder, sub_ids.take(pa.array(np.arange(i, len(sub_ids), workers)))))
    with ThreadPoolExecutor(max_workers=max(1, settings.workers)) as pool:
        written = list(pool.map(lambda j: _write_part(lab, j[1], str(staging / j[0]), columns, plan, settings,
                                                      encoder, caption_columns), jobs))
    bucket_streams = {}
    for sub in groups:
        if sub:
            merge_index(str(staging / sub), keep_local=True)
            bucket_streams[sub] = {"path": sub, "samples": len(groups[sub])}
    if bucket_streams:  # the whole set as one stream too: an index over every part of every bucket
        merge_part_indexes(staging, sorted(staging.glob("*/part-*")))
    else:
        merge_index(str(staging), keep_local=True)
    index = json.loads((staging / layout.MDS_INDEX).read_text())
    samples = sample_map(index, [(folder, rows) for (folder, _), rows in zip(jobs, written, strict=True)])
    (staging / SAMPLES_FILE).write_bytes(parquet_bytes(samples))
    return [{"uri": uri, "samples": samples.num_rows, "role": "base", "written_by": set_id}], bucket_streams, len(jobs)


def _write_delta(staging: Path, lab: lance.LanceDataset, delta: Delta, columns: dict[str, str],
                 plan: dict[str, Any], settings: ShardSettings, encoder: TextEncoder | None, *, uri: str,
                 set_id: str, caption_columns: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """The previous set's streams as they are, plus one delta stream with the added samples."""
    from streaming.base.util import merge_index

    streams = [dict(s) for s in delta.previous.streams]
    if len(delta.added):
        folder = staging / "delta"
        rows = _write_part(lab, delta.added, str(folder / "part-00000"), columns, plan, settings, encoder,
                           caption_columns)
        merge_index(str(folder), keep_local=True)
        samples = sample_map(json.loads((folder / layout.MDS_INDEX).read_text()), [("part-00000", rows)])
        (folder / SAMPLES_FILE).write_bytes(parquet_bytes(samples))
        streams.append({"uri": uri_join(uri, "delta"), "samples": samples.num_rows, "role": "delta",
                        "written_by": set_id})
    return streams, {}, 1 if len(delta.added) else 0


def read_shard_set_manifest(root: DataRoot, recipe: str, set_id: str) -> ShardSetManifest:
    """The manifest of a published shard set (``FileNotFoundError`` when it is not published)."""
    rel = layout.shard_set_manifest(recipe, set_id)
    return ShardSetManifest.from_json(root.read_bytes(rel), root.join(rel))


def _publish(root: DataRoot, staging: Path, rel: str) -> None:
    if not root.remote:
        final = Path(root.join(rel))
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, final)  # atomic on one filesystem; fails if another writer won
        except OSError:
            if not (final / layout.SHARD_SET_MANIFEST).is_file():
                raise
        return
    # Object stores have no rename: shards and sidecars first, then every index.json (a stream is
    # readable once its index is), then manifest.json (the set is published once it is).
    def order(p: Path) -> tuple[int, str]:
        return (2 if p.name == layout.SHARD_SET_MANIFEST and p.parent == staging else
                1 if p.name == layout.MDS_INDEX else 0, p.as_posix())

    for p in sorted((p for p in staging.rglob("*") if p.is_file()), key=order):
        root.write_bytes(f"{rel}/{p.relative_to(staging).as_posix()}", p.read_bytes())


def open_stream(uri: str, cache: str | None = None, **kwargs: Any) -> Any:
    """A plain ``StreamingDataset`` over one MDS folder (a stream with its own ``index.json``, such as
    a set written whole or a bucket sub-stream). Published sets: use :func:`open_shard_set`."""
    from streaming import StreamingDataset

    from prx_assets.core.publish.loader import streaming_endpoint
    from prx_assets.core.publish.streaming_shm import streaming_registration

    if is_remote(uri):
        split_object_uri(uri)
        streaming_endpoint()
        kwargs.update(remote=uri, local=cache or tempfile.mkdtemp(prefix="prx-mds-cache-"))
    else:
        kwargs.update(local=uri)
    with streaming_registration():
        return StreamingDataset(**kwargs)


def open_shard_set(manifest: ShardSetManifest | str, cache: str | None = None, **kwargs: Any) -> Any:
    """A :class:`prx_assets.loader.PrxStreamingDataset` over a published set: every stream, skips honoured.

    ``batch_size`` defaults to 1 (iterating it directly); pass the DataLoader's when training.
    """
    kwargs.setdefault("batch_size", 1)
    from prx_assets.core.publish.loader import PrxStreamingDataset

    return PrxStreamingDataset(shard_sets=[manifest], cache_root=cache, **kwargs)


@dataclass
class Verification:
    """What reading a shard set back found."""

    samples: int
    expected: int
    checked: int
    mismatched: list[str]

    @property
    def passed(self) -> bool:
        """All samples present and every checked image byte-identical to the lab."""
        return self.samples == self.expected and not self.mismatched


def verify_shard_set(manifest: ShardSetManifest, lab: lance.LanceDataset, sample: int = 16,
                     seed: int = 0, cache: str | None = None) -> Verification:
    """Read the set back with ``StreamingDataset``: count, hashes (checked by the reader when
    the set has them) and a sample of samples whose image bytes and caption columns (sidecar
    columns joined) equal the lab version's."""
    if cache is None and "://" in manifest.uri:
        reap(None, "prx-mds-cache-*")  # caches of read-backs whose process was killed
    own_cache = str(make_scratch(None, "prx-mds-cache-")) if cache is None and "://" in manifest.uri else None
    try:
        return _verify(manifest, lab, sample, seed, cache or own_cache)
    finally:
        if own_cache is not None:  # a read-back of a remote set leaves no cache behind
            shutil.rmtree(own_cache, ignore_errors=True)
            release(Path(own_cache))


def _verify(manifest: ShardSetManifest, lab: lance.LanceDataset, sample: int, seed: int,
            cache: str | None) -> Verification:
    import numpy as np

    with open_shard_set(manifest, cache=cache, validate_hash=manifest.validate_hash) as sds:
        n = sds.live_samples
        rng = np.random.default_rng(seed)
        picks: list[int] = []
        for i in rng.permutation(int(sds.num_samples)):  # a sample of live indices, without listing them all
            if not sds.is_skipped(int(i)):
                picks.append(int(i))
            if len(picks) >= min(sample, n):
                break
        plan = manifest.caption_plan or {"columns": {}}
        sources = list(dict.fromkeys(c for cs in plan["columns"].values() for c in cs))
        mismatched = []
        for i in picks:
            s = sds[int(i)]
            rows = lab.to_table(columns=["jpeg", *sources], filter=where_eq("image_id", s["image_id"])).to_pylist()
            if len(rows) != 1 or rows[0]["jpeg"] != s["image"] or \
                    any(s.get(col) != text for col, text in published_captions(rows[0], plan).items()):
                mismatched.append(s["image_id"])
    return Verification(samples=n, expected=manifest.samples, checked=len(picks), mismatched=mismatched)
