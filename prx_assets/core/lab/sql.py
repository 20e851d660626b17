"""The one way PRX talks SQL to Lance: quoted literals, ``IN`` lists, rows by id, pinned versions.

Every predicate built from a value (an image id, a batch key, a captioner id, a source
name) goes through :func:`literal`, so a quote inside a value can never end the literal
early. Lookups by id go through :func:`rows_by_ids` / :func:`table_by_ids`, which chunk the
``IN`` list and read wide columns only for the matching rows (:func:`fetch_by_ids`).

>>> literal("it's")
"'it''s'"
>>> where_eq("batch", "photos-00001")
"batch = 'photos-00001'"
>>> where_in("image_id", ["a", "b"])
"image_id IN ('a', 'b')"
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import lance
import pyarrow as pa

from prx_assets.compat.lance import take_rows

#: Ids per ``IN (...)`` predicate: large enough to amortize a scan, small enough to plan fast.
ID_CHUNK = 512
#: Ids per key lookup of :func:`table_by_ids`: each lookup also scans the key column of the rows
#: no index covers yet, so fewer, larger lookups cost less (measured: 10,000 ids into 1M rows,
#: 0.57 s in lookups of 512, 0.11 s in lookups of 8,192).
LOOKUP_CHUNK = 8192


def literal(value: str | int | float | bool) -> str:
    """A Lance SQL literal for ``value``: strings single-quoted with quotes doubled.

    Raises
    ------
    TypeError
        For values that are not str, int, float or bool (say which column you meant to compare).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as a Lance SQL literal; "
                    "pass a str, int, float or bool")


def where_eq(column: str, value: str | int | float | bool) -> str:
    """``column = <literal>``."""
    return f"{column} = {literal(value)}"


def where_in(column: str, values: Sequence[str | int | float]) -> str:
    """``column IN (<literals>)``; an empty list gives a predicate that matches nothing."""
    if not values:
        return "false"
    return f"{column} IN ({', '.join(literal(v) for v in values)})"


def where_all(*clauses: str | None) -> str | None:
    """The non-empty clauses joined with ``AND`` (``None`` when there are none)."""
    parts = [c for c in clauses if c]
    if len(parts) == 1:
        return parts[0]
    return " AND ".join(f"({c})" for c in parts) or None


def chunks(seq: Sequence[Any], size: int = ID_CHUNK) -> Iterator[Sequence[Any]]:
    """Consecutive slices of ``seq`` of at most ``size`` items."""
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


def rows_by_ids(ds: lance.LanceDataset, ids: Sequence[str], columns: Sequence[str], *,
                key: str = "image_id", where: str | None = None,
                chunk: int = ID_CHUNK) -> Iterator[tuple[Sequence[str], dict[str, dict[str, Any]]]]:
    """Yield ``(id chunk, {id: row})`` for ``ids`` in chunks of ``chunk``; memory bounded by ``chunk``.

    Ids missing from the table are simply absent from the chunk's dict, so the caller
    decides whether that is an error. ``key`` is always fetched.
    """
    cols = list(dict.fromkeys([key, *columns]))
    for part in chunks(ids, chunk):
        table = fetch_by_ids(ds, part, cols, key=key, where=where)
        yield part, {r[key]: r for r in table.to_pylist()}


def table_by_ids(ds: lance.LanceDataset, ids: Sequence[str], columns: Sequence[str], *,
                 key: str = "image_id", where: str | None = None, chunk: int = LOOKUP_CHUNK) -> pa.Table:
    """The rows for ``ids`` (any order, and ``where`` if given) as one Arrow table; for id lists of
    a chunk or a sample."""
    cols = list(dict.fromkeys([key, *columns]))
    parts = [fetch_by_ids(ds, part, cols, key=key, where=where) for part in chunks(ids, chunk)]
    if parts:
        return pa.concat_tables(parts)
    return pa.schema([pa.field(c, pa.uint64()) if c in ("_rowid", "_rowaddr") else ds.schema.field(c)
                      for c in cols]).empty_table()


def fetch_by_ids(ds: lance.LanceDataset, ids: Sequence[str], columns: Sequence[str], *,
                 key: str = "image_id", where: str | None = None) -> pa.Table:
    """``columns`` of the rows whose ``key`` is in ``ids`` (and match ``where``), in two steps: the
    ``IN`` filter reads only the key (by its index where one covers the rows, else a scan of the key
    column), then the rows are taken by row id. A filter over wide columns (vectors, JPEG bytes)
    would read those columns for every row it scans; a take reads them for the matches only."""
    flt = where_all(where_in(key, ids), where)
    cols = list(columns)
    meta = [c for c in ("_rowid", "_rowaddr") if c in cols]  # row id / address columns, asked for by name
    found = ds.to_table(columns=[key], filter=flt, with_row_id=True, with_row_address="_rowaddr" in meta)
    if found.num_rows == 0:
        return pa.schema([found.schema.field(c) if c in meta else ds.schema.field(c) for c in cols]).empty_table()
    if set(cols) <= {key, *meta}:
        return found.select(cols)
    # ``_take_rows`` is Lance's take by row id (what its own index lookups use); it keeps the order
    rows = take_rows(ds, found.column("_rowid").combine_chunks(), [c for c in cols if c not in meta])
    for c in meta:
        rows = rows.append_column(c, found.column(c))
    return rows.select(cols)


def open_pinned(manifest: Mapping[str, Any] | Any, storage_options: dict[str, str] | None = None,
                cache_bytes: int | None = None) -> lance.LanceDataset:
    """The Lance version a manifest (subset or shard set) was read from.

    ``manifest`` is a mapping or an object with ``lance_uri`` and ``lance_version``. ``cache_bytes``
    bounds the handle's index cache and its metadata cache each (Lance's defaults: 6 GB and 1 GB,
    which a long run of lookups by id fills with every index page it touches).
    """
    get = manifest.get if isinstance(manifest, Mapping) else lambda k: getattr(manifest, k, None)
    uri, version = get("lance_uri"), get("lance_version")
    if not uri or version is None:
        raise ValueError(f"manifest {get('subset_id') or get('shard_set_id') or manifest!r} names no Lance "
                         "uri/version; it was not written by prx_assets")
    caches = {} if cache_bytes is None else {"index_cache_size_bytes": cache_bytes, "metadata_cache_size_bytes": cache_bytes}
    try:
        return lance.dataset(uri, version=int(version), storage_options=storage_options, **caches)
    except ValueError:  # an erasure removed the version and moved its pin (see core/lab/purge.py)
        moved = moved_pin(uri, int(version), storage_options)
        if moved is None:
            raise
        return lance.dataset(uri, version=moved, storage_options=storage_options, **caches)


def moved_pin(uri: str, version: int, storage_options: dict[str, str] | None = None) -> int | None:
    """The version a pin of ``version`` (a ``...-v<version>`` tag, as subsets pin) now names, when an
    erasure moved it past removed versions (:mod:`prx_assets.core.lab.purge`); ``None`` when no tag
    pinned it."""
    tags = lance.dataset(uri, storage_options=storage_options).tags.list()
    return next((int(t["version"]) for name, t in tags.items() if name.endswith(f"-v{version}")), None)
