"""Querying the lab: filters with pushdown, vector and full-text search, time travel, plans.

Importable for notebooks::

    from prx_assets.core.lab.query import open_lab, query
    ds = open_lab()                                   # $PRX_DATA_ROOT, latest version
    query(ds, where="width >= 1024 AND source = 'photos'", columns=["image_id", "width"])
    query(ds, near="5b5d8d8b4c9b1a8f", k=5)           # nearest images by embedding
    query(ds, text="red car", columns=["image_id"])   # full-text over a caption column
    print(query(ds, where="height > 2000", explain=True).plan)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa

from prx_assets.core.config.project import data_root
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.schema import IMAGES_TABLE
from prx_assets.core.lab.sql import where_eq
from prx_assets.core.lab.sync import CAPTION_PREFIX, EMBEDDING_PREFIX
from prx_assets.core.lab.table import table_uri
from prx_assets.errors import PrxError

DEFAULT_COLUMNS = ("image_id", "source", "width", "height", "aspect_bucket", "uri")


class QueryError(PrxError):
    """A query that cannot run: bad predicate, unknown column, missing version or tag."""


def open_lab(root: DataRoot | str | None = None, version: int | None = None,
             tag: str | None = None) -> lance.LanceDataset:
    """Open the images table, optionally at a version number or tag."""
    r = root if isinstance(root, DataRoot) else DataRoot(root or data_root())
    uri = table_uri(r, IMAGES_TABLE)
    try:
        return lance.dataset(uri, version=tag if tag is not None else version,
                             storage_options=r.storage_options())
    except (ValueError, OSError) as e:
        what = f"tag {tag!r}" if tag is not None else f"version {version}" if version is not None else "table"
        raise QueryError(f"cannot open {what} of {uri}: {e}; run `prx-assets run` to build the lab, "
                         "or list versions with `prx-assets query --versions`") from None


@dataclass
class QueryResult:
    """Rows (or a plan) plus what the scan cost."""

    table: pa.Table
    plan: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def _columns_for(ds: lance.LanceDataset, columns: Sequence[str] | None) -> list[str]:
    names = ds.schema.names
    cols = list(columns) if columns else [c for c in DEFAULT_COLUMNS if c in names]
    unknown = [c for c in cols if c not in names]
    if unknown:
        raise QueryError(f"unknown columns {unknown}; the table has: {', '.join(names)}")
    return cols


def _single(ds: lance.LanceDataset, prefix: str, column: str | None, what: str) -> str:
    names = [c for c in ds.schema.names if c.startswith(prefix)]
    if column:
        if column not in ds.schema.names:
            raise QueryError(f"unknown {what} column {column!r}; available: {names or 'none'}")
        return column
    if not names:
        raise QueryError(f"the table has no {what} column yet; materialize lance_table after "
                         f"{'image_embeddings' if prefix == EMBEDDING_PREFIX else 'recaptions'}")
    return names[0]


def query(ds: lance.LanceDataset, where: str | None = None, columns: Sequence[str] | None = None,
          limit: int | None = None, near: str | None = None, k: int = 10, vector_column: str | None = None,
          text: str | None = None, text_column: str | None = None, explain: bool = False,
          nprobes: int = 20, refine_factor: int = 10) -> QueryResult:
    """Run one query against the lab.

    Parameters
    ----------
    where:
        SQL predicate pushed down to Lance (scalar indexes are used where they exist).
    near:
        An ``image_id``: return its ``k`` nearest images by embedding (cosine), with
        ``_distance``; IVF_PQ with refine when indexed, exact otherwise.
    text:
        Full-text query over a caption column (``text_column`` or the first one), with ``_score``.
    explain:
        Also return the physical plan (shows ``ScalarIndexQuery`` when an index is used).

    Raises
    ------
    QueryError
        Naming the bad predicate, the unknown column, or the missing image.
    """
    cols = _columns_for(ds, columns)
    kwargs: dict[str, Any] = {"columns": cols, "filter": where, "limit": limit}
    if near is not None:
        vcol = _single(ds, EMBEDDING_PREFIX, vector_column, "embedding")
        row = ds.to_table(columns=[vcol], filter=where_eq("image_id", near))
        if row.num_rows == 0 or row.column(0)[0].as_py() is None:
            raise QueryError(f"image_id {near!r} not found or has no {vcol} vector")
        kwargs["nearest"] = {"column": vcol, "q": row.column(0)[0].values.to_numpy(), "k": k,
                             "nprobes": nprobes, "refine_factor": refine_factor}
        kwargs["limit"] = None
    if text is not None:
        tcol = _single(ds, CAPTION_PREFIX, text_column, "caption")
        kwargs["full_text_query"] = {"query": text, "columns": [tcol]}
        kwargs["columns"] = [*cols, "_score"]
    stats: dict[str, Any] = {}

    def collect(s: Any) -> None:
        stats.update({"rows_scanned": s.all_counts.get("rows_scanned"), "bytes_read": s.bytes_read,
                      "iops": s.iops, "index_comparisons": s.index_comparisons})

    try:
        scanner = ds.scanner(**kwargs, scan_stats_callback=collect)
        plan = scanner.explain_plan(verbose=True) if explain else None
        table = scanner.to_table()
    except (ValueError, OSError, RuntimeError) as e:
        msg = str(e).split(", /")[0]
        subject = f"predicate {where!r}" if where else "query"
        raise QueryError(f"{subject} failed: {msg}. Columns: {', '.join(ds.schema.names)}") from None
    stats["table_rows"] = ds.count_rows()
    return QueryResult(table=table, plan=plan, stats=stats)


def versions(ds: lance.LanceDataset) -> list[dict[str, Any]]:
    """Versions of the table with their tags."""
    tags: dict[int, list[str]] = {}
    for name, t in ds.tags.list().items():
        tags.setdefault(t["version"], []).append(name)
    return [{"version": v["version"], "timestamp": str(v["timestamp"]), "tags": tags.get(v["version"], [])}
            for v in ds.versions()]
