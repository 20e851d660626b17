"""Persist curated subsets: ids pinned to a Lance version, idempotent and addressed by content.

A subset lives at ``<data root>/curated/<recipe>/<subset id>/`` with ``ids.parquet`` (the
selected image ids) and ``subset.json`` (recipe, recipe hash, Lance URI and version, drop
counts, buckets). The subset id is ``v<lance version>-<recipe hash>``: the same recipe on
the same version always lands at the same place with the same content. The Lance version
is tagged ``subset-<recipe>-v<version>`` so maintenance never removes it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import lance
import pyarrow as pa
import pyarrow.parquet as pq

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.curate.selection import Subset, summary
from prx_assets.core.lab.sync import tag_version


@dataclass(frozen=True)
class StoredSubset:
    """Where a subset was written."""

    subset_id: str
    uri: str
    tag: str
    manifest: dict[str, Any]


def subset_id(version: int, recipe: Recipe) -> str:
    """``v<version>-<recipe hash>``."""
    return f"v{version}-{recipe.recipe_hash()}"


def write_subset(root: DataRoot, ds: lance.LanceDataset, recipe: Recipe, subset: Subset) -> StoredSubset:
    """Write ids and manifest (ids first, manifest last: a manifest means a complete subset) and tag."""
    sid = subset_id(subset.version, recipe)
    buf = io.BytesIO()
    pq.write_table(pa.table({"image_id": pa.array(subset.image_ids, pa.string())}), buf)
    root.write_bytes(layout.subset_ids(recipe.name, sid), buf.getvalue())
    tag = f"subset-{recipe.name}-v{subset.version}"
    tag_version(ds, tag, subset.version)
    manifest = {**summary(subset), "subset_id": sid, "recipe_hash": recipe.recipe_hash(),
                "lance_version": subset.version,
                "lance_uri": ds.uri, "lance_tag": tag, "ids": root.join(layout.subset_ids(recipe.name, sid))}
    root.write_bytes(layout.subset_manifest(recipe.name, sid), json.dumps(manifest, indent=1, sort_keys=True).encode())
    return StoredSubset(subset_id=sid, uri=root.join(layout.subset_dir(recipe.name, sid)), tag=tag, manifest=manifest)


def read_subset(root: DataRoot, recipe: str, sid: str) -> tuple[dict[str, Any], list[str]]:
    """The manifest and ids of a stored subset."""
    manifest = json.loads(root.read_bytes(layout.subset_manifest(recipe, sid)))
    ids = pq.read_table(io.BytesIO(root.read_bytes(layout.subset_ids(recipe, sid)))).column("image_id").to_pylist()
    return manifest, ids
