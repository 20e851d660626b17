"""Ingest one batch: read every item, normalize it, write rows and rejects to Lance.

Decoding and encoding run on a thread pool (Pillow releases the GIL in its codecs and
resamplers), with a bounded window of items in flight so memory stays flat whatever
the batch size. Rows stream into one Lance commit per table.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from prx_assets.core.config.project import IngestSettings
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.optout import erased_ids
from prx_assets.core.faults import crash_point
from prx_assets.core.ingest.batches import BatchManifest
from prx_assets.core.ingest.decoder_warnings import collect, routed
from prx_assets.core.ingest.images import ImageRejected, RejectReason
from prx_assets.core.ingest.jpeg_quality import in_sample, sample_rate
from prx_assets.core.ingest.sources import SourceItem, SourceReader
from prx_assets.core.ingest.worker import (
    DecoderError,
    Normalized,
    normalize_here,
    normalize_in_pool,
    normalize_many_in_pool,
    worker_pools,
)
from prx_assets.core.lab.schema import (
    IMAGES_SCHEMA,
    IMAGES_TABLE,
    REJECTS_SCHEMA,
    REJECTS_TABLE,
    image_id,
)
from prx_assets.core.lab.sql import where_eq
from prx_assets.core.lab.table import open_table, partition_row_version, replace_partition, table_uri
from prx_assets.core.leases import Lease, lease_name
from prx_assets.errors import ConfigError

log = logging.getLogger(__name__)

# An existing row is kept untouched when the original and the settings are the same.
UNCHANGED_COLUMNS = ("sha256", "ingest_config")
UNCHANGED_ROW = " AND ".join(f"target.{c} = source.{c}" for c in UNCHANGED_COLUMNS)


@dataclass
class IngestResult:
    """Counts and versions from ingesting one batch."""

    source: str
    batch: str
    rows: int = 0
    rejects: dict[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    buckets: dict[str, int] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)
    images_uri: str = ""
    rejects_uri: str = ""
    images_version: int = 0
    rejects_version: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    seconds: float = 0.0
    reject_examples: list[dict[str, str]] = field(default_factory=list)
    decoder_warnings: int = 0
    warning_examples: list[dict[str, str]] = field(default_factory=list)
    #: Seconds spent waiting for another writer of this batch to finish (its lease).
    lease_wait_seconds: float = 0.0
    #: The images table version that last wrote a row of this batch (read when this run wrote nothing).
    partition_version: int | None = None
    #: Stored images per format (``jpeg``, ``png``, ``webp``) and lossless ones per reason.
    stored_formats: dict[str, int] = field(default_factory=dict)
    lossless_reasons: dict[str, int] = field(default_factory=dict)
    #: First-generation PSNR of each stored image's JPEG (empty with ``lossless_fallback: off``).
    psnr_db: list[float] = field(default_factory=list)
    #: The q92 cycle experiment on the partition's sample (``CycleCurve.to_json`` each), its
    #: seconds, and the CPU seconds of normalizing the partition's images (the experiment included;
    #: measured where the work ran, so time a thread spent waiting on a worker process is not counted).
    q92_curves: list[dict[str, Any]] = field(default_factory=list)
    q92_seconds: float = 0.0
    work_seconds: float = 0.0
    #: Worker processes that decoded and encoded (1: this process's threads).
    processes: int = 1
    #: Images whose outcome was ready before this batch's run began (read ahead while the process
    #: finished the batch before it, or started up; see :mod:`.readahead`), and since when, in seconds.
    read_ahead: int = 0
    read_ahead_seconds: float = 0.0

    @property
    def lossless_share(self) -> float:
        """Share of the batch's images stored losslessly (not those the size bound kept as JPEG)."""
        lossless = sum(v for k, v in self.lossless_reasons.items() if not k.startswith("lossless_oversize"))
        return lossless / self.rows if self.rows else 0.0

    def psnr_quantiles(self) -> dict[str, float]:
        """Min, 5th percentile, median and 95th percentile of the first-generation PSNR (dB)."""
        if not self.psnr_db:
            return {}
        q = np.quantile(np.asarray(self.psnr_db), [0.0, 0.05, 0.5, 0.95])
        return {k: round(float(v), 2) for k, v in zip(("min", "p05", "p50", "p95"), q, strict=True)}

    @property
    def rejected(self) -> int:
        """Total rejects."""
        return sum(self.rejects.values())

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary."""
        return {
            "source": self.source, "batch": self.batch, "rows": self.rows,
            "rejected": self.rejected, "rejects": dict(self.rejects), "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out, "images_version": self.images_version,
            "inserted": self.inserted, "updated": self.updated, "deleted": self.deleted,
            "seconds": round(self.seconds, 3), "lease_wait_seconds": self.lease_wait_seconds,
            "stored_formats": dict(self.stored_formats), "lossless_reasons": dict(self.lossless_reasons),
            "lossless_share": round(self.lossless_share, 4), "q92_psnr_db": self.psnr_quantiles(),
        }


Outcome = tuple[dict[str, Any] | None, dict[str, Any] | None]
T = TypeVar("T")
R = TypeVar("R")

#: Items per task sent to the worker processes: one round trip per chunk. Per image, a task costs the
#: parent about 0.3 ms of queue and future machinery besides the bytes, against 11-12 ms of work in
#: the child; 4 images keep the tail of a partition short (about 50 ms of work per task).
CHUNK = 4


#: Row key carrying a file's decoder warnings from the worker to the writer (not stored as a column).
WARNINGS_KEY = "_decoder_warnings"
#: Row key carrying why an image is stored losslessly (counted per batch, not stored as a column).
LOSSLESS_KEY = "_lossless_reason"
#: Row keys carrying a sampled image's q92 cycle curve and its seconds, and the image's work seconds.
Q92_KEY = "_q92_curve"
Q92_SECONDS_KEY = "_q92_seconds"
SECONDS_KEY = "_seconds"


def process_item(item: SourceItem, source: str, batch: str, settings: IngestSettings,
                 fingerprint: str, q92_rate: float = 0.0, processes: int = 1) -> Outcome:
    """Normalize one item into ``(row, None)`` or ``(None, reject_row)``; decoder warnings ride along
    under :data:`WARNINGS_KEY` (for a reject, they are also appended to its message). An image in
    the q92 sample (``q92_rate``, see :func:`~prx_assets.core.ingest.jpeg_quality.in_sample`) that
    is stored as JPEG also carries its cycle curve under :data:`Q92_KEY`. With ``processes`` above 1
    the decoding and encoding run in that many worker processes (see :mod:`.worker`)."""
    def one() -> Outcome:
        admitted = _admit(item, source, batch, q92_rate)
        if not isinstance(admitted, _Admitted):
            return admitted
        if processes > 1:  # anything but a verdict on the file (the pool itself failing) fails the run
            run = partial(normalize_in_pool, admitted.data, settings, admitted.sampled, admitted.label, processes)
        else:
            run = partial(normalize_here, admitted.data, settings, admitted.sampled, admitted.label)
        return _finish(item, admitted, source, batch, fingerprint, run)
    return _with_warnings(one)


def process_chunk(items: list[SourceItem], source: str, batch: str, settings: IngestSettings,
                  fingerprint: str, q92_rate: float, processes: int) -> list[Outcome]:
    """:func:`process_item` over ``items``, their decoding sent to the worker processes as one task
    (see :func:`~.worker.normalize_many_in_pool`): the same outcomes, one round trip."""
    admitted = [_admit(item, source, batch, q92_rate) for item in items]
    jobs = [(a.data, a.sampled, a.label) for a in admitted if isinstance(a, _Admitted)]
    runs = iter(normalize_many_in_pool(jobs, settings, processes))
    out: list[Outcome] = []
    for item, a in zip(items, admitted, strict=True):
        if isinstance(a, _Admitted):
            out.append(_with_warnings(partial(_finish, item, a, source, batch, fingerprint, next(runs))))
        else:
            out.append(a)
    return out


def _with_warnings(fn: Callable[[], Outcome]) -> Outcome:
    """``fn()``, with the decoder warnings raised (or recorded) meanwhile attached to its outcome."""
    with collect() as warns:
        row, rej = fn()
    if warns:
        if rej is not None:
            rej["message"] = f"{rej['message']} (decoder: {'; '.join(warns[:3])})"
        (row if row is not None else rej)[WARNINGS_KEY] = warns  # type: ignore[index]
    return row, rej


@dataclass(frozen=True)
class _Admitted:
    """An item whose bytes were read: what its decoding needs."""

    iid: str
    data: bytes
    sampled: bool
    label: str


def _reject(item: SourceItem, iid: str, source: str, batch: str, reason: str, message: str,
            size: int = 0) -> Outcome:
    return None, {"image_id": iid, "source": source, "batch": batch, "uri": item.uri,
                  "reason": reason, "message": message, "orig_bytes": size}


def _admit(item: SourceItem, source: str, batch: str, q92_rate: float) -> _Admitted | Outcome:
    """The item's bytes and sampling, or its reject when it cannot be read."""
    iid = image_id(source, item.key)
    if item.error is not None:
        return _reject(item, iid, source, batch, *item.error)
    try:
        data = item.read()
    except (OSError, ValueError) as e:
        return _reject(item, iid, source, batch, RejectReason.READ_ERROR.value, f"cannot read {item.uri}: {e}")
    except Exception as e:  # boto3 ClientError and friends for a vanished object
        if type(e).__name__ in ("ClientError", "NoSuchKey"):
            return _reject(item, iid, source, batch, RejectReason.READ_ERROR.value, f"cannot read {item.uri}: {e}")
        raise
    sampled = q92_rate > 0 and in_sample(iid, q92_rate)
    return _Admitted(iid, data, sampled, item.uri.rsplit("/", 1)[-1])


