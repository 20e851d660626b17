"""``prx-assets doctor --verify``: scrub the lab's stored images and every published shard set
against their digests, and with ``--repair`` take corrupt data out of use.

- Lab rows whose stored bytes no longer hash to ``stored_sha256`` are deleted; their batches are
  returned so that the caller re-materializes ``raw_images`` for them (ingest writes them again
  from the source; a file gone from its source becomes a reject row, with its reason). A
  recipe's current subset that holds one of them is pinned to a lab version whose data file is
  corrupt: it is moved to ``curated/<recipe>/.quarantine/<subset id>`` and its recipe returned,
  so that the caller cuts it again (the same id, pinned to the repaired version).
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

import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.subsets import read_subset_table
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
    subsets: set[str] = field(default_factory=set)  # curated_subsets partitions to cut again
    recipes: set[str] = field(default_factory=set)  # mds_shards partitions to publish again


def verify_lab(root: DataRoot, subsets: dict[str, str], repair: bool, out: Verified) -> None:
    """Scrub the images table; with ``repair`` delete corrupt rows, note their batches, and take the
    current subsets (``subsets``: recipe -> subset id) that hold them out of use."""
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
    corrupt = pa.array(sorted({i for ids in report.corrupt.values() for i in ids}), pa.string())
    for recipe, sid in sorted(subsets.items()) if repair and len(corrupt) else ():
        held = read_subset_table(root, recipe, sid).column("image_id")
        if pc.any(pc.is_in(held, value_set=corrupt)).as_py():
            target = _quarantine(root, layout.subset_dir(recipe, sid), layout.CURATED_DIR, recipe, sid)
            out.subsets.add(recipe)
            out.lines.append(("subset_on_corrupt_data", layout.subset_dir(recipe, sid),
                              f"pinned to a lab version holding corrupt images; moved to {target}, cut again", True))
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
                target = _quarantine(root, where, layout.MDS_DIR, manifest.recipe, manifest.shard_set_id)
                (target / "QUARANTINED.json").write_text(json.dumps({"corrupt": corrupt}, indent=1))
                detail += f"; moved to {target}"
                if current.get(manifest.recipe) == manifest.shard_set_id:
                    out.recipes.add(manifest.recipe)
                    detail += " and published again"
        out.lines.append(("corrupt_shard_set", where, detail, repair and not root.remote))


def _quarantine(root: DataRoot, rel: str, top: str, recipe: str, name: str) -> Path:
    """Move a local folder under the data root to ``<top>/<recipe>/.quarantine/<name>`` (kept, never read)."""
    target = Path(root.join(top, recipe, ".quarantine", name))
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    shutil.move(root.join(rel), target)
    return target


def verify(root: DataRoot, current: dict[str, str], subsets: dict[str, str], repair: bool) -> Verified:
    """Both scrubs (see the module's docstring); ``current`` and ``subsets``: each recipe's current
    shard set and subset ids."""
    out = Verified()
    verify_lab(root, subsets, repair and not root.remote, out)
    verify_sets(root, current, repair, out)
    return out
