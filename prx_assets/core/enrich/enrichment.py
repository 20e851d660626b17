"""Incremental per-image enrichment (captions, embeddings) of one ingest batch.

For a batch and an output key (a captioner id or an embedder id), only images without
an output for their current content (``image_id`` + ``sha256``) are processed. Identical
content is computed once: duplicates inside the batch share the result, and outputs
already stored for the same ``sha256`` under the same key are reused. Results are
committed every ``commit_every`` images, so an interrupted run resumes where it stopped: outputs of
images that have none under the key yet are appended (the commit does not grow with the table),
and only outputs replacing one for older content are merged on ``(key, image_id)``.
Nothing is read or loaded (no model) when nothing is missing. While the model computes one
chunk, a reader thread reads and decodes the next (at most one chunk ahead), so on a GPU the
JPEG decoding and the Lance reads hide behind generation instead of adding to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.enrich.decode import CHUNK_PIXELS, EMBED_DECODE_PIXELS, decode_rgb, pixel_chunks
from prx_assets.core.faults import crash_point
from prx_assets.core.lab.schema import CAPTIONS_TABLE, IMAGES_TABLE
from prx_assets.core.lab.sql import chunks, where_all, where_eq, where_in
from prx_assets.core.lab.table import open_or_create, open_table, partition_row_version, table_uri
from prx_assets.core.leases import Lease, lease_name

Compute = Callable[[Sequence[Image.Image]], list[dict[str, Any]]]


@dataclass
class EnrichResult:
    """What one enrichment run did."""

    batch: str
    key: str
    images: int = 0
    missing: int = 0
    computed: int = 0
    reused: int = 0
    written: int = 0
    version: int | None = None
    #: The table version that last wrote this partition's rows for this key (its data version).
    partition_version: int | None = None
    changed: bool = False
    seconds: float = 0.0
    compute_seconds: float = 0.0
    #: Time spent getting the model ready (loading it; near zero when this process already holds it).
    load_seconds: float = 0.0
    lease_wait_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary."""
        return {k: getattr(self, k) for k in ("batch", "key", "images", "missing", "computed",
                                               "reused", "written", "version", "seconds", "lease_wait_seconds")}


@dataclass(frozen=True)
class Decoding:
    """How big the images a model is given may be: each at most ``max_pixels``, a chunk at most
    ``count`` images and ``chunk_pixels`` decoded pixels (see :mod:`.decode`)."""

    count: int = 64
    max_pixels: int = EMBED_DECODE_PIXELS
    chunk_pixels: int = CHUNK_PIXELS


def enrich_batch(root: DataRoot, batch: str, out_name: str, out_schema: pa.Schema, key_col: str,
                 key: str, payload_cols: Sequence[str], compute_factory: Callable[[], Compute],
                 decoding: Decoding = Decoding(), commit_every: int = 512,
                 progress: Callable[[int, int], None] | None = None) -> EnrichResult:
    """Fill ``out_name`` for every image of ``batch`` lacking an output under ``key``.

    Parameters
    ----------
    out_name:
        Lance table (under the data root) receiving one row per (image, key).
    payload_cols:
        Output columns produced by ``compute`` (besides the id columns).
    compute_factory:
        Called once, only if something must be computed; returns a function mapping a
        list of RGB images to one dict of payload columns per image.
    """
    # One writer per (table, key, batch): a second run waits, then finds nothing missing. Without
    # it, two merges of the same new keys can both insert them (Lance checks no key uniqueness).
    with Lease(root, lease_name(out_name, key, batch)) as lease:
        result = _enrich_batch(root, batch, out_name, out_schema, key_col, key, payload_cols, compute_factory,
                               decoding, commit_every, progress, lease)
        if result.changed:  # its last commit wrote this partition's newest rows
            result.partition_version = result.version
        else:  # another run may have written them: read when (a scan of the partition's rows)
            out = open_table(table_uri(root, out_name), root.storage_options())
            if out is not None:
                result.partition_version = partition_row_version(out, where_all(where_eq(key_col, key),
                                                                                  where_eq("batch", batch)))
    result.lease_wait_seconds = round(lease.waited, 3)
    return result