def _finish(item: SourceItem, a: _Admitted, source: str, batch: str, fingerprint: str,
            run: Callable[[], Normalized]) -> Outcome:
    """The item's row from ``run()`` (its normalization), or its reject."""
    try:
        done = run()
    except ImageRejected as e:
        return _reject(item, a.iid, source, batch, e.reason.value, e.message, len(a.data))
    except DecoderError as e:
        log.warning("unexpected %s decoding %s: %s", e.kind, item.uri, e.message)
        return _reject(item, a.iid, source, batch, RejectReason.CORRUPT.value,
                       f"decoder raised {e.kind}: {e.message}", len(a.data))
    n = done.image
    extra: dict[str, Any] = {SECONDS_KEY: done.seconds}  # measured where the work ran, not waited for
    if done.curve is not None:
        extra.update({Q92_KEY: done.curve, Q92_SECONDS_KEY: done.q92_seconds})
    return {
        **extra,
        "image_id": a.iid, "source": source, "batch": batch, "uri": item.uri,
        "jpeg": n.jpeg, "jpeg_bytes": len(n.jpeg), "width": n.width, "height": n.height,
        "orig_width": n.orig_width, "orig_height": n.orig_height, "orig_format": n.orig_format,
        "orig_mode": n.orig_mode, "orig_bytes": n.orig_bytes, "sha256": n.sha256,
        "phash": n.phash, "aspect_ratio": n.aspect_ratio, "aspect_bucket": n.aspect_bucket,
        "original_caption": item.caption, "license": item.license,
        "extra": json.dumps(item.extra, sort_keys=True, default=str) if item.extra else None,
        "ingest_config": fingerprint, "stored_format": n.stored_format, "q92_psnr_db": n.q92_psnr_db,
        "stored_sha256": n.stored_sha256,
        LOSSLESS_KEY: n.lossless_reason,
    }, None


