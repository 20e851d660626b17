"""Lab sync by change: which caption and embedding rows to join, from Lance's own row versions.

Every table this project creates tracks stable row ids, so each row carries
``_row_last_updated_at_version`` and ``_row_created_at_version`` (kept through compaction).
A lab column remembers the version of its source table it was last synced from (in
``lance/_lab_sync.json``, with the images table's version at that sync). The next sync joins only

- source rows written since that version (new or re-written captions and vectors), and
- source rows of images rows created since the last sync (an image deleted and ingested
  again gets its existing caption back),

compares them with the lab's current values (every column's changes together, one lookup per
image: :func:`compare_and_write`), and rewrites the values that differ, per fragment by whichever
writes fewer bytes (:func:`route_by_fragment`): the changed rows whole, once with all their
changed columns set (moved to new fragments; every index stays valid for the rest), or each
changed column for the whole fragment in place (``update_columns`` per fragment joined by row id,
all committed as one ``Update``: no other column, the JPEG bytes least of all, is written again,
no scan of the table's keys; only that column's index stops covering the fragment until the next
fold). A new batch's rows fill their own fragments, so they take the column path; a few
rows scattered over large fragments take the row path. Memory is bounded by the values gathered
before a write (``prx_assets.core.lab.sync.COMBINE_BYTES``), not by the table. A new column is filled in one pass in the table's row order (one commit). A column
without a cursor, a table without row versions (created before they were tracked) or a
cursor ahead of the table (restored from a backup) falls back to the full comparison
(:func:`full_differences`): one sequential scan of each side into 64-bit keys and value digests,
a join of those, and a read of the differing rows only, so it grows with the table, not with the
table times a pass per id range (ids are hashes: every range touches every page of a column).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.compat import lance as lance_compat
from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.hexdigits import hex64
from prx_assets.core.lab.sql import literal, table_by_ids, where_all
from prx_assets.core.lab.table import dataset_size
from prx_assets.core.sorted_lookup import lookup

#: Rows compared and committed at a time by a sync by change.
CHANGE_CHUNK = 65_536
#: Ids per lookup of new images' rows in a source table (one scan each, pushed down).
LOOKUP_CHUNK = 4096
#: Rows per id range of :func:`id_ranges` (key-only scans, e.g. the doctor's duplicate search).
FULL_CHUNK_ROWS = 1_000_000
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


#: Rows read at a time by a full comparison (one batch of both sides' ids and values; smaller batches
#: scanned a 1,152-d column faster here: 3.3 s at 8,192 against 8-9 s at 65,536 for 3M rows).
FULL_SCAN_ROWS = 8192
#: Odd 64-bit multipliers of the row digest (fixed: a digest only meets digests of the same run).
_MULT = (np.random.default_rng(20261201).integers(0, 2**63, 4096, dtype=np.uint64) << np.uint64(1)) | np.uint64(1)


def key64(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """64-bit keys of image ids, each id on its own (so an id has the same key in any array): exact
    for the 16-hex-digit ids this project writes (as unsigned integers), else an 8-byte blake2b of
    the id (a null as the empty id).

    >>> key64(pa.array(["00000000000000ff", "ffffffffffffffff"])).tolist()
    [255, 18446744073709551615]
    >>> bool(key64(pa.array(["00000000000000ff", "photo-1"]))[0] == key64(pa.array(["00000000000000ff"]))[0])
    True
    """
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    out, hexed = hex64(arr)
    other = np.flatnonzero(~hexed)
    if len(other):
        import hashlib

        out[other] = np.array([int.from_bytes(hashlib.blake2b((v or "").encode(), digest_size=8).digest(), "big")
                               for v in arr.take(pa.array(other)).to_pylist()], dtype=np.uint64)
    return out


def digest64(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit digest of each value's stored bytes (0 for a null, never 0 otherwise): fixed-size
    vectors word by word with fixed odd multipliers (two vectors that differ in one word always
    differ here; others collide with odds of about 2**-63), strings and binaries by an 8-byte
    blake2b. Equal digests stand for equal values the way :func:`differs` compares them (stored bits)."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    n = len(arr)
    out = np.zeros(n, dtype=np.uint64)
    if not n:
        return out
    valid = ~np.asarray(arr.is_null(), dtype=bool)
    if pa.types.is_fixed_size_list(arr.type):
        bits = _value_bits(arr)
        row_bytes = bits.shape[1] * bits.dtype.itemsize
        raw = np.ascontiguousarray(bits).view(np.uint8).reshape(n, row_bytes)
        if row_bytes % 8:
            raw = np.concatenate([raw, np.zeros((n, 8 - row_bytes % 8), np.uint8)], axis=1)
        words = raw.view(np.uint64)
        mult = np.resize(_MULT, words.shape[1])
        with np.errstate(over="ignore"):
            h = (words * mult[None, :]).sum(axis=1, dtype=np.uint64)
    else:  # strings and binaries: an 8-byte blake2b of each (a C call per value, a batch at a time)
        import hashlib

        data = arr.cast(pa.binary()) if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else arr
        h = np.fromiter((int.from_bytes(hashlib.blake2b(v, digest_size=8).digest(), "little") if v is not None else 0
                         for v in data.to_pylist()), dtype=np.uint64, count=n)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x9E3779B97F4A7C15)
    out[valid] = h[valid] | np.uint64(1)
    return out


def _compact(ds: lance.LanceDataset, columns: list[str], where: str | None, cast: pa.DataType | None,
             with_address: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One streaming pass over ``ds``: per row its :func:`key64`, the :func:`digest64` of its value
    (``columns[1]``, cast to ``cast``) and (``with_address``) its row address and row id, sorted by
    key; 16-32 bytes a row, whatever the values weigh. Lance reads one fragment and two batches
    ahead (its defaults buffer several fragments of wide columns: 2.8 GB against 1.1 GB at 1M rows
    of 1,152-d vectors, for the same speed)."""
    keys, digs, addrs, rowids = [], [], [], []
    scan = ds.scanner(columns=columns, filter=where, batch_size=FULL_SCAN_ROWS, with_row_address=with_address,
                      with_row_id=with_address, batch_readahead=2, fragment_readahead=1)
    for batch in scan.to_batches():
        if not batch.num_rows:
            continue
        keys.append(key64(batch.column(0)))
        value = batch.column(1)
        digs.append(digest64(value.cast(cast) if cast is not None and value.type != cast else value))
        if with_address:  # copies: a view would keep the whole batch (its vectors too) alive
            addrs.append(batch.column("_rowaddr").to_numpy().copy())
            rowids.append(batch.column("_rowid").to_numpy().copy())
    if not keys:
        empty = np.zeros(0, np.uint64)
        return empty, empty, (empty if with_address else None), (empty if with_address else None)
    k, d = np.concatenate(keys), np.concatenate(digs)
    order = np.argsort(k, kind="stable")
    if not with_address:
        return k[order], d[order], None, None
    return k[order], d[order], np.concatenate(addrs)[order], np.concatenate(rowids)[order]


