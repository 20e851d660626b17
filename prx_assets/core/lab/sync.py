"""The lab: the ``images`` Lance table with captions and embeddings joined in as columns.

Captions (one column ``caption__<captioner id>`` per captioner) and embeddings
(``emb__<embedder id>``) are added with Lance schema evolution: a new column is filled in the
table's row order by ``add_columns`` (one data file per fragment for that column only), and
changed values are written per fragment (``update_columns`` joined by row id, one ``Update``
commit) or, for a few rows of a large fragment, as whole rows. The JPEG bytes and every other
column are never rewritten in place. After the first sync of a
column, later syncs join only the source rows written since (Lance row versions, see
:mod:`prx_assets.core.lab.changes`): a sync costs what changed, not what exists.

Indexes are created when missing and folded forward incrementally
(``optimize_indices``) once more than ``FOLD_ABOVE`` of the rows are unindexed: BTREE on ids, hashes and numeric metadata, BITMAP on
low-cardinality columns, INVERTED (full text) on caption columns, and IVF_PQ on
embedding columns once the table has ``vector_index_min_rows`` rows (below that, vector
search is exact). Every sync moves the ``published`` tag to the version it produced.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.faults import crash_point
from prx_assets.core.lab.changes import (
    CreatedRows,
    SyncState,
    changed_rows,
    compare_and_write,
    cursor_for,
    fill_new_column,
    full_differences,
    write_changed,
)
from prx_assets.core.lab.schema import CAPTIONS_TABLE, IMAGES_TABLE, embeddings_table
from prx_assets.core.lab.sql import where_eq
from prx_assets.core.lab.table import dataset_size, index_coverage, open_table, table_uri
from prx_assets.core.leases import LAB_LEASE, Lease

#: A full comparison writes the differences it has gathered once they hold this many bytes.
FULL_WRITE_BYTES = 256 * 1024 * 1024
CAPTION_PREFIX = "caption__"
EMBEDDING_PREFIX = "emb__"
PUBLISHED_TAG = "published"

SCALAR_INDEXES: dict[str, str] = {
    "image_id": "BTREE", "sha256": "BTREE", "phash": "BTREE", "width": "BTREE", "height": "BTREE",
    "orig_bytes": "BTREE", "jpeg_bytes": "BTREE", "aspect_ratio": "BTREE",
    "source": "BITMAP", "batch": "BITMAP", "aspect_bucket": "BITMAP", "orig_format": "BITMAP",
    "license": "BITMAP",
}



def _ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def caption_column(captioner_id: str) -> str:
    """Column holding one captioner's captions.

    >>> caption_column("detailed-9591dd3a")
    'caption__detailed_9591dd3a'
    """
    return CAPTION_PREFIX + _ident(captioner_id)


def embedding_column(embedder_id: str) -> str:
    """Column holding one embedder's vectors."""
    return EMBEDDING_PREFIX + _ident(embedder_id)


@dataclass
class LabSync:
    """What one sync did and what the table looks like afterwards."""

    version: int = 0
    input_version: int = 0  # the images table's version when the sync started
    rows: int = 0
    fragments: int = 0
    size_bytes: int = 0
    columns_added: list[str] = field(default_factory=list)
    rows_updated: dict[str, int] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)  # column -> "changes" (by row versions) or "full"
    seconds: dict[str, float] = field(default_factory=dict)  # "join", "indexes", "stats"
    indexes_created: list[str] = field(default_factory=list)
    indexes: list[dict[str, Any]] = field(default_factory=list)
    tags: dict[str, int] = field(default_factory=dict)


def sync_column(images: lance.LanceDataset, source: lance.LanceDataset, column: str, field_type: pa.DataType,
                value: str, where: str | None, state: SyncState) -> tuple[bool, int, str]:
    """Make ``images[column]`` equal the source's ``value`` per image where they differ.

    A missing column is added filled from the source, fragment by fragment (one commit, no
    other column touched). With a cursor in ``state`` only the
    source rows written since are compared, a chunk at a time (see
    :mod:`prx_assets.core.lab.changes`); otherwise the whole column is compared in Arrow.
    Only rows whose value changed are rewritten. Returns ``(added, rows_updated, mode)``.
    """
    if column not in images.schema.names:  # a new column: filled fragment by fragment, one commit
        return True, fill_new_column(images, source, column, field_type, value, where), "full"
    since = cursor_for(state, column, source, images)
    added = False
    updated = 0
    if since is None:
        # A full comparison (no cursor): two sequential scans into key/digest arrays, then the rows
        # that differ, written together up to FULL_WRITE_BYTES at a time (each write costs a pass over
        # the table's keys, so one per small part would make it grow with the table times the parts).
        pending: list[pa.Table] = []
        for part in full_differences(source, value, where, images, column, field_type):
            pending.append(part)
            if sum(t.nbytes for t in pending) > FULL_WRITE_BYTES:
                updated += write_changed(images, column, pa.concat_tables(pending))
                pending = []
        if pending:
            updated += write_changed(images, column, pa.concat_tables(pending))
        return added, updated, "full"
    got = sync_changes(images, [(column, field_type,
                                 changed_rows(source, value, where, since, images, state.images_version))])
    return added, got[column], "changes"


