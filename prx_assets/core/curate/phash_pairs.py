"""pHash dedup's pairs kept between a recipe's cuts, so that a cut searches only the pairs that
involve a hash no earlier cut searched.

pHash dedup finds every pair of distinct hashes within the recipe's distance among the images that
reach it (:func:`~prx_assets.core.curate.dedup.phash_pairs`), then keeps images greedily in the
subset's order. Whether two hashes pair is decided by the two values alone, not by the images they
belong to, the other hashes or the order. So after a cut of the table's latest version the distinct
hashes it searched and the pairs it found among them are kept, as values, at
``curated/<recipe>/_search/phash-v<version>-d<distance>.npz`` (:func:`layout.phash_pairs`; 8 bytes a
distinct hash and 16 a pair). The next cut at the same distance takes the kept pairs whose two hashes
are both still there and searches only the pairs with a hash not kept (a new batch's images, images
that reach pHash dedup for the first time): per table of the block method, one pass over the hashes
looked up among the new ones' keys, instead of a sort of every key. The greedy pass then runs on all
of them, so the result is the same as searching every pair. A cut of an older version keeps nothing;
a kept file of another layout version or distance is never read (the next cut searches every pair
once and replaces it).
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.dedup import phash_pairs
from prx_assets.core.curate.search_pairs import write_replacing
from prx_assets.core.sorted_lookup import lookup
from prx_assets.errors import PrxError

#: Bump when what a kept file holds changes: files of another version are never read.
PHASH_PAIRS_VERSION = 1


class PhashPairsError(PrxError):
    """A kept pHash pairs file that cannot be read."""


@dataclass
class KeptPhashPairs:
    """A recipe's kept pHash pairs under a data root (see module docs); ``stats`` says what the last
    cut did (``hashes_new``: distinct hashes searched against every hash, ``pairs_kept``, ``pairs_found``,
    ``kept``: whether what it found is kept)."""

    root: DataRoot
    recipe: str
    stats: dict[str, Any] = field(default_factory=dict)

    def rel(self, distance: int) -> str:
        """Where the pairs at ``distance`` are kept."""
        return layout.phash_pairs(self.recipe, PHASH_PAIRS_VERSION, distance)

    def load(self, distance: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The kept hashes (sorted, distinct) and pairs (``m x 2``, each the lower value first), or ``None``."""
        rel = self.rel(distance)
        try:
            data = self.root.read_bytes(rel)
        except FileNotFoundError:
            return None
        where = self.root.join(rel)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                values, pairs = z["values"], z["pairs"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise PhashPairsError(f"kept pHash pairs {where} cannot be read ({e}); delete the file and the next "
                                  "cut searches every pair again") from None
        if values.dtype != np.uint64 or values.ndim != 1 or pairs.dtype != np.uint64 or pairs.ndim != 2 \
                or pairs.shape[1] != 2 or (len(values) > 1 and not (np.diff(values) > 0).all()):
            raise PhashPairsError(f"kept pHash pairs {where} hold {values.shape} {values.dtype} hashes and "
                                  f"{pairs.shape} {pairs.dtype} pairs, not sorted distinct uint64 hashes and m x 2 "
                                  "uint64 pairs; delete the file and the next cut searches every pair again")
        return values, pairs

    def save(self, distance: int, values: np.ndarray, pairs: np.ndarray) -> None:
        """Keep ``values`` and ``pairs`` (see :meth:`load`) and delete the recipe's other pHash pairs."""
        buf = io.BytesIO()
        np.savez(buf, values=values, pairs=pairs)
        write_replacing(self.root, self.rel(distance), buf.getvalue(), "phash-")

    def pairs(self, hashes: np.ndarray, distance: int, keep_found: bool) -> tuple[np.ndarray, np.ndarray]:
        """Every pair ``(i, j)``, ``j < i``, of the distinct ``hashes`` within ``distance`` bits, as
        :func:`~prx_assets.core.curate.dedup.phash_pairs` gives them: the kept pairs of hashes still
        here and those searched now with a hash not kept; ``keep_found`` keeps them for the next cut."""
        h = np.asarray(hashes, dtype=np.uint64)
        order = np.argsort(h)  # distinct values: any sort gives the same order (quicksort: 0.55x a stable one)
        values = h[order]
        if len(values) > 1 and not (values[1:] != values[:-1]).all():
            raise ValueError("kept pHash pairs are searched among distinct hashes; dedup them first (phash_keep does)")
        got = self.load(distance)
        if got is None:
            new = np.ones(len(h), dtype=bool)
            old_i = old_j = np.zeros(0, np.int64)
        else:
            kept_values, kept_pairs = got
            new = np.empty(len(h), dtype=bool)
            new[order] = ~lookup(kept_values, values)[0]  # the sorted values: one walk of the kept ones
            a_here, a_at = lookup(values, kept_pairs[:, 0])
            b_here, b_at = lookup(values, kept_pairs[:, 1])
            both = a_here & b_here
            a, b = order[a_at[both]], order[b_at[both]]
            old_i, old_j = np.maximum(a, b), np.minimum(a, b)
        found_i, found_j = phash_pairs(h, distance, new=new)
        self.stats = {"hashes_new": int(new.sum()), "pairs_kept": len(old_i), "pairs_found": len(found_i),
                      "kept": False}
        later, earlier = np.concatenate([old_i, found_i]), np.concatenate([old_j, found_j])
        # nothing new and as many hashes as kept: the kept hashes and pairs exactly, nothing to write
        if keep_found and (got is None or new.any() or len(values) != len(got[0])):
            low, high = np.minimum(h[later], h[earlier]), np.maximum(h[later], h[earlier])
            self.save(distance, values, np.stack([low, high], axis=1) if len(low) else np.zeros((0, 2), np.uint64))
        self.stats["kept"] = keep_found
        return later, earlier


def phash_pairs_kept(root: DataRoot, recipe: str) -> KeptPhashPairs:
    """The kept pHash pairs of ``recipe`` under ``root``."""
    return KeptPhashPairs(root, recipe)