def full_differences(source: lance.LanceDataset, value: str, where: str | None, images: lance.LanceDataset,
                     column: str, field_type: pa.DataType, chunk: int = CHANGE_CHUNK) -> Iterator[pa.Table]:
    """A full comparison that costs two sequential scans, not a pass per range: each side is read
    once into sorted 64-bit keys and value digests (:func:`_compact`), the keys are joined, and only
    the rows whose digests differ are read again, by id, from the source. Yields ``image_id`` /
    ``column`` / ``_rowaddr`` / ``_rowid`` tables of the lab rows to rewrite (at most ``chunk`` rows each), as
    :func:`changed_values` would find them (the lab's rows with a source value that differs)."""
    lab_keys, lab_digs, lab_addr, lab_rowid = _compact(images, ["image_id", column], None, None, True)
    src_keys, src_digs, _, _ = _compact(source, ["image_id", value], where, field_type, False)
    if not len(lab_keys) or not len(src_keys):
        return
    hit, at = lookup(lab_keys, src_keys)
    differ = hit & (lab_digs[at] != src_digs)
    if not differ.any():
        return
    wanted_keys, wanted_addr, wanted_rowid = src_keys[differ], lab_addr[at[differ]], lab_rowid[at[differ]]
    if not source.count_rows() or not any(list(ix.field_names) == ["image_id"] for ix in source.describe_indices()):
        source.create_scalar_index("image_id", "BTREE")
    for a in range(0, len(wanted_keys), chunk):
        ks, addr, rowid = wanted_keys[a:a + chunk], wanted_addr[a:a + chunk], wanted_rowid[a:a + chunk]
        # The project's ids are 16 hex digits, so a key written back in hex is the id; any key not
        # found that way (ids of another form) is looked for in a scan of the source's ids.
        got = table_by_ids(source, [f"{int(k):016x}" for k in ks], [value], where=where)
        found = np.isin(ks, key64(got.column("image_id"))) if got.num_rows else np.zeros(len(ks), bool)
        if not found.all():
            extra = table_by_ids(source, _ids_with_keys(source, where, ks[~found]), [value], where=where)
            got = pa.concat_tables([got, extra]) if got.num_rows else extra
        if not got.num_rows:
            continue
        order = np.searchsorted(ks, key64(got.column("image_id")))
        yield pa.table({"image_id": got.column("image_id"), column: got.column(value).cast(field_type),
                        "_rowaddr": pa.array(addr[order], pa.uint64()), "_rowid": pa.array(rowid[order], pa.uint64())})


