"""Persist curated subsets: ids pinned to a Lance version, idempotent and addressed by content.

A subset lives at ``<data root>/curated/<recipe>/<subset id>/`` with ``ids.parquet`` (the
selected image ids) and ``subset.json`` (recipe, recipe hash, Lance URI and version, drop
counts, buckets). The subset id is the hash of its content (ids, original hashes, caption
texts; see :func:`prx_assets.core.curate.digests.content_hash`): a re-cut that selects the
same content lands at the same place and is not rewritten, whatever Lance version it was
read from. The Lance version (lineage, not identity) is tagged ``subset-<recipe>-v<version>``
so maintenance never removes it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import lance
import pyarrow as pa
import pyarrow.parquet as pq

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.curate.selection import Subset
from prx_assets.core.faults import crash_point
from prx_assets.core.lab.sync import tag_version
from prx_assets.core.manifests import SubsetManifest


@dataclass(frozen=True)
class StoredSubset:
    """Where a subset was written."""

    subset_id: str
    uri: str
    tag: str
    manifest: SubsetManifest
    reused: bool = False


def subset_id(subset: Subset) -> str:
    """The id of a subset: the hash of its content (not of the Lance version it was read from)."""
    if not subset.content_hash:
        raise ValueError(f"subset of recipe {subset.recipe!r} has no content hash; cut it with select()")
    return subset.content_hash


def write_subset(root: DataRoot, ds: lance.LanceDataset, recipe: Recipe, subset: Subset) -> StoredSubset:
    """Write ids and manifest (ids first, manifest last: a manifest means a complete subset) and tag.

    A subset with this content already written is reused as it is (same id, same pinned
    Lance version, nothing rewritten): ``StoredSubset.reused`` says so.
    """
    sid = subset_id(subset)
    if root.exists(layout.subset_manifest(recipe.name, sid)):
        manifest = read_subset_manifest(root, recipe.name, sid)
        return StoredSubset(subset_id=sid, uri=root.join(layout.subset_dir(recipe.name, sid)),
                            tag=manifest.lance_tag or "", manifest=manifest, reused=True)
    buf = io.BytesIO()
    pq.write_table(subset.selected.select(["image_id", "digest"]), buf)
    root.write_bytes(layout.subset_ids(recipe.name, sid), buf.getvalue())
    tag = f"subset-{recipe.name}-v{subset.version}"
    tag_version(ds, tag, subset.version)
    manifest = SubsetManifest(
        subset_id=sid, recipe=recipe.name, recipe_hash=recipe.recipe_hash(), lance_uri=ds.uri,
        lance_version=subset.version, lance_tag=tag, ids=root.join(layout.subset_ids(recipe.name, sid)),
        selected=subset.count, total=subset.total, dropped=dict(subset.dropped),
        buckets=dict(subset.buckets), caption_columns=tuple(subset.caption_columns),
        optout_requests=dict(subset.optout_dropped), version=subset.version, extra=dict(subset.lineage))
    crash_point("curate.before_manifest")
    root.write_bytes(layout.subset_manifest(recipe.name, sid), manifest.to_json())
    return StoredSubset(subset_id=sid, uri=root.join(layout.subset_dir(recipe.name, sid)), tag=tag, manifest=manifest)


def read_subset_manifest(root: DataRoot, recipe: str, sid: str) -> SubsetManifest:
    """The manifest of a stored subset."""
    rel = layout.subset_manifest(recipe, sid)
    return SubsetManifest.from_json(root.read_bytes(rel), root.join(rel))


def read_subset_table(root: DataRoot, recipe: str, sid: str) -> pa.Table:
    """``ids.parquet`` of a stored subset: ``image_id`` (and ``digest``, the per-image content digest,
    for subsets written since digests were kept), in id order."""
    return pq.read_table(io.BytesIO(root.read_bytes(layout.subset_ids(recipe, sid))))


def read_subset(root: DataRoot, recipe: str, sid: str) -> tuple[SubsetManifest, list[str]]:
    """The manifest and ids of a stored subset, the ids as a Python list (small subsets and tests; at
    scale read :func:`read_subset_table` and keep the ids as Arrow)."""
    manifest = read_subset_manifest(root, recipe, sid)
    ids = pq.read_table(io.BytesIO(root.read_bytes(layout.subset_ids(recipe, sid)))).column("image_id").to_pylist()
    return manifest, ids