def iter_items(manifest: BatchManifest, reader: SourceReader) -> Iterator[SourceItem]:
    """Every item of every unit in the manifest, in order. A unit that cannot be read (a corrupt
    Parquet file or tar shard, or one that breaks part way) becomes one ``unreadable_unit``
    reject for what it did not yield; the other units go on. Configuration errors still stop."""
    for unit in manifest.units:
        try:
            yield from reader.read_unit(unit)
        except ConfigError:
            raise
        except Exception as e:
            key = reader.key_of(unit)
            where = reader.locate(key)
            yield SourceItem(key=key, uri=where, error=(RejectReason.UNREADABLE_UNIT.value,
                                                             f"cannot read {where}: {type(e).__name__}: {e}"))


def ordered_map(fn: Callable[[T], R], items: Iterator[T], workers: int, window: int | None = None) -> Iterator[R]:
    """``map`` over a thread pool that keeps input order and at most ``window`` in flight."""
    if workers <= 1:
        for it in items:
            yield fn(it)
        return
    window = window or workers * 4
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prx-ingest") as pool:
        pending: deque[Future[R]] = deque()
        for it in items:
            pending.append(pool.submit(fn, it))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def outcome_stream(manifest: BatchManifest, reader: SourceReader, settings: IngestSettings,
                   on_drained: Callable[[], None] | None = None) -> Iterator[Outcome]:
    """The outcome of every item of ``manifest``, in order, as :func:`ingest_batch` writes them.

    ``on_drained`` is called once the last item has been read and handed to the workers (while
    the last chunks are still being decoded): the moment to queue the next batch's first items
    behind them (see :mod:`.readahead`).
    """
    source, batch = manifest.source, manifest.key
    fingerprint = settings.normalization_fingerprint()
    q92_rate = sample_rate(manifest.weight, settings.q92_sample, settings.q92_sample_share)
    processes = settings.effective_processes(manifest.weight)
    items = iter_items(manifest, reader)
    if on_drained is not None:
        items = _then(items, on_drained)
    if processes <= 1:
        return ordered_map(partial(process_item, source=source, batch=batch, settings=settings,
                                   fingerprint=fingerprint, q92_rate=q92_rate, processes=processes),
                           items, settings.effective_workers())
    # With worker processes, two threads per process, each reading a chunk of CHUNK items, sending it
    # as one task and waiting on it (so one reads the next files while the other's are decoded). At
    # most one chunk per thread is in flight: as many images as one item per thread with a window of
    # four did before chunks (see `python -m bench ingest`, which measures both).
    threads = max(settings.effective_workers(), 2 * processes)
    chunks = ordered_map(partial(process_chunk, source=source, batch=batch, settings=settings,
                                 fingerprint=fingerprint, q92_rate=q92_rate, processes=processes),
                         _chunked(items, CHUNK), threads, window=threads)
    return _flat(chunks)