def _ids_with_keys(source: lance.LanceDataset, where: str | None, keys: np.ndarray) -> list[str]:
    """The source's image ids whose :func:`key64` is among the sorted ``keys`` (one scan of the ids)."""
    found: list[str] = []
    for batch in source.scanner(columns=["image_id"], filter=where, batch_size=FULL_SCAN_ROWS).to_batches():
        k = key64(batch.column(0))
        found += batch.column(0).filter(pa.array(lookup(keys, k)[0])).to_pylist()
    return found


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


def _scan_since(ds: lance.LanceDataset, columns: list[str], flt: str, version: int, chunk: int,
                with_row_id: bool = False) -> Iterator[pa.RecordBatch]:
    """Batches of ``ds`` matching ``flt`` (a filter on row versions after ``version``), scanning only
    the fragments that can hold such rows (:func:`fragments_since`): the scan costs what changed."""
    fragments = fragments_since(ds, version)
    if fragments is not None and not fragments:
        return
    yield from ds.scanner(columns=columns, filter=flt, batch_size=chunk, fragments=fragments,
                          with_row_id=with_row_id).to_batches()


@dataclass(frozen=True)
class CreatedRows:
    """Images rows created since a version, sorted by :func:`key64` of their id, with their ids and
    stable row ids (about 40 bytes a row, bounded by what was ingested since): a new batch's rows are
    then found in the lab without a lookup by key."""

    keys: np.ndarray
    ids: pa.Array
    rowids: np.ndarray

    @classmethod
    def scan(cls, images: lance.LanceDataset, since: int, chunk: int = CHANGE_CHUNK) -> CreatedRows:
        """Scan only the fragments written since ``since`` (:func:`fragments_since`)."""
        keys, ids, rowids = [], [], []
        flt = f"_row_created_at_version > {int(since)}"
        for batch in _scan_since(images, ["image_id"], flt, since, chunk, with_row_id=True):
            keys.append(key64(batch.column("image_id")))
            ids.append(batch.column("image_id"))
            rowids.append(batch.column("_rowid").to_numpy().copy())
        if not keys:
            return cls(np.zeros(0, np.uint64), pa.array([], pa.string()), np.zeros(0, np.uint64))
        k = np.concatenate(keys)
        order = np.argsort(k, kind="stable")
        return cls(k[order], pa.concat_arrays(ids).take(pa.array(order)),
                   np.concatenate(rowids)[order].astype(np.uint64))

    def attach(self, t: pa.Table) -> pa.Table:
        """``t`` (``image_id`` first) with the ``_rowid`` of the ids found here (null elsewhere; an id
        that merely shares a key is caught where the row is read: :func:`current_rows`)."""
        if not len(self.keys):
            return t
        k = key64(t.column("image_id"))
        hit, at = lookup(self.keys, k)
        return t.append_column("_rowid", pa.array(self.rowids[at], pa.uint64(), mask=~hit))

    def missing(self, seen: np.ndarray) -> np.ndarray:
        """Positions of the created rows whose key is not in ``seen``."""
        if not len(seen):
            return np.arange(len(self.keys))
        return np.flatnonzero(~np.isin(self.keys, seen))


