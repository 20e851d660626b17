"""Kept curation state that no configured recipe reads any more.

Cuts keep what they computed under ``curated/`` so the next cut pays for what changed: content
digests per set of caption columns (``_digests/``, 10 bytes a row), search codes and cells per
embedding column (``_codes/``, about 160 bytes a row), and per recipe its pHash pairs (8 bytes a
distinct hash, 16 a pair) and embedding-dedup pairs (``<recipe>/_search/``). Each cut deletes what
it replaces of its own kinds, but no cut visits what nothing asks for any more: the files of a
recipe removed from ``recipes.yaml``, of a dedup rule a recipe no longer has, of a set of caption
columns no recipe reads, of an embedding column no embedding dedup reads. At 10^9 rows each of those
holds gigabytes, so ``prx-assets doctor`` lists them (:func:`stale_kept`) and ``--repair`` deletes
them.

Everything listed is a cache: deleting it costs the next cut that wants it the work again, never a
different subset. Search models (``<recipe>/_search/<key>-g<NN>.npz``) are left alone: they decide
which near-threshold pairs a cut finds, subset manifests name them, and they do not grow with the
table's rows. Published subsets (``<recipe>/<subset id>/``) are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lance

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.kept_digests import columns_key
from prx_assets.core.curate.phash_pairs import PHASH_PAIRS_VERSION
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.curate.selection import resolve_caption_columns
from prx_assets.errors import PrxError

SEARCH_DIR = "_search"


@dataclass(frozen=True)
class StaleKept:
    """Kept files under one folder that no configured recipe reads, and why."""

    folder: str
    files: list[str]
    why: str


def stale_kept(root: DataRoot, recipes: Sequence[Recipe], captioner_ids: Sequence[str],
               embedding_column: str | None, lab: lance.LanceDataset | None) -> list[StaleKept]:
    """The kept files under ``root`` that none of ``recipes`` reads (see module docs), folder by folder.

    ``captioner_ids`` and ``embedding_column`` are the configured captioners and embedder's column
    (``None``: no embedder); ``lab`` is the lab's latest version, which maps each recipe's captioners
    to caption columns. Without it (no lab yet, or it cannot be opened) digests and codes are not
    judged, only the recipes' own folders; while a recipe names a captioner the lab has no column
    for yet, digests are not judged.
    """
    by_name = {r.name: r for r in recipes}
    out = [s for name in root.folders(layout.CURATED_DIR) if not name.startswith("_")
           for s in _recipe_stale(root, name, by_name.get(name), embedding_column)]
    if lab is None:
        return out
    used: set[str] | None = set()
    for recipe in recipes:
        try:
            used.add(columns_key(resolve_caption_columns(lab, recipe.caption_names(), captioner_ids, recipe.name)))
        except PrxError:
            used = None  # a recipe the lab cannot serve yet: which digests it will read is unknown
            break
    for folder in root.folders(layout.KEPT_DIGESTS_DIR) if used is not None else []:
        if folder not in used:
            files = root.list(layout.kept_digests_dir(folder))
            if files:
                out.append(StaleKept(layout.kept_digests_dir(folder), files,
                                     "content digests of caption columns no recipe reads"))
    searched = embedding_column is not None and any(r.dedup.embedding_threshold is not None for r in recipes)
    for column in root.folders(layout.SEARCH_CODES_DIR):
        if not (searched and column == embedding_column):
            files = root.list(layout.search_codes_dir(column))
            if files:
                why = ("search codes of an embedding column no recipe's embedding dedup reads"
                       f" (the embedder's column is {embedding_column!r})")
                out.append(StaleKept(layout.search_codes_dir(column), files, why))
    return out


def _recipe_stale(root: DataRoot, name: str, recipe: Recipe | None,
                  embedding_column: str | None) -> list[StaleKept]:
    """Kept pHash and embedding-dedup pairs of one folder under ``curated/`` that its recipe no longer reads."""
    folder = f"{layout.CURATED_DIR}/{name}/{SEARCH_DIR}"
    files = root.list(folder)
    if not files:
        return []
    keep: str | None = None
    if recipe is None:
        why_phash = why_pairs = "the recipe is not in recipes.yaml"
    else:
        d = recipe.dedup.phash_distance
        keep = layout.phash_pairs(name, PHASH_PAIRS_VERSION, int(d)) if d is not None else None
        why_phash = "the recipe has no pHash dedup" if keep is None else \
            f"another distance or layout than the recipe's ({keep.rpartition('/')[2]})"
        why_pairs = None if recipe.dedup.embedding_threshold is not None and embedding_column is not None else \
            "the recipe has no embedding dedup" if embedding_column is not None else "no embedder is configured"
    phash = [f for f in files if f.rpartition("/")[2].startswith("phash-") and f != keep]
    pairs = [f for f in files if f.rpartition("/")[2].startswith("pairs-")] if why_pairs else []
    out = []
    if phash:
        out.append(StaleKept(folder, phash, f"kept pHash pairs: {why_phash}"))
    if pairs:
        out.append(StaleKept(folder, pairs, f"kept embedding-dedup pairs: {why_pairs}"))
    return out


def delete_stale(root: DataRoot, stale: StaleKept) -> int:
    """Delete one folder's stale files (absent ones are skipped); how many."""
    for rel in stale.files:
        root.delete(rel)
    return len(stale.files)