def _flat(chunks: Iterator[list[Outcome]]) -> Iterator[Outcome]:
    """The outcomes of ``chunks``, in order; closing this closes ``chunks`` (its threads finish)."""
    try:
        for chunk in chunks:
            yield from chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _then(items: Iterator[T], after: Callable[[], None]) -> Iterator[T]:
    """``items``, then a call of ``after`` once they are exhausted."""
    yield from items
    after()


class _Tally:
    """What :func:`ingest_batch` counts of a batch's outcomes as they stream into Lance."""

    def __init__(self, result: IngestResult, erased: frozenset[str] = frozenset()) -> None:
        self.result = result
        self.erased = erased
        self.rejects: list[dict[str, Any]] = []
        self.reasons: Counter[str] = Counter()
        self.buckets: Counter[str] = Counter()
        self.formats: Counter[str] = Counter()

    def add(self, row: dict[str, Any] | None, rej: dict[str, Any] | None) -> None:
        """Count one outcome (popping the keys that ride along and are not stored)."""
        result = self.result
        warns = (row or rej or {}).pop(WARNINGS_KEY, None)
        result.work_seconds += (row or rej or {}).pop(SECONDS_KEY, 0.0)
        lossless = row.pop(LOSSLESS_KEY, None) if row is not None else None
        if row is not None and Q92_KEY in row:
            result.q92_curves.append(row.pop(Q92_KEY))
            result.q92_seconds += row.pop(Q92_SECONDS_KEY)
        if warns:
            result.decoder_warnings += len(warns)
            if len(result.warning_examples) < 20:
                result.warning_examples.append({"uri": (row or rej or {}).get("uri", ""),
                                                "warnings": "; ".join(warns[:3])})
        if rej is not None:
            self.rejects.append(rej)
            self.reasons[rej["reason"]] += 1
            result.bytes_in += rej["orig_bytes"]
        elif row is not None:
            result.rows += 1
            result.bytes_in += row["orig_bytes"]
            result.bytes_out += row["jpeg_bytes"]
            self.buckets[row["aspect_bucket"]] += 1
            self.formats[row["orig_format"]] += 1
            result.stored_formats[row["stored_format"]] = result.stored_formats.get(row["stored_format"], 0) + 1
            if lossless:
                result.lossless_reasons[lossless] = result.lossless_reasons.get(lossless, 0) + 1
            if row["q92_psnr_db"] is not None:
                result.psnr_db.append(row["q92_psnr_db"])

    def batches(self, outcomes: Iterator[Outcome], rows_per_write: int,
                progress: Callable[[int, int], None] | None) -> Iterator[pa.RecordBatch]:
        """The rows of ``outcomes`` as record batches of ``rows_per_write``, counting every outcome."""
        rows: list[dict[str, Any]] = []
        for done, (row, rej) in enumerate(outcomes, 1):
            if row is not None and row["image_id"] in self.erased:  # a removal request: never stored again
                row, rej = None, {**{k: row[k] for k in ("image_id", "source", "batch", "uri", "orig_bytes")},
                                  "reason": RejectReason.ERASED.value,
                                  "message": "erased on request (see `prx-assets optout --erase`)"}
            self.add(row, rej)
            if row is not None:
                rows.append(row)
            if len(rows) >= rows_per_write:
                yield pa.RecordBatch.from_pylist(rows, schema=IMAGES_SCHEMA)
                rows = []
            if progress and done % rows_per_write == 0:
                progress(done, len(self.rejects))
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=IMAGES_SCHEMA)

    def finish(self) -> None:
        """Copy the counters into the result."""
        result = self.result
        result.rejects = dict(sorted(self.reasons.items()))
        result.buckets = dict(sorted(self.buckets.items()))
        result.formats = dict(sorted(self.formats.items()))
        result.reject_examples = [{"uri": r["uri"], "reason": r["reason"], "message": r["message"]}
                                  for r in self.rejects[:20]]