def changed_rows(source: lance.LanceDataset, value: str, where: str | None, since: int,
                 images: lance.LanceDataset, images_since: int | None,
                 chunk: int = CHANGE_CHUNK, created: CreatedRows | None = None) -> Iterator[pa.Table]:
    """``image_id``/``value`` tables (at most ``chunk`` rows each) of the source rows to re-join:
    written since version ``since``, plus the source rows of images created since ``images_since``
    that have no newer row (an image deleted and ingested again gets its caption back). Only
    fragments written since those versions are scanned (see :func:`fragments_since`). Rows of
    images created since carry their lab ``_rowid`` (null for the others), so a new batch's rows
    are compared and written without a lookup by key. ``created``: that scan, when the caller
    shares one between columns."""
    if created is None and images_since is not None:
        created = CreatedRows.scan(images, images_since, chunk)
    flt = where_all(where, f"_row_last_updated_at_version > {int(since)}")
    yielded: list[np.ndarray] = []  # keys of the rows yielded (8 bytes each)
    for batch in _scan_since(source, ["image_id", value], flt, since, chunk):
        if batch.num_rows:
            t = pa.Table.from_batches([batch]).rename_columns(["image_id", "value"])
            if created is not None and len(created.keys):
                yielded.append(key64(batch.column(0)))
                t = created.attach(t)
            yield t
    if created is None or not len(created.keys):
        return
    # Created images without a source row written since: their older row, looked up by id.
    rest = created.missing(np.unique(np.concatenate(yielded)) if yielded else np.zeros(0, np.uint64))
    older = where_all(where, f"_row_last_updated_at_version <= {int(since)}")
    for a in range(0, len(rest), chunk):
        ids = created.ids.take(pa.array(rest[a:a + chunk])).to_pylist()
        t = table_by_ids(source, ids, [value], chunk=LOOKUP_CHUNK, where=older)
        if t.num_rows:
            yield created.attach(t.rename_columns(["image_id", "value"]))


def compare_and_write(images: lance.LanceDataset, values: dict[str, tuple[pa.DataType, pa.Table]]) -> dict[str, int]:
    """For several columns at once (``{column: (type, image_id/value table)}``): read the lab's
    current values of every id involved once (looked up by key, taken by row id, with row ids and
    addresses), keep the values that differ and write them together (:func:`write_changes`), so an
    image whose caption and vector both changed is read and rewritten once. Returns rows updated
    per column."""
    ids = pc.unique(pa.concat_arrays([t.column("image_id").combine_chunks() for _, t in values.values()]))
    if not len(ids):
        return dict.fromkeys(values, 0)
    current = current_rows(images, [t for _, t in values.values()], ids, list(values))
    changed = {col: changed_values(col, ftype, t, current.select(
        [c for c in ("image_id", col, "_rowaddr", "_rowid") if c in current.column_names]))
        for col, (ftype, t) in values.items()}
    return write_changes(images, changed)


def current_rows(images: lance.LanceDataset, parts: Sequence[pa.Table], ids: pa.Array,
                 columns: list[str]) -> pa.Table:
    """The lab's ``image_id``, ``columns``, ``_rowaddr`` and ``_rowid`` for ``ids``: rows whose row
    id the parts carry (a new batch's, from :class:`CreatedRows`) are taken by row id, with their
    address as the lab has it now (an earlier write of this sync may have moved them); the others
    are looked up by key. A taken row whose id differs (deleted since) is looked up too. A column
    that is null in every row (all rows taken, and none of their fragments holds a file for it:
    a new batch's) is left out rather than built as nulls (245 MB for 100,000 1,152-d vectors)."""
    known = [t.select(["image_id", "_rowid"]).filter(pc.is_valid(t.column("_rowid")))
             for t in parts if "_rowid" in t.column_names]
    known_t = pa.concat_tables(known).combine_chunks() if known else None
    taken = None
    if known_t is not None and known_t.num_rows:
        _, first = np.unique(key64(known_t.column("image_id")), return_index=True)
        known_t = known_t.take(pa.array(first))
        rowids = known_t.column("_rowid").combine_chunks()
        try:
            got = lance_compat.take_rows(images, rowids, ["image_id", "_rowaddr"])
            if got.num_rows == known_t.num_rows:
                # columns without a data file in any of those fragments (a new batch's) are null: not read
                empty = _columns_without_data(images, _fragment_of(got), columns)
                wanted = [c for c in columns if c not in empty]
                values = lance_compat.take_rows(images, rowids, wanted) if wanted else pa.table({})
                for c in wanted:
                    got = got.append_column(images.schema.field(c), values.column(c))
        except (OSError, ValueError, RuntimeError):
            got = None
        if got is not None and got.num_rows == known_t.num_rows:
            same = pc.equal(got.column("image_id"), known_t.column("image_id"))
            taken = got.append_column("_rowid", rowids).filter(pc.fill_null(same, False))
    lookup = ids if taken is None else ids.filter(pc.invert(pc.is_in(ids, value_set=taken.column("image_id"))))
    if taken is not None and not len(lookup):
        return taken
    looked = table_by_ids(images, lookup.to_pylist(), [*columns, "_rowaddr", "_rowid"])
    if taken is None:
        return looked
    for c in columns:  # both kinds of rows: the columns left out are nulls after all
        if c not in taken.column_names:
            taken = taken.append_column(images.schema.field(c), pa.nulls(taken.num_rows, images.schema.field(c).type))
    return pa.concat_tables([taken.select(looked.column_names).cast(looked.schema), looked])


