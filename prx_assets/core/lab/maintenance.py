"""Lance maintenance: compact small fragments, optimize indexes, clean up old versions.

Tagged versions (``published``, the version each curated subset pins) survive cleanup;
untagged versions older than ``older_than`` are removed with their unreferenced files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.schema import IMAGES_SCHEMA, IMAGES_TABLE, REJECTS_SCHEMA, REJECTS_TABLE
from prx_assets.core.lab.table import apply_encodings, index_coverage, open_table
from prx_assets.core.leases import LAB_LEASE, Lease


@dataclass
class MaintenanceReport:
    """What maintenance did to one table."""

    table: str
    fragments_before: int
    fragments_after: int
    version_before: int
    version_after: int
    fragments_removed: int = 0
    fragments_added: int = 0
    files_removed: int = 0
    versions_removed: int = 0
    bytes_removed: int = 0
    indexes_optimized: int = 0
    #: Column encodings the table's schema sets and the table lacked, set before compacting
    #: (see :func:`~prx_assets.core.lab.table.apply_encodings`).
    encodings_applied: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for metadata."""
        return dict(self.__dict__)


#: Past this many fragments left to compact (see ``settled_fragments``) a table is compacted (ingest
#: appends one or more per batch).
MAX_FRAGMENTS = 256
#: Past this share of a table's rows outside an index, indexes are optimized.
MAX_UNINDEXED_SHARE = 0.10
#: Past this many segments in one index (a lab sync folds new rows as a delta segment), indexes are merged.
MAX_SEGMENTS = 8
#: Rows per fragment compaction aims at (Lance's default).
TARGET_ROWS_PER_FRAGMENT = 1024 * 1024
#: A fragment holding at least this share of the compaction target's rows, with deletions under
#: ``DELETIONS_SHARE``, is left as it is: compaction merges the small fragments (ingest partitions,
#: lab-sync deltas) rather than rewriting a table of 250k-row fragments whole to make them 1M.
LARGE_FRAGMENT_SHARE = 0.2
#: A fragment with more than this share of its rows deleted is rewritten whatever its size (Lance's own
#: default threshold for materializing deletions).
DELETIONS_SHARE = 0.10
#: The most source bytes one maintenance run compacts; the rest is left to the next run, so one run's
#: extra disk (old files stay until cleanup) and time are bounded by this, not by the table.
MAX_COMPACTION_BYTES = 16 * 1024**3


@dataclass
class TableHealth:
    """What maintenance bounds, read from a table's manifest (no data or index file read)."""

    table: str
    version: int
    rows: int
    fragments: int
    unindexed_rows: int  # the most rows any one index does not cover
    segments: int = 1  # the most segments of any one index
    compactable: int | None = None  # fragments compaction would take (None: all of them)

    def needs_maintenance(self, max_fragments: int | None = None,
                          max_unindexed_share: float | None = None) -> str | None:
        """Why this table is past its bounds (``MAX_FRAGMENTS``, ``MAX_UNINDEXED_SHARE`` unless
        given), or ``None``."""
        max_fragments = MAX_FRAGMENTS if max_fragments is None else max_fragments
        max_unindexed_share = MAX_UNINDEXED_SHARE if max_unindexed_share is None else max_unindexed_share
        small = self.fragments if self.compactable is None else self.compactable
        if small > max_fragments:
            return f"{self.table}: {small} fragments to compact > {max_fragments}"
        if self.rows and self.unindexed_rows > max_unindexed_share * self.rows:
            return (f"{self.table}: {self.unindexed_rows} of {self.rows} rows outside an index "
                    f"> {max_unindexed_share:.0%}")
        if self.segments > MAX_SEGMENTS:
            return f"{self.table}: an index of {self.segments} segments > {MAX_SEGMENTS}"
        return None


def table_health(root: DataRoot, name: str) -> TableHealth | None:
    """Fragments, rows and unindexed rows of one table (``None`` if it does not exist)."""
    ds = open_table(root.join(layout.table(name)), root.storage_options())
    if ds is None:
        return None
    fragments = ds.get_fragments()
    coverage = index_coverage(ds, fragments)
    unindexed = max((ix["unindexed_rows"] for ix in coverage), default=0)
    segments = max((ix["segments"] for ix in coverage), default=1)
    return TableHealth(table=name, version=ds.version, rows=ds.count_rows(), fragments=len(fragments),
                       unindexed_rows=unindexed, segments=segments,
                       compactable=len(fragments) - len(settled_fragments(fragments)))


def lance_tables(root: DataRoot) -> list[str]:
    """Names of the Lance tables under the data root (one listing level: the table folders, not
    every version, fragment and index file inside them)."""
    return sorted(n for n in (layout.table_name(f) for f in root.folders(layout.LANCE_DIR)) if n)


