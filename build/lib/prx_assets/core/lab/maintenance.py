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
    if ds.describe_indices():
        ds.optimize.optimize_indices()
        rep.indexes_optimized = len(ds.describe_indices())
    stats = ds.cleanup_old_versions(older_than=older_than, error_if_tagged_old_versions=False)
    rep.versions_removed = int(getattr(stats, "old_versions", 0))
    rep.bytes_removed = int(getattr(stats, "bytes_removed", 0))
    rep.fragments_after = len(ds.get_fragments())
    rep.version_after = ds.version
    return rep


def maintain(root: DataRoot, target_rows_per_fragment: int = 1024 * 1024,
             older_than: timedelta = timedelta(days=7)) -> list[MaintenanceReport]:
    """Maintain every Lance table under the data root."""
    out = []
    for name in lance_tables(root):
        rep = maintain_table(root, name, target_rows_per_fragment, older_than)
        if rep is not None:
            out.append(rep)
    return out