def _columns_without_data(images: lance.LanceDataset, fragments: np.ndarray, columns: Sequence[str]) -> set[str]:
    """Those of ``columns`` that no data file of the given fragments holds: added to the table after
    those rows were written and never filled there, so null in every one of their rows (read from
    the manifest, no data)."""
    ids = {f.name(): f.id() for f in images.lance_schema.fields()}
    wanted = {c: ids[c] for c in columns if c in ids}
    present: set[int] = set()
    for fid in np.unique(fragments).tolist():
        frag = images.get_fragment(int(fid))
        if frag is None:
            return set()
        for df in frag.data_files():
            present.update(int(f) for f in df.fields)
    return {c for c, i in wanted.items() if i not in present}


def changed_values(column: str, field_type: pa.DataType, values: pa.Table, current: pa.Table) -> pa.Table:
    """``image_id``/``column`` (and ``_rowaddr``/``_rowid`` when ``current`` has them) of the rows of
    ``values`` that exist in the lab's ``current`` (``image_id``, ``column``) with a different value.
    Rows are matched by :func:`key64` (ids compared after), so values already in the lab's order
    are not gathered again, and a lab column that is null in every row read (a new batch's; absent
    from ``current`` when :func:`current_rows` left it out) is not compared: each non-null value is
    a change."""
    li, ri = _match(values.column("image_id"), current.column("image_id"))
    new = take_rows(values.column("value"), li).cast(field_type)
    cur = current.column(column) if column in current.column_names else None  # None: null in every row
    if cur is None or cur.null_count == len(cur):  # nothing to compare with: every value is new
        keep = np.flatnonzero(np.asarray(pc.is_valid(new), dtype=bool)) if new.null_count else None
    else:
        keep = np.flatnonzero(np.asarray(differs(take_rows(cur, ri), new)))
    if keep is not None and len(keep) < len(li):
        li, ri, new = li[keep], ri[keep], take_rows(new, keep)
    out = {"image_id": take_rows(values.column("image_id"), li), column: new}
    for meta in ("_rowaddr", "_rowid"):
        if meta in current.column_names:
            out[meta] = take_rows(current.column(meta), ri)
    return pa.table(out)


def _match(left: pa.Array | pa.ChunkedArray, right: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(li, ri)`` of the equal ids of ``left`` and ``right``, in ``left``'s order, every
    pair of equal ids once (an id twice on the right, a duplicate in the lab, pairs with each)."""
    kl, kr = key64(left), key64(right)
    order = np.argsort(kr, kind="stable")
    kr_sorted = kr[order]
    lo = np.searchsorted(kr_sorted, kl, side="left")
    hi = np.searchsorted(kr_sorted, kl, side="right")
    count = hi - lo
    if not count.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    li = np.repeat(np.arange(len(kl)), count)
    ri = order[np.repeat(lo, count) + (np.arange(len(li)) - np.repeat(np.cumsum(count) - count, count))]
    same = np.asarray(pc.fill_null(pc.equal(take_rows(left, li), take_rows(right, ri)), False),
                      dtype=bool)  # keys of other ids may collide; a null id matches nothing
    return (li, ri) if same.all() else (li[same], ri[same])


def take_rows(arr: pa.Array | pa.ChunkedArray, indices: np.ndarray) -> pa.Array:
    """``arr.take(indices)``; a range of positions is a slice (no copy), and a fixed-size list
    (vectors) is gathered as one numpy matrix, several times faster than Arrow's take of
    fixed-size lists of half floats (0.19 s for 10,000 1,152-d vectors, most of a sync by change
    of a new batch).

    >>> v = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float16)), 2)
    >>> take_rows(v, np.array([2, 0])).to_pylist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    idx = np.asarray(indices, dtype=np.int64)
    if len(idx) and idx[-1] - idx[0] == len(idx) - 1 and np.all(np.diff(idx) == 1):
        return arr.slice(int(idx[0]), len(idx))  # a range (rows already in order): no copy
    if len(arr) and arr.null_count == len(arr):  # all null (a column a new batch has no values in yet)
        return pa.nulls(len(idx), arr.type)
    if not pa.types.is_fixed_size_list(arr.type) or arr.values.null_count or not len(arr):
        return arr.take(pa.array(idx, pa.int64()))
    dim = arr.type.list_size
    flat = arr.values.slice(arr.offset * dim, len(arr) * dim).to_numpy(zero_copy_only=False)
    if flat.dtype == object:  # not a numeric vector: Arrow's own take
        return arr.take(pa.array(idx, pa.int64()))
    rows = np.ascontiguousarray(flat.reshape(len(arr), dim)[idx])
    mask = np.asarray(arr.is_null(), dtype=bool)[idx] if arr.null_count else None
    return pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), arr.type.value_type), type=arr.type,
                                             mask=None if mask is None else pa.array(mask))