#: Bytes of source values gathered from every column's changes before they are compared and written
#: together (an image whose caption and vector changed is then read and rewritten once).
COMBINE_BYTES = 512 * 1024 * 1024


def sync_changes(images: lance.LanceDataset, jobs: Sequence[tuple[str, pa.DataType, Iterator[pa.Table]]],
                 budget: int = COMBINE_BYTES) -> dict[str, int]:
    """Compare and write the changes of several columns together (``(column, type, image_id/value
    parts)`` each): parts are gathered up to ``budget`` bytes, then compared with the lab in one
    lookup and written in one pass (:func:`~prx_assets.core.lab.changes.compare_and_write`).
    Returns rows updated per column."""
    updated = {col: 0 for col, _, _ in jobs}
    pending: dict[str, tuple[pa.DataType, list[pa.Table]]] = {}
    size = 0

    def flush() -> None:
        nonlocal size
        if pending:
            got = compare_and_write(images, {c: (ft, pa.concat_tables(parts)) for c, (ft, parts) in pending.items()})
            for c, n in got.items():
                updated[c] += n
        pending.clear()
        size = 0

    for col, ftype, parts in jobs:
        for part in parts:
            pending.setdefault(col, (ftype, []))[1].append(part)
            size += part.nbytes
            if size > budget:
                flush()
    flush()
    return updated


def _without_centroids() -> None:
    # Lance's vector index statistics include centroids unless told otherwise; we never need them.
    # Read by Lance when statistics are computed, so setting it before the first call suffices.
    os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")


#: Unindexed share of the rows, or count of rows, past which a sync folds them into an index (below
#: it, the ``lance_maintenance`` job does; queries still see every row meanwhile, by scanning the
#: rest). A fold adds a delta segment covering only the unindexed rows, so it costs what changed;
#: the maintenance job merges the segments.
FOLD_ABOVE = 0.05
FOLD_ABOVE_ROWS = 1_000_000