def settled_fragments(fragments: list[Any], target_rows_per_fragment: int = TARGET_ROWS_PER_FRAGMENT) -> list[int]:
    """Ids of the ``fragments`` (a dataset's ``get_fragments()``) compaction leaves alone: large
    enough (``LARGE_FRAGMENT_SHARE`` of the target) and with few deletions (``DELETIONS_SHARE``).
    Read from the manifest, no data."""
    large = int(LARGE_FRAGMENT_SHARE * target_rows_per_fragment)
    out = []
    for frag in fragments:
        meta = frag.metadata
        physical = int(meta.physical_rows or 0)
        if physical >= large and meta.num_deletions <= DELETIONS_SHARE * physical:
            out.append(int(meta.id))
    return out


def _source_bytes(task: Any) -> int:
    return sum(int(f.file_size_bytes or 0) for frag in task.fragments for f in frag.files)


def compact_bounded(ds: Any, target_rows_per_fragment: int, max_bytes: int) -> Any:
    """Compact ``ds``, leaving :func:`settled_fragments` alone, in Lance's planned tasks taken in
    order until their source bytes pass ``max_bytes`` (at least one task: Lance's own
    ``max_source_bytes`` takes none when the first is larger). Returns Lance's metrics, or ``None``
    when nothing needed compacting."""
    from lance.optimize import Compaction

    plan = Compaction.plan(ds, {"target_rows_per_fragment": target_rows_per_fragment,
                                "materialize_deletions_threshold": DELETIONS_SHARE,
                                "excluded_fragment_ids": settled_fragments(ds.get_fragments(), target_rows_per_fragment)})
    rewrites, size = [], 0
    for task in plan.tasks:
        if rewrites and size + _source_bytes(task) > max_bytes:
            break
        size += _source_bytes(task)
        rewrites.append(task.execute(ds))
    return Compaction.commit(ds, rewrites) if rewrites else None


#: The tables whose schema this code defines (the others are the enrichment outputs, whose
#: schema depends on the models).
TABLE_SCHEMAS = {IMAGES_TABLE: IMAGES_SCHEMA, REJECTS_TABLE: REJECTS_SCHEMA}


def maintain_table(root: DataRoot, name: str, target_rows_per_fragment: int = TARGET_ROWS_PER_FRAGMENT,
                   older_than: timedelta = timedelta(days=7),
                   max_compaction_bytes: int = MAX_COMPACTION_BYTES) -> MaintenanceReport | None:
    """Compact, optimize indexes and clean up one table. Compaction merges small fragments and
    those with many deletions (:func:`settled_fragments` are left alone), at most
    ``max_compaction_bytes`` of them per run, so it costs what accumulated since the last run."""
    opts = root.storage_options()
    ds = open_table(root.join(layout.table(name)), opts)
    if ds is None:
        return None
    rep = MaintenanceReport(table=name, fragments_before=len(ds.get_fragments()), fragments_after=0,
                            version_before=ds.version, version_after=ds.version)
    schema = TABLE_SCHEMAS.get(name)
    if schema is not None:  # (for the writes to come: compaction itself keeps Lance's default encodings)
        rep.encodings_applied = apply_encodings(ds, schema)
    metrics = compact_bounded(ds, target_rows_per_fragment, max_compaction_bytes)
    rep.fragments_removed = int(getattr(metrics, "fragments_removed", 0))
    rep.fragments_added = int(getattr(metrics, "fragments_added", 0))
    rep.files_removed = int(getattr(metrics, "files_removed", 0))
    indexes = ds.describe_indices()
    if indexes:  # fold unindexed rows and merge every segment (lab syncs add delta segments) into one
        segments = max(len(getattr(ix, "segments", None) or [None]) for ix in indexes)
        ds.optimize.optimize_indices(num_indices_to_merge=max(1, segments))
        rep.indexes_optimized = len(indexes)
    stats = ds.cleanup_old_versions(older_than=older_than, error_if_tagged_old_versions=False)
    rep.versions_removed = int(getattr(stats, "old_versions", 0))
    rep.bytes_removed = int(getattr(stats, "bytes_removed", 0))
    rep.fragments_after = len(ds.get_fragments())
    rep.version_after = ds.version
    return rep


def maintain(root: DataRoot, target_rows_per_fragment: int = TARGET_ROWS_PER_FRAGMENT,
             older_than: timedelta = timedelta(days=7)) -> list[MaintenanceReport]:
    """Maintain every Lance table under the data root (holding the lab lease: a compaction and a lab
    sync rewriting the same fragments would make one of them retry its whole commit)."""
    out = []
    with Lease(root, LAB_LEASE):
        for name in lance_tables(root):
            rep = maintain_table(root, name, target_rows_per_fragment, older_than)
            if rep is not None:
                out.append(rep)
    return out