def _read_chunk(images: Any, batch: str, ids: Sequence[str], max_pixels: int) -> list[Image.Image]:
    """The RGB images of ``ids`` decoded at most at ``max_pixels`` (one pushed-down read of their
    stored bytes; see :mod:`.decode`)."""
    t = images.to_table(columns=["image_id", "jpeg"],
                        filter=where_all(where_eq("batch", batch), where_in("image_id", list(ids))))
    jpeg_by_id = dict(zip(t.column("image_id").to_pylist(), t.column("jpeg").to_pylist(), strict=True))
    return [decode_rgb(jpeg_by_id.pop(i), max_pixels) for i in ids]


def _decoded_chunks(images: Any, batch: str, parts: Sequence[Sequence[tuple[str, str]]], max_pixels: int
                    ) -> Iterator[tuple[Sequence[tuple[str, str]], list[Image.Image]]]:
    """``(part, decoded images)`` in order, the next part read and decoded by a reader thread while
    the caller works on the current one (at most one part ahead: memory holds two chunks)."""
    if not parts:
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prx-enrich-read") as pool:
        ahead: Future[list[Image.Image]] = pool.submit(_read_chunk, images, batch, [i for _, i in parts[0]],
                                                       max_pixels)
        for k, part in enumerate(parts):
            pil = ahead.result()
            if k + 1 < len(parts):
                ahead = pool.submit(_read_chunk, images, batch, [i for _, i in parts[k + 1]], max_pixels)
            yield part, pil


def _enrich_batch(root: DataRoot, batch: str, out_name: str, out_schema: pa.Schema, key_col: str,
                  key: str, payload_cols: Sequence[str], compute_factory: Callable[[], Compute],
                  decoding: Decoding, commit_every: int, progress: Callable[[int, int], None] | None,
                  lease: Lease) -> EnrichResult:
    started = time.perf_counter()
    result = EnrichResult(batch=batch, key=key)
    opts = root.storage_options()
    images = open_table(table_uri(root, IMAGES_TABLE), opts)
    if images is None:
        result.seconds = time.perf_counter() - started
        return result
    rows = images.to_table(columns=["image_id", "sha256", "width", "height"], filter=where_eq("batch", batch)).to_pylist()
    pixels = {r["image_id"]: min(r["width"] * r["height"], decoding.max_pixels) for r in rows}
    result.images = len(rows)
    out_uri = table_uri(root, out_name)
    out = open_table(out_uri, opts)
    done = _done(out, key_col, key, batch)
    missing = [r for r in rows if (r["image_id"], r["sha256"]) not in done]
    result.missing = len(missing)
    if not missing:
        result.version = out.version if out is not None else None
        result.seconds = time.perf_counter() - started
        return result
    by_sha = _same_content_outputs(out, missing, key_col, key, payload_cols)
    first_id: dict[str, str] = {}
    for r in missing:
        if r["sha256"] not in by_sha:
            first_id.setdefault(r["sha256"], r["image_id"])
    to_compute = sorted(first_id.items(), key=lambda kv: kv[1])  # (sha, image_id), id order
    writer = _OutputWriter(out if out is not None else open_or_create(out_uri, out_schema, opts), out_schema,
                           key_col, key, batch, commit_every, lease, result, by_sha,
                           present=pa.array(sorted({image_id for image_id, _ in done}), pa.string()),
                           crash_at=f"enrich.{'captions' if out_name == CAPTIONS_TABLE else 'embeddings'}.after_commit")
    writer.wait_for(missing)
    writer.emit([sha for sha in list(writer.waiting) if sha in by_sha])
    compute: Compute | None = None
    parts = list(pixel_chunks(to_compute, [pixels[i] for _, i in to_compute], decoding.count, decoding.chunk_pixels))
    for part, pil in _decoded_chunks(images, batch, parts, decoding.max_pixels):
        if compute is None:
            t0 = time.perf_counter()
            compute = compute_factory()
            result.load_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        outputs = compute(pil)
        result.compute_seconds += time.perf_counter() - t0
        for (sha, _), payload in zip(part, outputs, strict=True):
            by_sha[sha] = payload
        result.computed += len(part)
        writer.emit([sha for sha, _ in part])
        if progress:
            progress(result.computed, len(to_compute))
    writer.flush()
    result.reused = len(writer.emitted) - result.computed
    result.version = writer.out.version
    result.seconds = time.perf_counter() - started
    return result