def ensure_indexes(ds: lance.LanceDataset, vector_index_min_rows: int = 10_000,
                   fold_above: float = FOLD_ABOVE) -> list[str]:
    """Create missing indexes, then fold unindexed rows into the existing indexes that have more
    than ``fold_above`` of the rows (or ``FOLD_ABOVE_ROWS``) unindexed, each as a new delta segment
    over those rows only (0.38 s for 30,000 rows into 14 indexes of a 1M-row lab, against 13.2 s to
    merge them into the existing segments; the maintenance job merges segments). Returns created
    names."""
    _without_centroids()
    existing = {tuple(ix.field_names) for ix in ds.describe_indices()}
    created = []
    names = set(ds.schema.names)
    rows = ds.count_rows()
    if rows == 0:
        return created
    for col, kind in SCALAR_INDEXES.items():
        if col in names and (col,) not in existing:
            ds.create_scalar_index(col, kind)
            created.append(f"{col}:{kind}")
    for col in sorted(names):
        if col.startswith(CAPTION_PREFIX) and (col,) not in existing:
            ds.create_scalar_index(col, "INVERTED")
            created.append(f"{col}:INVERTED")
        if col.startswith(EMBEDDING_PREFIX) and (col,) not in existing and rows >= vector_index_min_rows:
            indexed = ds.count_rows(filter=f"{col} IS NOT NULL")
            if indexed < vector_index_min_rows:
                continue
            dim = ds.schema.field(col).type.list_size
            sub = next(s for s in (dim // 16, dim // 8, dim // 4, 1) if s >= 1 and dim % s == 0)
            ds.create_index(col, index_type="IVF_PQ", num_partitions=max(1, int(math.sqrt(indexed))),
                            num_sub_vectors=sub, metric="cosine")
            created.append(f"{col}:IVF_PQ")
    bound = min(fold_above * rows, FOLD_ABOVE_ROWS)
    stale = [ix["name"] for ix in index_coverage(ds) if ix["name"] not in created_names(ds, created)
             and ix["unindexed_rows"] > bound]
    if stale:  # index the rows written since, as a new delta segment (merging rewrites the whole index)
        ds.optimize.optimize_indices(index_names=stale, num_indices_to_merge=0)
    return created


def created_names(ds: lance.LanceDataset, created: Sequence[str]) -> set[str]:
    """Index names of the ``column:KIND`` entries just created (they are current)."""
    cols = {c.split(":", 1)[0] for c in created}
    return {ix.name for ix in ds.describe_indices() if set(ix.field_names) <= cols}


def tag_version(ds: lance.LanceDataset, tag: str, version: int, attempts: int = 5) -> None:
    """Point ``tag`` at ``version`` (create or move). Processes that tag at once (runs cutting the same
    subset) race between reading the tags and writing one: a write that finds the tag created or moved
    meanwhile reads the tags again and retries, so the tag ends at a version one of them asked for."""
    for attempt in range(attempts):
        tags = ds.tags.list()
        try:
            if tag not in tags:
                ds.tags.create(tag, version)
            elif tags[tag]["version"] != version:
                ds.tags.update(tag, version)
            return
        except (ValueError, OSError, RuntimeError) as e:
            text = str(e).lower()
            if attempt == attempts - 1 or not any(w in text for w in ("conflict", "already exists", "not found")):
                raise


def sync_lab(root: DataRoot, captioner_ids: Sequence[str] | None = None,
             embedder_ids: Sequence[str] = (), vector_index_min_rows: int = 10_000,
             publish: bool = True) -> LabSync:
    """Join captions and embeddings into the images table, index it, tag the version.

    Parameters
    ----------
    captioner_ids:
        Captioners whose captions become columns; ``None`` means every captioner found in
        the captions table.
    embedder_ids:
        Embedders whose vectors become columns.
    """
    with Lease(root, LAB_LEASE):  # one sync at a time: two would compare and rewrite the same rows
        return _sync_lab(root, captioner_ids, embedder_ids, vector_index_min_rows, publish)


def _sync_lab(root: DataRoot, captioner_ids: Sequence[str] | None, embedder_ids: Sequence[str],
              vector_index_min_rows: int, publish: bool) -> LabSync:
    opts = root.storage_options()
    images = open_table(table_uri(root, IMAGES_TABLE), opts)
    out = LabSync()
    if images is None:
        return out
    out.input_version = images.version
    started = time.perf_counter()
    state = SyncState.read(root)
    synced = SyncState(columns=dict(state.columns), images_version=images.version)
    jobs: list[tuple[lance.LanceDataset, str, pa.DataType, str, str | None]] = []
    captions = open_table(table_uri(root, CAPTIONS_TABLE), opts)
    if captions is not None:
        ids = list(captioner_ids) if captioner_ids is not None else sorted(
            pc.unique(captions.to_table(columns=["captioner_id"]).column("captioner_id")).to_pylist())
        jobs += [(captions, caption_column(cid), pa.string(), "caption", where_eq("captioner_id", cid))
                 for cid in ids]
    for eid in embedder_ids:
        emb = open_table(table_uri(root, embeddings_table(eid)), opts)
        if emb is not None:
            jobs.append((emb, embedding_column(eid), emb.schema.field("embedding").type, "embedding", None))
    deferred: list[tuple[str, pa.DataType, Iterator[pa.Table]]] = []
    created: CreatedRows | None = None  # images created since the last sync: one scan for every column
    for source, col, field_type, value, where in jobs:
        since = cursor_for(state, col, source, images) if col in images.schema.names else None
        if since is not None:  # by change: compared and written together with the other columns' changes
            if created is None and state.images_version is not None:
                created = CreatedRows.scan(images, state.images_version)
            deferred.append((col, field_type, changed_rows(source, value, where, since, images,
                                                           state.images_version, created=created)))
            out.modes[col] = "changes"
            synced.columns[col] = source.version
            continue
        added, n, mode = sync_column(images, source, col, field_type, value, where, state)
        if added:
            out.columns_added.append(col)
        out.rows_updated[col] = n
        out.modes[col] = mode
        synced.columns[col] = source.version
        crash_point("lab.after_column")
    if deferred:
        out.rows_updated.update(sync_changes(images, deferred))
        crash_point("lab.after_column")
    if synced != state:
        synced.write(root)  # after the commits: a crash before this only repeats the comparison
    out.seconds["join"] = round(time.perf_counter() - started, 3)
    crash_point("lab.before_indexes")
    started = time.perf_counter()
    out.indexes_created = ensure_indexes(images, vector_index_min_rows)
    out.seconds["indexes"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    images = lance.dataset(images.uri, storage_options=opts)  # latest version after all commits
    if publish:
        tag_version(images, PUBLISHED_TAG, images.version)
    out.version = images.version
    out.rows = images.count_rows()
    fragments = images.get_fragments()
    out.fragments = len(fragments)
    out.size_bytes = dataset_size(images)
    out.indexes = index_coverage(images, fragments)
    out.tags = {k: v["version"] for k, v in images.tags.list().items()}
    out.seconds["stats"] = round(time.perf_counter() - started, 3)
    return out
