"""``prx-assets doctor --verify``: scrub the lab's stored images and every published shard set
against their digests, and with ``--repair`` take corrupt data out of use.

- Lab rows whose stored bytes no longer hash to ``stored_sha256`` are deleted; their batches are
  returned so that the caller re-materializes ``raw_images`` for them (ingest writes them again
  from the source; a file gone from its source becomes a reject row, with its reason).
- A shard set with a corrupt shard in any stream it reads is moved to
  ``mds/<recipe>/.quarantine/<set id>`` (kept as evidence, never read again); the recipes whose
  current set that was are returned so that the caller re-materializes ``mds_shards`` for them
  (the set is written whole again, under the same id when the subset is the same).
- A Lance data file that cannot be read at all is named with its fragment; it is not repaired
  here (``prx-assets run`` after restoring the file, or a re-ingest of its batches).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.schema import IMAGES_TABLE
from prx_assets.core.lab.scrub import scrub_images
from prx_assets.core.lab.sql import literal
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.manifests import ShardSetManifest
from prx_assets.core.publish.integrity import check_shard_set


@dataclass
class Verified:
    """What a verification found and, with repair, what must be materialized again."""

    lines: list[tuple[str, str, str, bool]] = field(default_factory=list)  # kind, where, detail, repaired
    batches: set[str] = field(default_factory=set)  # raw_images partitions to ingest again
    recipes: set[str] = field(default_factory=set)  # mds_shards partitions to publish again


def verify_lab(root: DataRoot, repair: bool, out: Verified) -> None:
    """Scrub the images table; with ``repair`` delete corrupt rows and note their batches."""
    ds = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
    if ds is None:
        return
    report = scrub_images(ds)
    for batch, ids in sorted(report.corrupt.items()):
        detail = (f"{len(ids)} stored images do not match their digest (e.g. {', '.join(ids[:3])})")
        if repair:
            for i in range(0, len(ids), 500):
                ds.delete(f"image_id IN ({', '.join(literal(x) for x in ids[i:i + 500])})")
            out.batches.add(batch)
            detail += "; deleted, ingested again from the source"
        out.lines.append(("corrupt_images", f"{IMAGES_TABLE}[{batch}]", detail, repair))
    for frag, error in sorted(report.unreadable.items()):
        out.lines.append(("unreadable_data_file", f"{IMAGES_TABLE} fragment {frag}",
                          f"{error}; restore the file, or re-ingest the batches it holds", False))
    if report.without_digest:
        out.lines.append(("unverified_images", IMAGES_TABLE,
                          f"{report.without_digest} rows written before digests were recorded: `prx-assets migrate` "
                          "records theirs", False))


def published_sets(root: DataRoot) -> list[ShardSetManifest]:
    """Every published shard set under the data root (one manifest per set folder)."""
    out = []
    for recipe in root.folders(layout.MDS_DIR):
        for set_id in root.folders(layout.recipe_shards_dir(recipe)):
            rel = layout.shard_set_manifest(recipe, set_id)
            if not set_id.startswith(".") and root.exists(rel):
                out.append(ShardSetManifest.from_json(root.read_bytes(rel).decode()))
    return out


def verify_sets(root: DataRoot, current: dict[str, str], repair: bool, out: Verified) -> None:
    """Hash every shard set's streams; with ``repair`` quarantine corrupt sets and note the recipes
    whose current set (``current``: recipe -> set id) was one of them."""
    for manifest in published_sets(root):
        corrupt = [c for check in check_shard_set(manifest) for c in check.corrupt]
        if not corrupt:
            continue
        where = layout.shard_set_dir(manifest.recipe, manifest.shard_set_id)
        detail = f"{len(corrupt)} corrupt shard files, e.g. {corrupt[0]}"
        if repair:
            if root.remote:
                detail += "; on an object store: delete or restore the set's objects, then run mds_shards again"
            else:
                target = Path(root.join(layout.recipe_shards_dir(manifest.recipe), ".quarantine", manifest.shard_set_id))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(root.join(where), target)
                (target / "QUARANTINED.json").write_text(json.dumps({"corrupt": corrupt}, indent=1))
                detail += f"; moved to {target}"
                if current.get(manifest.recipe) == manifest.shard_set_id:
                    out.recipes.add(manifest.recipe)
                    detail += " and published again"
        out.lines.append(("corrupt_shard_set", where, detail, repair and not root.remote))


def verify(root: DataRoot, current: dict[str, str], repair: bool) -> Verified:
    """Both scrubs (see the module's docstring)."""
    out = Verified()
    verify_lab(root, repair, out)
    verify_sets(root, current, repair, out)
    return out