def write_changed(images: lance.LanceDataset, column: str, changed: pa.Table) -> int:
    """Write ``changed`` (``image_id``, ``column``, and ``_rowaddr``/``_rowid`` when known) into the
    lab; returns the rows written (one column of :func:`write_changes`)."""
    return write_changes(images, {column: changed})[column]


def write_changes(images: lance.LanceDataset, changed: dict[str, pa.Table]) -> dict[str, int]:
    """Write changed values of several columns (``{column: image_id/column[/_rowaddr/_rowid]}``) into
    the lab; returns rows written per column. Each fragment's changes go the way that writes fewer
    bytes (:func:`route_by_fragment`): its changed rows rewritten whole once with every changed
    column set (moved to new fragments), or each changed column rewritten in place
    (``rewrite_columns``, in slices of ``MERGE_BYTES``). Without row addresses, or past
    ``ROWS_MODE_SHARE`` of the table, every change takes the column path."""
    changed = {c: t for c, t in changed.items()}
    out = {c: t.num_rows for c, t in changed.items()}
    total = sum(out.values())
    if not total:
        return out
    whole_frags: set[int] = set()
    if all({"_rowaddr", "_rowid"} <= set(t.column_names) for t in changed.values()) \
            and total <= ROWS_MODE_SHARE * images.count_rows():
        whole_frags = route_by_fragment(images, changed)
    if whole_frags:
        whole = {c: t.filter(pa.array(np.isin(_fragment_of(t), list(whole_frags)))) for c, t in changed.items()}
        _rewrite_rows(images, {c: t for c, t in whole.items() if t.num_rows})
        changed = {c: t.filter(pa.array(~np.isin(_fragment_of(t), list(whole_frags)))) for c, t in changed.items()}
    for column, t in changed.items():
        if t.num_rows:
            _rewrite_columns(images, column, t)
    return out


