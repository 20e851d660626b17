"""Lance: rows by row id, and the storage options a dataset was opened with.

``LanceDataset._take_rows`` reads given rows of a dataset by row id (``_rowid``), with only the
asked columns, the way Lance's own indexes hand rows back; ``take`` reads by position, which
changes with every deletion. No public method does this in pylance 14 (lance-format/lance#3938
and #6200, open: the maintainers agree to make it public). The storage options live on the
dataset as ``_storage_options``; reopening it at a newer version with the same credentials needs
them (no public accessor; same upstream state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prx_assets.compat import guard

CHECKED = ">=14,<15"
UPSTREAM = "lance-format/lance#3938"


def take_rows(dataset: Any, row_ids: Any, columns: Sequence[str] | None = None) -> Any:
    """The rows of ``dataset`` with row ids ``row_ids`` (a pyarrow array or list), as a pyarrow
    table of ``columns`` in the order asked."""
    guard("pylance", CHECKED, "take_rows (rows by row id)", UPSTREAM)
    return dataset._take_rows(row_ids, columns=list(columns) if columns is not None else None)


def storage_options(dataset: Any) -> dict[str, str] | None:
    """The storage options ``dataset`` was opened with (``None`` for a local one)."""
    guard("pylance", CHECKED, "storage_options (reopen a dataset)", UPSTREAM)
    return getattr(dataset, "_storage_options", None)