def ingest_batch(manifest: BatchManifest, reader: SourceReader, root: DataRoot,
                 settings: IngestSettings, rows_per_write: int = 64,
                 progress: Callable[[int, int], None] | None = None,
                 outcomes: Iterator[Outcome] | None = None,
                 on_drained: Callable[[], None] | None = None) -> IngestResult:
    """Ingest one batch into the ``images`` and ``rejects`` tables, replacing its rows.

    Every thread and worker process it uses ends before it returns or raises (interrupted
    included): the outcome stream is closed and the call holds a
    :func:`~.worker.worker_pools` block.

    Parameters
    ----------
    manifest:
        The batch (partition) to ingest.
    reader:
        The source's reader.
    root:
        Data root holding the Lance tables.
    settings:
        Normalization settings of the source.
    rows_per_write:
        Rows per record batch streamed to Lance.
    progress:
        Called as ``progress(done, rejected)`` every ``rows_per_write`` items.
    outcomes:
        This batch's :func:`outcome_stream`, already started (a :class:`~.readahead.ReadAhead`'s,
        which read its first items while the process was busy elsewhere); ``None`` starts one.
    on_drained:
        Passed to the :func:`outcome_stream` this call starts.
    """
    started = time.perf_counter()
    result = IngestResult(source=manifest.source, batch=manifest.key, images_uri=table_uri(root, IMAGES_TABLE),
                          rejects_uri=table_uri(root, REJECTS_TABLE),
                          processes=settings.effective_processes(manifest.weight))
    with worker_pools():
        if outcomes is None:
            outcomes = outcome_stream(manifest, reader, settings, on_drained)
        try:
            tally = _Tally(result, erased_ids(root))
            _write_batch(root, result, tally, tally.batches(outcomes, rows_per_write, progress))
        finally:
            close = getattr(outcomes, "close", None)
            if close is not None:
                close()  # the reading threads finish before the pools stop
    tally.finish()
    result.seconds = time.perf_counter() - started
    return result


def _write_batch(root: DataRoot, result: IngestResult, tally: _Tally, batches: Iterator[pa.RecordBatch]) -> None:
    """Replace the batch's rows and rejects (one commit each), under the batch's writer lease."""
    batch = result.batch
    opts = root.storage_options()
    # One writer per batch at a time (two runs, or the CLI beside a UI backfill): the second waits,
    # then finds the partition equal and commits nothing.
    with Lease(root, lease_name("raw_images", batch)) as lease:
        with routed():
            written = replace_partition(result.images_uri, IMAGES_SCHEMA, "batch", batch,
                                        _checked(batches, lease), storage_options=opts,
                                        unchanged_if=UNCHANGED_ROW, compare=UNCHANGED_COLUMNS)
        lease.check()
        crash_point("ingest.between_commits")
        rej_written = replace_partition(
            result.rejects_uri, REJECTS_SCHEMA, "batch", batch,
            [pa.RecordBatch.from_pylist(tally.rejects, schema=REJECTS_SCHEMA)] if tally.rejects else [],
            storage_options=opts)
    result.lease_wait_seconds = round(lease.waited, 3)
    result.images_version = written.version
    result.rejects_version = rej_written.version
    if written.inserted + written.updated + written.deleted == 0:  # only then is it needed (a scan of the batch)
        images = open_table(result.images_uri, opts)
        result.partition_version = partition_row_version(images, where_eq("batch", batch)) if images else None
    result.inserted, result.updated, result.deleted = written.inserted, written.updated, written.deleted


def _chunked(items: Iterator[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def _checked(batches: Iterator[pa.RecordBatch], lease: Lease) -> Iterator[pa.RecordBatch]:
    """``batches``, then a check that ``lease`` is still held (before the commit they feed)."""
    yield from batches
    lease.check()
    crash_point("ingest.before_commit")