def _done(out: lance.LanceDataset | None, key_col: str, key: str, batch: str) -> set[tuple[str, str]]:
    """``(image_id, sha256)`` of the batch's images that have an output under ``key`` already."""
    if out is None:
        return set()
    have = out.to_table(columns=["image_id", "sha256"], filter=where_all(where_eq(key_col, key), where_eq("batch", batch)))
    return set(zip(have.column("image_id").to_pylist(), have.column("sha256").to_pylist(), strict=True))


def _same_content_outputs(out: lance.LanceDataset | None, missing: Sequence[dict[str, Any]], key_col: str,
                          key: str, payload_cols: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Outputs already computed under ``key`` for the same content (by sha256), reused as they are."""
    by_sha: dict[str, dict[str, Any]] = {}
    if out is None:
        return by_sha
    for part in chunks(sorted({r["sha256"] for r in missing}), 500):
        t = out.to_table(columns=["sha256", *payload_cols], filter=where_all(where_eq(key_col, key),
                                                                            where_in("sha256", part)))
        for rec in t.to_pylist():
            by_sha.setdefault(rec.pop("sha256"), rec)
    return by_sha


class _OutputWriter:
    """Rows of one batch's outputs, committed every ``commit_every`` rows: images with no output under
    this key yet are appended (a cost that does not grow with the table); only images whose content
    changed since their output replace a row by merge."""

    def __init__(self, out: lance.LanceDataset, schema: pa.Schema, key_col: str, key: str, batch: str,
                 commit_every: int, lease: Lease, result: EnrichResult, by_sha: dict[str, dict[str, Any]],
                 present: pa.Array, crash_at: str) -> None:
        self.out, self.schema, self.key_col, self.key, self.batch = out, schema, key_col, key, batch
        self.commit_every, self.lease, self.result, self.by_sha = commit_every, lease, result, by_sha
        self.present, self.crash_at = present, crash_at
        self.pending: list[dict[str, Any]] = []
        self.emitted: set[str] = set()
        self.waiting: dict[str, list[dict[str, Any]]] = {}

    def wait_for(self, rows: Sequence[dict[str, Any]]) -> None:
        """Rows that get an output once their content's output is known."""
        for r in rows:
            self.waiting.setdefault(r["sha256"], []).append(r)

    def emit(self, shas: Sequence[str]) -> None:
        """Queue the rows waiting for ``shas`` (outputs known), committing every ``commit_every``."""
        for sha in shas:
            for r in self.waiting.pop(sha, []):
                self.emitted.add(r["image_id"])
                self.pending.append({"image_id": r["image_id"], self.key_col: self.key, "batch": self.batch,
                                     "sha256": sha, **self.by_sha[sha]})
        if len(self.pending) >= self.commit_every:
            self.flush()

    def flush(self) -> None:
        """Commit the queued rows (after checking the writer lease)."""
        if not self.pending:
            return
        table = pa.Table.from_pylist(self.pending, schema=self.schema)
        self.lease.check()
        fresh = pc.invert(pc.is_in(table.column("image_id"), value_set=self.present))
        if pc.any(fresh).as_py():
            self.out.insert(table.filter(fresh))
        replaced = table.filter(pc.invert(fresh))
        if replaced.num_rows:
            (self.out.merge_insert([self.key_col, "image_id"]).when_matched_update_all()
             .when_not_matched_insert_all().execute(replaced))
        self.result.written += len(self.pending)
        self.result.changed = True
        self.pending = []
        crash_point(self.crash_at)
