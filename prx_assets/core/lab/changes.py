"""Lab sync by change: which caption and embedding rows to join, from Lance's own row versions.

Every table this project creates tracks stable row ids, so each row carries
``_row_last_updated_at_version`` and ``_row_created_at_version`` (kept through compaction).
A lab column remembers the version of its source table it was last synced from (in
``lance/_lab_sync.json``, with the images table's version at that sync). The next sync joins only

- source rows written since that version (new or re-written captions and vectors), and
- source rows of images rows created since the last sync (an image deleted and ingested
  again gets its existing caption back),

compares them with the lab's current values in chunks of ``chunk`` rows, and rewrites the
rows that differ (whole rows, moved to new fragments, while they are a small share of the
table, so every index stays valid for the rest). Memory is bounded by the chunk, not the
table. A new column is filled in one pass in the table's row order (one commit). A column
without a cursor, a table without row versions (created before they were tracked) or a
cursor ahead of the table (restored from a backup) falls back to the full join, which
compares one id range (about ``FULL_CHUNK_ROWS`` rows) at a time.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.sql import literal, table_by_ids, where_all
from prx_assets.core.lab.table import dataset_size

#: Rows compared and committed at a time by a sync by change.
CHANGE_CHUNK = 65_536
#: Ids per lookup of new images' rows in a source table (one scan each, pushed down).
LOOKUP_CHUNK = 4096
#: About this many rows are compared at a time by a full sync (ids split into ranges)...
FULL_CHUNK_ROWS = 1_000_000
#: ...or fewer, so that one range's values stay under this many bytes per side.
FULL_CHUNK_BYTES = 256 * 1024 * 1024
#: Bytes of new values per ``merge_insert`` (one commit each). Lance joins a merge inside a 300 MB
#: memory pool, and vectors take about four times their Arrow size there.
MERGE_BYTES = 16 * 1024 * 1024
#: Bytes of whole rows per merge when changed rows are rewritten whole: the scan-path join holds
#: them in memory (measured: 600 MB of rows, 3 GB peak), and every merge scans the table's keys once.
ROWS_MERGE_BYTES = 128 * 1024 * 1024
#: Rows per ``merge_insert``: Lance's join also costs about a kilobyte per source row in that pool.
MERGE_ROWS = 32_768
#: Up to this share of the table, changed rows are rewritten whole (indexes stay valid for the rest);
#: above it, the column is rewritten in place (and its indexes rebuilt by the sync).
ROWS_MODE_SHARE = 0.1


@dataclass
class SyncState:
    """Per lab column, the source table version it was last synced from; and the images version."""

    columns: dict[str, int] = field(default_factory=dict)
    images_version: int | None = None

    @classmethod
    def read(cls, root: DataRoot) -> SyncState:
        """The state of the last sync (empty when none was recorded)."""
        try:
            doc = json.loads(root.read_bytes(layout.lab_sync_state()))
        except (FileNotFoundError, OSError, ValueError):
            return cls()
        return cls(columns={str(k): int(v) for k, v in doc.get("columns", {}).items()},
                   images_version=doc.get("images_version"))

    def write(self, root: DataRoot) -> None:
        """Record the state (after the sync's commits: a crash before it only repeats work)."""
        root.write_bytes(layout.lab_sync_state(), json.dumps(
            {"columns": self.columns, "images_version": self.images_version}, sort_keys=True).encode())


def differs(current: pa.Array | pa.ChunkedArray, new: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
    """Row-wise ``current != new`` (null vs value differs; null vs null does not), vectorized:
    strings in Arrow, fixed-size vectors as one numpy comparison (no Python lists).

    >>> differs(pa.array(["a", None, "c"]), pa.array(["a", "b", "d"])).to_pylist()
    [False, True, True]
    """
    cur = current.combine_chunks() if isinstance(current, pa.ChunkedArray) else current
    nxt = new.combine_chunks() if isinstance(new, pa.ChunkedArray) else new
    if pa.types.is_fixed_size_list(cur.type) or pa.types.is_fixed_size_list(nxt.type):
        n = len(cur)
        nxt = nxt.cast(cur.type)
        cn = np.asarray(cur.is_null())
        nn = np.asarray(nxt.is_null())
        if not n:
            same_values = np.zeros(0, bool)
        elif pa.types.is_floating(cur.type.value_type) or pa.types.is_integer(cur.type.value_type):
            same_values = np.all(_value_bits(cur) == _value_bits(nxt), axis=1)  # the stored bytes
        else:
            a, b = vector_matrix(cur), vector_matrix(nxt)
            same_values = np.all((a == b) | (np.isnan(a) & np.isnan(b)), axis=1)
        return pa.array(np.where(cn | nn, cn != nn, ~same_values), pa.bool_())
    eq = pc.equal(cur, nxt)
    both_null = pc.and_(pc.is_null(cur), pc.is_null(nxt))
    return pc.and_not(pc.fill_null(pc.invert(eq), True), both_null)


def _value_bits(arr: pa.FixedSizeListArray) -> np.ndarray:
    """A fixed-size list of numbers as an ``n x dim`` matrix of their bit patterns (no conversion)."""
    dim = arr.type.list_size
    values = arr.values.slice(arr.offset * dim, len(arr) * dim).to_numpy(zero_copy_only=False)
    return values.view(f"u{values.dtype.itemsize}").reshape(len(arr), dim)


def vector_matrix(arr: pa.FixedSizeListArray | pa.ChunkedArray, dtype: type = np.float32) -> np.ndarray:
    """A fixed-size list column as an ``n x dim`` matrix (float32 unless ``dtype``), null rows as
    NaN (no Python lists; filled chunk by chunk, so the column is never copied whole twice)."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    dim = arr.type.list_size
    out = np.empty((len(arr), dim), dtype=dtype)
    at = 0
    for chunk in chunks:
        n = len(chunk)
        values = chunk.values.slice(chunk.offset * dim, n * dim).to_numpy(zero_copy_only=False)
        out[at:at + n] = np.asarray(values).reshape(n, dim)
        out[at:at + n][np.asarray(chunk.is_null(), dtype=bool)] = np.nan
        at += n
    return out


def id_ranges(rows: int, chunk: int = FULL_CHUNK_ROWS) -> list[str | None]:
    """Filters that split image ids into about ``rows / chunk`` ranges of equal share (ids are
    uniform hex digests, so a range of prefixes holds its share of the rows); the first and last
    are open-ended, so every id falls in exactly one.

    >>> id_ranges(10)
    [None]
    >>> id_ranges(20, chunk=10)
    ["image_id < '80'", "image_id >= '80'"]
    >>> len(id_ranges(1_000_000, chunk=58_254))
    18
    """
    parts = min(65_536, math.ceil(rows / max(1, chunk)))
    if parts <= 1:
        return [None]
    digits = 2
    while 16 ** digits < 16 * parts:  # bounds fine enough that ranges differ by under 1/16
        digits += 1
    space = 16 ** digits
    bounds = sorted({f"{round(i * space / parts):0{digits}x}" for i in range(1, parts)})
    return ([f"image_id < {literal(bounds[0])}"]
            + [f"image_id >= {literal(a)} AND image_id < {literal(b)}" for a, b in itertools.pairwise(bounds)]
            + [f"image_id >= {literal(bounds[-1])}"])


def rows_per_range(field_type: pa.DataType) -> int:
    """Rows a full comparison reads per id range for a column of this type (bounded in bytes).

    >>> rows_per_range(pa.list_(pa.float32(), 1152))
    58254
    """
    if pa.types.is_fixed_size_list(field_type):
        per_row = field_type.list_size * max(1, field_type.value_type.bit_width // 8)
    else:
        per_row = 256  # captions: a generous average
    return max(1024, min(FULL_CHUNK_ROWS, FULL_CHUNK_BYTES // per_row))


def full_rows(source: lance.LanceDataset, value: str, where: str | None, images: lance.LanceDataset,
              column: str, chunk: int = FULL_CHUNK_ROWS) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Per id range (about ``chunk`` rows): the source's ``image_id``/``value`` and the lab's
    ``image_id``/``column``."""
    for rng in id_ranges(max(source.count_rows(), images.count_rows()), chunk):
        values = source.to_table(columns=["image_id", value], filter=where_all(where, rng))
        if values.num_rows == 0:
            continue
        current = images.to_table(columns=["image_id", column], filter=rng)
        yield values.rename_columns(["image_id", "value"]), current


def fragments_since(ds: lance.LanceDataset, version: int) -> list[Any] | None:
    """The fragments of ``ds`` that can hold rows written after ``version``: those new since then
    (appends, merged or rewritten rows, compaction output) and those whose data files changed (a
    column rewritten in place). Deletions alone add no written row. Reads two manifests, never a
    row; ``None`` when ``version`` is no longer there (cleaned up): the caller scans every fragment.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> ds = lance.write_dataset(pa.table({"a": [1, 2]}), d + "/t.lance", enable_stable_row_ids=True)
    >>> ds = lance.write_dataset(pa.table({"a": [3]}), d + "/t.lance", mode="append")
    >>> [f.fragment_id for f in fragments_since(ds, 1)], fragments_since(ds, 99)
    ([1], None)
    """
    try:
        before = ds.checkout_version(int(version)).get_fragments()
    except (OSError, ValueError):
        return None
    files = {f.fragment_id: sorted(df.path for df in f.data_files()) for f in before}
    return [f for f in ds.get_fragments() if files.get(f.fragment_id) != sorted(df.path for df in f.data_files())]


def _scan_since(ds: lance.LanceDataset, columns: list[str], flt: str, version: int, chunk: int) -> Iterator[pa.RecordBatch]:
    """Batches of ``ds`` matching ``flt`` (a filter on row versions after ``version``), scanning only
    the fragments that can hold such rows (:func:`fragments_since`): the scan costs what changed."""
    fragments = fragments_since(ds, version)
    if fragments is not None and not fragments:
        return
    yield from ds.scanner(columns=columns, filter=flt, batch_size=chunk, fragments=fragments).to_batches()


def changed_rows(source: lance.LanceDataset, value: str, where: str | None, since: int,
                 images: lance.LanceDataset, images_since: int | None,
                 chunk: int = CHANGE_CHUNK) -> Iterator[pa.Table]:
    """``image_id``/``value`` tables (at most ``chunk`` rows each) of the source rows to re-join:
    written since version ``since``, plus the source rows of images created since ``images_since``.
    Only fragments written since those versions are scanned (see :func:`fragments_since`)."""
    flt = where_all(where, f"_row_last_updated_at_version > {int(since)}")
    for batch in _scan_since(source, ["image_id", value], flt, since, chunk):
        if batch.num_rows:
            yield pa.Table.from_batches([batch]).rename_columns(["image_id", "value"])
    if images_since is None:
        return
    created = _scan_since(images, ["image_id"], f"_row_created_at_version > {int(images_since)}", images_since, chunk)
    for batch in created:
        # rows written since ``since`` were yielded above; only older ones are needed here
        t = table_by_ids(source, batch.column(0).to_pylist(), [value], chunk=LOOKUP_CHUNK,
                         where=where_all(where, f"_row_last_updated_at_version <= {int(since)}"))
        if t.num_rows:
            yield t.rename_columns(["image_id", "value"])


def compare_and_merge(images: lance.LanceDataset, column: str, field_type: pa.DataType,
                      values: pa.Table) -> int:
    """Rewrite ``images[column]`` for the ids of ``values`` whose value differs; return how many.

    The lab's rows are read for these ids only (looked up by key, taken by row id). While the
    rows are few enough to be rewritten whole (``ROWS_MODE_SHARE``), each slice of them is read
    whole once, compared on ``column`` and its differing rows merged back: one read per row."""
    if values.num_rows == 0:
        return 0
    if values.num_rows <= ROWS_MODE_SHARE * images.count_rows():
        written = 0
        names = images.schema.names
        for part in _row_slices(images, values):
            full = table_by_ids(images, part.column("image_id").to_pylist(), names).select(names)
            changed = changed_values(column, field_type, part, full.select(["image_id", column]))
            written += _merge_rows(images, column, changed, full)
        return written
    ids = values.column("image_id").to_pylist()
    current = table_by_ids(images, ids, [column])
    return merge_changed(images, column, field_type, values, current)


def changed_values(column: str, field_type: pa.DataType, values: pa.Table, current: pa.Table) -> pa.Table:
    """``image_id``/``column`` of the rows of ``values`` that exist in the lab's ``current``
    (``image_id``, ``column``) with a different value."""
    left = pa.table({"image_id": values.column("image_id"), "_l": pa.array(np.arange(values.num_rows))})
    right = pa.table({"image_id": current.column("image_id"), "_r": pa.array(np.arange(current.num_rows))})
    pairs = left.join(right, "image_id", join_type="inner")
    new = values.column("value").take(pairs.column("_l")).cast(field_type)
    if pairs.num_rows == 0:
        return pa.table({"image_id": pairs.column("image_id"), column: new})
    mask = differs(current.column(column).take(pairs.column("_r")), new)
    return pa.table({"image_id": pairs.column("image_id"), column: new}).filter(mask)


def merge_changed(images: lance.LanceDataset, column: str, field_type: pa.DataType, values: pa.Table,
                  current: pa.Table) -> int:
    """Given new ``values`` and the lab's ``current`` (``image_id``, ``column``), rewrite the column
    for the rows that exist in the lab and differ."""
    return write_changed(images, column, changed_values(column, field_type, values, current))


def write_changed(images: lance.LanceDataset, column: str, changed: pa.Table) -> int:
    """Write ``changed`` (``image_id``, ``column``) into the lab: whole rows when they are few (see
    ``ROWS_MODE_SHARE``), else ``rewrite_columns`` merges in slices. Returns the rows written."""
    if changed.num_rows == 0:
        return 0
    if changed.num_rows <= ROWS_MODE_SHARE * images.count_rows():
        _rewrite_rows(images, column, changed)
        return changed.num_rows
    # Lance joins a merge in memory (a 300 MB pool by default): merge in slices of MERGE_BYTES.
    step = max(1024, min(MERGE_ROWS, MERGE_BYTES * changed.num_rows // max(1, changed.nbytes)))
    for start in range(0, changed.num_rows, step):
        part = changed.take(np.arange(start, min(start + step, changed.num_rows)))  # a copy: a slice would
        images.merge_insert("image_id").when_matched_update_all().write_mode("rewrite_columns") \
            .execute(part)  # carry (and be accounted) with every byte of its parent's buffers
    return changed.num_rows


def _row_slices(images: lance.LanceDataset, rows: pa.Table) -> Iterator[pa.Table]:
    """``rows`` in slices whose whole lab rows (with the slice's own bytes) hold ~``ROWS_MERGE_BYTES``."""
    row_bytes = dataset_size(images) // max(1, images.count_rows())
    step = max(16, ROWS_MERGE_BYTES // max(1, row_bytes + rows.nbytes // max(1, rows.num_rows)))
    for start in range(0, rows.num_rows, step):
        yield rows.slice(start, step)


def _merge_rows(images: lance.LanceDataset, column: str, changed: pa.Table, full: pa.Table) -> int:
    """Merge the lab rows ``full`` (every column) whose ids are in ``changed`` back with their new
    ``column`` values from ``changed`` (``image_id``, ``column``). Returns the rows written."""
    if changed.num_rows == 0:
        return 0
    full = full.filter(pc.is_in(full.column("image_id"), value_set=changed.column("image_id")))
    order = pc.index_in(full.column("image_id"), value_set=changed.column("image_id"))
    names = full.schema.names
    full = full.set_column(names.index(column), images.schema.field(column), changed.column(column).take(order))
    # The join by a scan of the key column, not by its index: on a table with rows outside the
    # index and deletions inside it (every table after a few syncs), Lance's indexed merge path
    # computes a deletion mask per fragment and measured 3-5x slower (0.42-0.67 s vs 0.14-0.16 s
    # per merge of 2,000 rows into 1M); the scan reads 16 bytes per row of the table.
    images.merge_insert("image_id").when_matched_update_all().use_index(False).execute(full)
    return full.num_rows


def _rewrite_rows(images: lance.LanceDataset, column: str, changed: pa.Table) -> None:
    """Rewrite the ``changed`` rows whole, with their new ``column`` values, a slice of
    ~``ROWS_MERGE_BYTES`` at a time (one merge, one scan of the key column, per slice). Rewritten
    rows move to new fragments, so every index stays valid for all other rows (rewriting a column
    in place would leave the column's indexes covering none of its fragments)."""
    names = images.schema.names
    for part in _row_slices(images, changed):
        full = table_by_ids(images, part.column("image_id").to_pylist(), names).select(names)
        _merge_rows(images, column, part, full)


def fill_new_column(images: lance.LanceDataset, source: lance.LanceDataset, column: str, field_type: pa.DataType,
                    value: str, where: str | None, batch_rows: int = 8192) -> int:
    """Add ``column`` to the lab filled from the source in one commit: Lance ``add_columns`` reads
    the values from a stream in the table's row order, so each fragment gets one new column
    file and no other data is touched. Each batch of lab ids is looked up in the source by its
    ``image_id`` index (created if missing): memory is bounded by the batch, and the cost grows
    with the table, never with its square. Returns how many rows got a value."""
    if source.count_rows() and not any(list(ix.field_names) == ["image_id"] for ix in source.describe_indices()):
        source.create_scalar_index("image_id", "BTREE")
    schema = pa.schema([pa.field(column, field_type)])
    scan = images.checkout_version(images.version)  # another handle: add_columns holds this one
    filled = 0

    def values() -> Iterator[pa.RecordBatch]:
        nonlocal filled
        for batch in scan.to_batches(columns=["image_id"], batch_size=batch_rows, scan_in_order=True):
            ids = batch.column("image_id").to_pylist()
            found = table_by_ids(source, ids, [value], where=where)
            if found.num_rows == 0:
                out = pa.nulls(len(ids), field_type)
            else:
                pos = {image_id: i for i, image_id in enumerate(found.column("image_id").to_pylist())}
                order = pa.array([pos.get(i) for i in ids], pa.int64())
                out = found.column(value).combine_chunks().take(order).cast(field_type)
            filled += len(ids) - out.null_count
            yield pa.record_batch([out], schema=schema)

    images.add_columns(pa.RecordBatchReader.from_batches(schema, values()))
    return filled


def has_row_versions(*tables: lance.LanceDataset) -> bool:
    """Whether every table tracks stable row ids (so its rows carry their versions)."""
    return all(bool(getattr(t, "has_stable_row_ids", False)) for t in tables)


def cursor_for(state: SyncState, column: str, source: lance.LanceDataset, images: lance.LanceDataset) -> int | None:
    """The source version to sync ``column`` from by change, or ``None`` for a full join."""
    since = state.columns.get(column)
    if since is None or column not in images.schema.names or not has_row_versions(source, images):
        return None
    if since > source.version or (state.images_version or 0) > images.version:
        return None  # a table was restored to an older version: compare everything once
    return since

