"""Lance maintenance: compact small fragments, optimize indexes, clean up old versions.

Tagged versions (``published``, the version each curated subset pins) survive cleanup;
untagged versions older than ``older_than`` are removed with their unreferenced files.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.table import open_table
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

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for metadata."""
        return dict(self.__dict__)


#: Past this many fragments a table is compacted (ingest appends one or more per batch).
MAX_FRAGMENTS = 256
#: Past this share of a table's rows outside an index, indexes are optimized.
MAX_UNINDEXED_SHARE = 0.10
#: Past this many segments in one index (a lab sync folds new rows as a delta segment), indexes are merged.
MAX_SEGMENTS = 8


@dataclass
class TableHealth:
    """What maintenance bounds, read from a table's manifest and index statistics (no data scan)."""

    table: str
    version: int
    rows: int
    fragments: int
    unindexed_rows: int  # the most rows any one index does not cover
    segments: int = 1  # the most segments of any one index

    def needs_maintenance(self, max_fragments: int | None = None,
                          max_unindexed_share: float | None = None) -> str | None:
        """Why this table is past its bounds (``MAX_FRAGMENTS``, ``MAX_UNINDEXED_SHARE`` unless
        given), or ``None``."""
        max_fragments = MAX_FRAGMENTS if max_fragments is None else max_fragments
        max_unindexed_share = MAX_UNINDEXED_SHARE if max_unindexed_share is None else max_unindexed_share
        if self.fragments > max_fragments:
            return f"{self.table}: {self.fragments} fragments > {max_fragments}"
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
    unindexed, segments = 0, 1
    for ix in ds.describe_indices():
        segments = max(segments, len(getattr(ix, "segments", None) or [None]))
        try:
            unindexed = max(unindexed, int(ds.stats.index_stats(ix.name).get("num_unindexed_rows", 0)))
        except (KeyError, ValueError, RuntimeError):  # an index Lance cannot describe counts as covering nothing
            unindexed = ds.count_rows()
    return TableHealth(table=name, version=ds.version, rows=ds.count_rows(), fragments=len(ds.get_fragments()),
                       unindexed_rows=unindexed, segments=segments)


def lance_tables(root: DataRoot) -> list[str]:
    """Names of the Lance tables under the data root."""
    names = {layout.table_name(p.split("/")[1]) for p in root.list(layout.LANCE_DIR) if p.count("/") >= 2}
    return sorted(n for n in names if n)


def maintain_table(root: DataRoot, name: str, target_rows_per_fragment: int = 1024 * 1024,
                   older_than: timedelta = timedelta(days=7)) -> MaintenanceReport | None:
    """Compact, optimize indexes and clean up one table."""
    opts = root.storage_options()
    ds = open_table(root.join(layout.table(name)), opts)
    if ds is None:
        return None
    rep = MaintenanceReport(table=name, fragments_before=len(ds.get_fragments()), fragments_after=0,
                            version_before=ds.version, version_after=ds.version)
    metrics = ds.optimize.compact_files(target_rows_per_fragment=target_rows_per_fragment)
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


def maintain(root: DataRoot, target_rows_per_fragment: int = 1024 * 1024,
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
