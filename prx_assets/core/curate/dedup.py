"""Deduplication at scale, vectorized: exact (by hash), pHash near-duplicates, embeddings.

All three are greedy in the given order (curation sorts by resolution, then id): an item is
kept unless it duplicates an item kept before it.

pHash near-duplicates use multi-index hashing: the 64 bits are split into ``m`` substrings,
``m`` about ``64 / log2(n)`` so that a substring key holds a handful of items. Two hashes
within ``d`` bits differ by at most ``d // m`` bits in at least one substring (pigeonhole),
so probing every key within that radius of each item's substrings finds *every* pair within
the distance, as an all-pairs comparison would; candidate pairs are then checked on all 64
bits. The work grows with ``n`` times the probes (tens), not with ``n**2``, and runs in numpy
a chunk of items at a time (memory bounded by the chunk).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: Items whose probes are expanded at a time.
PHASH_CHUNK = 32_768


def first_occurrences(keys: np.ndarray) -> np.ndarray:
    """Exact dedup: ``True`` for the first occurrence of each key, in order.

    >>> first_occurrences(np.array([3, 1, 3, 2, 1])).tolist()
    [True, True, False, True, False]
    """
    keep = np.zeros(len(keys), dtype=bool)
    if len(keys):
        _, first = np.unique(keys, return_index=True)
        keep[first] = True
    return keep


def _substrings(distance: int, n: int) -> list[tuple[int, int]]:
    """``(shift, width)`` of each substring: about ``64 / log2(n)`` of them, at most ``distance + 1``."""
    m = max(1, min(distance + 1, round(64 / max(1.0, math.log2(max(n, 2))))))
    widths = [64 // m + (1 if i < 64 % m else 0) for i in range(m)]
    shifts = [sum(widths[:i]) for i in range(m)]
    return list(zip(shifts, widths, strict=True))


def _probes(width: int, radius: int) -> np.ndarray:
    """Every ``width``-bit mask with at most ``radius`` bits set."""
    masks = [0]
    for r in range(1, radius + 1):
        masks += [sum(1 << b for b in bits) for bits in itertools.combinations(range(width), r)]
    return np.array(masks, dtype=np.uint64)


def phash_pairs(hashes: np.ndarray, distance: int, chunk: int = PHASH_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``(i, j)``, ``j < i``, with ``hashes[i]`` and ``hashes[j]`` within ``distance`` bits
    (each pair once), found by multi-index hashing (see module docs)."""
    h = np.asarray(hashes, dtype=np.uint64)
    n = len(h)
    found_i: list[np.ndarray] = []
    found_j: list[np.ndarray] = []
    subs = _substrings(distance, n)
    radius = distance // len(subs)
    for shift, width in subs:
        mask = np.uint64((1 << width) - 1) if width < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
        keys = (h >> np.uint64(shift)) & mask
        order = np.argsort(keys, kind="stable")
        uniq, starts, counts = np.unique(keys[order], return_index=True, return_counts=True)
        probes = _probes(width, radius)
        for a in range(0, n, chunk):
            items = np.arange(a, min(n, a + chunk))
            probe_keys = (keys[items][:, None] ^ probes[None, :]).ravel()
            owner = np.repeat(items, len(probes))
            loc = np.searchsorted(uniq, probe_keys)
            hit = loc < len(uniq)
            hit[hit] = uniq[loc[hit]] == probe_keys[hit]
            loc, owner = loc[hit], owner[hit]
            sizes = counts[loc]
            if not len(sizes):
                continue
            # expand each hit bucket into its members: positions starts[loc] .. starts[loc] + size
            base = np.repeat(starts[loc] - np.cumsum(sizes) + sizes, sizes)
            members = order[base + np.arange(int(sizes.sum()))]
            i = np.repeat(owner, sizes)
            keep = members < i
            i, j = i[keep], members[keep]
            near = np.bitwise_count(h[i] ^ h[j]) <= distance
            found_i.append(i[near])
            found_j.append(j[near])
    if not found_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([np.concatenate(found_i), np.concatenate(found_j)], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def near_duplicates_phash(hashes: Sequence[int] | np.ndarray, distance: int) -> list[bool]:
    """Greedy in the given order: keep an item unless it is within ``distance`` bits of a kept one.

    >>> near_duplicates_phash([0b1111, 0b1110, 0xFFFF << 40], 1)
    [True, False, True]
    """
    h = np.asarray(hashes, dtype=np.uint64) if len(hashes) else np.zeros(0, np.uint64)
    if distance <= 0:
        return first_occurrences(h).tolist()
    later, earlier = phash_pairs(h, min(int(distance), 64))
    keep = np.ones(len(h), dtype=bool)
    if len(later):
        order = np.lexsort((earlier, later))  # by later item, then earlier
        later, earlier = later[order], earlier[order]
        bounds = np.flatnonzero(np.diff(later)) + 1
        for item, partners in zip(later[np.r_[0, bounds]], np.split(earlier, bounds), strict=True):
            if keep[partners].any():  # partners come first, so their fate is already final
                keep[item] = False
    return keep.tolist()


def near_duplicates_embedding(vectors: np.ndarray, threshold: float) -> list[bool]:
    """Greedy in the given order: keep a vector unless its cosine with a kept one is >= threshold."""
    kept = np.zeros((len(vectors), vectors.shape[1] if vectors.ndim == 2 else 0), np.float32)
    n_kept = 0
    keep = []
    for v in vectors:
        if v is None or not np.isfinite(v).all():
            keep.append(True)
            continue
        dup = n_kept > 0 and float(np.max(kept[:n_kept] @ v)) >= threshold
        keep.append(not dup)
        if not dup:
            kept[n_kept] = v
            n_kept += 1
    return keep