def _rewrite_columns(images: lance.LanceDataset, column: str, changed: pa.Table) -> None:
    """Rewrite ``column`` in place in the fragments holding the rows of ``changed`` (``image_id``,
    ``column``, ``_rowid``, ``_rowaddr``): each fragment joins its own changed rows by row id
    (``LanceFragment.update_columns``) into one new data file for that column, and all fragments
    are committed as one ``Update`` that refreshes the row versions of the matched rows only. Its
    cost is the touched fragments' column, never the table: no scan of the table's keys (a
    ``merge_insert`` scans them per merge, which grew with the table). Without row ids or
    addresses, for a fragment that is gone, or when a concurrent commit conflicts with this one,
    the rows go through ``merge_insert`` by key instead (:func:`_merge_columns`)."""
    if not {"_rowid", "_rowaddr"} <= set(changed.column_names):
        _merge_columns(images, column, changed)
        return
    ftype = images.schema.field(column).type
    frag = _fragment_of(changed)
    order = np.argsort(frag, kind="stable")
    frag_sorted = frag[order]
    starts = np.flatnonzero(np.r_[True, frag_sorted[1:] != frag_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]
    updated: list[Any] = []
    offsets: dict[int, bytes] = {}
    fields: set[int] = set()
    leftover: list[np.ndarray] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        fid = int(frag_sorted[a])
        rows = order[a:b]
        fragment = images.get_fragment(fid)
        if fragment is None:  # compacted or deleted since the rows were read: look them up by key
            leftover.append(rows)
            continue
        data = pa.table({"_rowid": take_rows(changed.column("_rowid"), rows).cast(pa.uint64()),
                         column: take_rows(changed.column(column), rows).cast(ftype)})
        meta, modified, matched = fragment.update_columns(data, left_on="_rowid", with_offsets=True)
        updated.append(meta)
        fields.update(int(f) for f in modified)
        offsets[fid] = matched
    if updated:
        op = lance.LanceOperation.Update(updated_fragments=updated, fields_modified=sorted(fields),
                                         update_mode="rewrite_columns", updated_fragment_offsets=offsets)
        try:
            lance.LanceDataset.commit(images, op, read_version=images.version)
        except (OSError, ValueError, RuntimeError) as e:
            if not _is_conflict(e):
                raise
            leftover = [np.arange(changed.num_rows)]  # a concurrent writer moved rows: by key, all of them
        images.checkout_latest()
    if leftover:
        _merge_columns(images, column, changed.take(pa.array(np.concatenate(leftover))))


def _is_conflict(error: BaseException) -> bool:
    """Whether a Lance commit failed because a concurrent commit touched the same fragments
    (``CommitConflictError``: "Retryable commit conflict ... preempted by concurrent transaction")."""
    from lance.commit import CommitConflictError

    text = str(error).lower()
    return isinstance(error, CommitConflictError) or any(w in text for w in ("commit conflict", "incompatible transaction"))


def _merge_columns(images: lance.LanceDataset, column: str, changed: pa.Table) -> None:
    """Rewrite ``column`` for the rows of ``changed`` by key (``merge_insert`` in ``rewrite_columns``
    mode, in slices of ``MERGE_BYTES``: Lance joins a merge in a 300 MB memory pool); each merge
    scans the table's keys."""
    in_place = changed.select(["image_id", column])
    step = max(1024, min(MERGE_ROWS, MERGE_BYTES * max(1, in_place.num_rows) // max(1, in_place.nbytes)))
    for start in range(0, in_place.num_rows, step):
        part = in_place.take(np.arange(start, min(start + step, in_place.num_rows)))  # a copy: a slice would
        images.merge_insert("image_id").when_matched_update_all().write_mode("rewrite_columns") \
            .execute(part)  # carry (and be accounted) with every byte of its parent's buffers


def _fragment_of(t: pa.Table) -> np.ndarray:
    """The fragment id of each row of ``t`` (from its ``_rowaddr``)."""
    return (t.column("_rowaddr").to_numpy().astype(np.uint64) >> np.uint64(32)).astype(np.int64)


def _width(images: lance.LanceDataset, column: str, values: pa.Table) -> float:
    """Bytes per row of ``column`` (exact for vectors; the new values' average for strings)."""
    ftype = images.schema.field(column).type
    if pa.types.is_fixed_size_list(ftype):
        return ftype.list_size * max(1, ftype.value_type.bit_width // 8)
    return max(1.0, values.column(column).nbytes / max(1, values.num_rows))


#: Whole rows cost more than their bytes: a take of each row, an Arrow splice and a merge (measured:
#: 10,000 new rows of 1,152-d float16 vectors, 0.34 s as whole rows against 0.095 s as the column of
#: their fragment, which the byte counts alone rate the other way round).
ROW_PATH_FACTOR = 4
#: A write of whole rows also scans the table's keys once (``merge_insert`` joins by key): about as
#: long as writing this many bytes per row of the table (0.06 s per 1M rows).
KEY_SCAN_BYTES = 32


def route_by_fragment(images: lance.LanceDataset, changed: dict[str, pa.Table]) -> set[int]:
    """The fragments whose changed rows are cheaper rewritten whole than their changed columns
    rewritten in place. Whole rows cost the fragment's distinct changed rows times its bytes per
    row (every column, the stored image included) plus their changed columns once more (moved rows
    leave every index: at least those columns are indexed again at the next fold), times
    ``ROW_PATH_FACTOR``; each changed column costs the fragment's rows times the column's bytes
    per row, twice (its index must cover the fragment again at the next fold). Whole rows go only
    where they save more than the scan of the table's keys their merge costs (``KEY_SCAN_BYTES``
    per row of the table). So a fragment whose rows all changed (a new batch's captions and
    vectors) takes the column path, and so does a large share of a fragment. Sizes come from the
    manifest.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> ds = lance.write_dataset(pa.table({"image_id": ["a", "b"], "c": ["x", "y"], "jpeg": [b"0" * 9000] * 2}), d)
    >>> route_by_fragment(ds, {"c": pa.table({"image_id": ["a"], "c": ["z"], "_rowaddr": pa.array([0], pa.uint64())})})
    set()
    """
    info = {f.fragment_id: f for f in images.get_fragments()}
    addrs_per: dict[int, list[np.ndarray]] = {}
    column_cost: dict[int, float] = {}
    widths: dict[int, float] = {}
    for column, t in changed.items():
        if not t.num_rows:
            continue
        width = _width(images, column, t)
        addr = t.column("_rowaddr").to_numpy().astype(np.uint64)
        frag = (addr >> np.uint64(32)).astype(np.int64)
        for fid in np.unique(frag).tolist():
            f = info.get(fid)
            if f is None:
                continue
            addrs_per.setdefault(fid, []).append(addr[frag == fid])
            column_cost[fid] = column_cost.get(fid, 0.0) + 2 * max(1, int(f.metadata.physical_rows)) * width
            widths[fid] = widths.get(fid, 0.0) + width
    whole: set[int] = set()
    saved = 0.0
    for fid, parts in addrs_per.items():
        f = info[fid]
        rows = len(np.unique(np.concatenate(parts)))
        row_bytes = sum(int(df.file_size_bytes or 0) for df in f.data_files()) / max(1, int(f.metadata.physical_rows))
        cost = rows * (row_bytes + widths[fid]) * ROW_PATH_FACTOR
        if cost < column_cost[fid]:
            whole.add(fid)
            saved += column_cost[fid] - cost
    key_scan = KEY_SCAN_BYTES * sum(int(f.metadata.physical_rows) for f in info.values())
    return whole if saved > key_scan else set()


def _row_slices(images: lance.LanceDataset, rows: pa.Table) -> Iterator[pa.Table]:
    """``rows`` in slices whose whole lab rows (with the slice's own bytes) hold ~``ROWS_MERGE_BYTES``."""
    row_bytes = dataset_size(images) // max(1, images.count_rows())
    step = max(16, ROWS_MERGE_BYTES // max(1, row_bytes + rows.nbytes // max(1, rows.num_rows)))
    for start in range(0, rows.num_rows, step):
        yield rows.slice(start, step)


def _rewrite_rows(images: lance.LanceDataset, changed: dict[str, pa.Table]) -> None:
    """Rewrite whole the lab rows named in ``changed`` (``{column: image_id/column/_rowid}``), each
    once with every one of its changed columns set, a slice of ~``ROWS_MERGE_BYTES`` at a time (one
    take of the rows by row id, one merge and one scan of the key column per slice). Rewritten
    rows move to new fragments, so every index stays valid for all other rows."""
    names = images.schema.names
    rowids = pc.unique(pa.concat_arrays([t.column("_rowid").combine_chunks() for t in changed.values()]))
    for part in _row_slices(images, pa.table({"_rowid": rowids})):
        full = lance_compat.take_rows(images, part.column("_rowid").combine_chunks(), names).select(names)
        for column, t in changed.items():
            new = t.filter(pc.is_in(t.column("_rowid"), value_set=part.column("_rowid")))
            if not new.num_rows:
                continue
            at = pc.index_in(new.column("image_id"), value_set=full.column("image_id")).to_numpy()
            order = np.arange(full.num_rows)
            order[at] = full.num_rows + np.arange(new.num_rows)  # the new value where there is one
            col = pa.concat_arrays([full.column(column).combine_chunks(), new.column(column).combine_chunks()
                                    .cast(images.schema.field(column).type)]).take(pa.array(order))
            full = full.set_column(names.index(column), images.schema.field(column), col)
        # The join by a scan of the key column, not by its index: on a table with rows outside the
        # index and deletions inside it (every table after a few syncs), Lance's indexed merge path
        # computes a deletion mask per fragment and measured 3-5x slower (0.42-0.67 s vs 0.14-0.16 s
        # per merge of 2,000 rows into 1M); the scan reads 16 bytes per row of the table.
        images.merge_insert("image_id").when_matched_update_all().use_index(False).execute(full)


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

