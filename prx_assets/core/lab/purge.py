"""Erasure in the lab: the rows of erased images deleted from every table, and their bytes with them.

A Lance delete only marks rows in a deletion file; the bytes stay in the data file, in every
older version and in every tagged one. A purge therefore, table by table and under the lab lease:

1. deletes the rows whose ``image_id`` is erased (chunked ``IN`` lists, one commit per table);
2. compacts every fragment that has a deletion (``materialize_deletions_threshold=0``), so the
   data files that held the rows are rewritten without them;
3. moves every tag that pins a version from before the purge (``published``, a curated subset's
   pin) to the purged version: whoever reads by tag reads the same rows less the erased ones;
4. removes every version older than ``retention`` with its unreferenced files (Lance's
   ``cleanup_old_versions``); with a retention above zero the bytes stay in the versions it
   keeps until a later purge or maintenance run removes them, and the report says until when.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.maintenance import lance_tables
from prx_assets.core.lab.sql import chunks, where_in
from prx_assets.core.lab.table import open_table
from prx_assets.core.leases import LAB_LEASE, Lease

#: Ids per ``IN`` list of a delete.
DELETE_CHUNK = 1024


@dataclass
class TablePurge:
    """What a purge did to one lab table."""

    table: str
    rows_deleted: int = 0
    version_before: int = 0
    version_after: int = 0
    fragments_rewritten: int = 0
    tags_moved: list[str] = field(default_factory=list)
    versions_removed: int = 0
    bytes_removed: int = 0
    #: Versions still holding the rows until this time (UTC, ISO 8601); ``None``: none kept.
    bytes_kept_until: str | None = None


def purge_table(root: DataRoot, name: str, ids: Sequence[str], retention: timedelta) -> TablePurge | None:
    """Purge ``ids`` from lab table ``name`` (see the module docs); ``None`` when the table has no
    ``image_id`` column or none of the ids."""
    ds = open_table(root.join(layout.table(name)), root.storage_options())
    if ds is None or "image_id" not in ds.schema.names:
        return None
    out = TablePurge(table=name, version_before=ds.version, version_after=ds.version)
    for part in chunks(list(ids), DELETE_CHUNK):
        where = where_in("image_id", part)
        n = ds.count_rows(filter=where)
        if n:
            ds.delete(where)
            out.rows_deleted += n
    if not out.rows_deleted:
        return None
    metrics = ds.optimize.compact_files(materialize_deletions=True, materialize_deletions_threshold=0.0)
    out.fragments_rewritten = int(getattr(metrics, "fragments_removed", 0))
    purged_at = ds.version
    for tag, info in dict(ds.tags.list()).items():
        if int(info["version"]) < purged_at:
            ds.tags.update(tag, purged_at)
            out.tags_moved.append(tag)
    stats = ds.cleanup_old_versions(older_than=retention, delete_unverified=retention == timedelta(0),
                                    error_if_tagged_old_versions=False)
    out.versions_removed = int(getattr(stats, "old_versions", 0))
    out.bytes_removed = int(getattr(stats, "bytes_removed", 0))
    out.version_after = ds.version
    if retention > timedelta(0):
        out.bytes_kept_until = (datetime.now(UTC) + retention).isoformat(timespec="seconds")
    return out


def purge_lab(root: DataRoot, ids: Sequence[str], retention: timedelta = timedelta(0)) -> list[dict[str, Any]]:
    """Purge ``ids`` from every lab table, holding the lab lease (no lab sync or maintenance
    rewrites the same fragments meanwhile); one report per table that held any of them."""
    out = []
    with Lease(root, LAB_LEASE):
        for name in lance_tables(root):
            done = purge_table(root, name, ids, retention)
            if done is not None:
                out.append(asdict(done))
    return out
