"""Where a recipe's embedding-dedup search models are kept: under the data root, one per size
generation, so that rows added to the lab never move the pairs found among earlier rows.

A model (:class:`~prx_assets.core.curate.multi_index.SearchModel`: the multi-index's rotations
and centroids) is trained the first time a recipe's embedding dedup runs above the exact method's
size in a size generation (the floor of log2 of the rows it dedups) and kept at
``curated/<recipe>/_search/<key>-g<NN>.npz``; every later cut of that generation files its rows
with it. The key covers what decides which rows reach embedding dedup (predicate, resolution,
buckets, the exact and pHash rules), the embedding column and the model's own parameters, not
opt-out lists, captions, the threshold or the cap, which do not change where the rows lie. A
retrained model (the rows doubled, a new key) may find other near-threshold pairs once; the
subset's manifest records which model each cut used (``extra.search_model``).
"""

from __future__ import annotations

import hashlib
import json

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.dedup import EMBEDDING_PROJECTED_DIM
from prx_assets.core.curate.multi_index import CELL_ROWS, KMEANS_ITERS, MODEL_VERSION, TABLES, SearchModels
from prx_assets.core.curate.recipes import Recipe


def model_key(recipe: Recipe, column: str) -> str:
    """What a recipe's kept models are keyed by (see module docs).

    >>> model_key(Recipe(name="a"), "emb") == model_key(Recipe(name="a", cap=10, captions=("x",)), "emb")
    True
    >>> model_key(Recipe(name="a"), "emb") == model_key(Recipe(name="a", min_side=256), "emb")
    False
    """
    payload = {"where": recipe.where, "min_side": recipe.min_side, "min_pixels": recipe.min_pixels,
               "aspect_buckets": list(recipe.aspect_buckets), "exact": recipe.dedup.exact,
               "phash_distance": recipe.dedup.phash_distance, "column": column,
               "model": [MODEL_VERSION, TABLES, CELL_ROWS, KMEANS_ITERS, EMBEDDING_PROJECTED_DIM]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def search_models(root: DataRoot, recipe: Recipe, column: str) -> SearchModels:
    """The recipe's kept search models under ``root`` (local, shared filesystem or object store:
    a model is created once, by whichever cut gets there first)."""
    key = model_key(recipe, column)

    def rel(generation: int) -> str:
        return layout.search_model(recipe.name, key, generation)

    def load(generation: int) -> bytes | None:
        try:
            return root.read_bytes(rel(generation))
        except FileNotFoundError:
            return None

    return SearchModels(load=load, save_new=lambda g, data: root.write_new(rel(g), data),
                        where=lambda g: root.join(rel(g)))
