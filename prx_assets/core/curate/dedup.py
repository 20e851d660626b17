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

Embedding near-duplicates (cosine at or above a threshold) are exact up to
``EMBEDDING_EXACT_BELOW`` vectors; above it they go through an inverted file (spherical
k-means centroids, each vector compared with those filed under its few nearest centroids), the
same partitioning an IVF vector index uses, run as one batched self-join rather than one
index query per row. Its recall against the exact method is measured by ``bench scale``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

#: Items whose probes are expanded at a time.
PHASH_CHUNK = 32_768
#: Up to this many vectors, embedding dedup compares every pair (exact); above it, an inverted file.
EMBEDDING_EXACT_BELOW = 20_000
#: Centroids each vector is compared under (its nearest ones) above ``EMBEDDING_EXACT_BELOW``.
EMBEDDING_PROBES = 6
#: Rows whose products are taken at a time (a chunk x members float32 block).
EMBEDDING_CHUNK = 4_096
#: Above twice this many dimensions, the inverted file finds candidates in a random projection to it.
EMBEDDING_PROJECTED_DIM = 128
#: Similarities held at a time (float32): 64 MB.
EMBEDDING_BLOCK = 16 * 2**20


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
    return greedy_keep(len(h), later, earlier).tolist()


def greedy_keep(n: int, later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Greedy in order over duplicate pairs ``(later, earlier)``: an item is dropped when one of its
    earlier partners is kept. With every pair given this equals the item-by-item greedy pass.

    >>> greedy_keep(4, np.array([1, 2, 3]), np.array([0, 1, 2])).tolist()
    [True, False, True, False]
    """
    keep = np.ones(n, dtype=bool)
    if len(later):
        order = np.lexsort((earlier, later))  # by later item, then earlier
        later, earlier = later[order], earlier[order]
        bounds = np.flatnonzero(np.diff(later)) + 1
        for item, partners in zip(later[np.r_[0, bounds]], np.split(earlier, bounds), strict=True):
            if keep[partners].any():  # partners come first, so their fate is already final
                keep[item] = False
    return keep


def _unit_rows(vectors: np.ndarray, chunk: int, overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the finite, non-zero rows and those rows scaled to unit length, float32.

    With ``overwrite`` and a C-contiguous float32 input, the rows are compacted and scaled in
    place (no second copy of the matrix): each chunk reads rows at or after the ones it writes.
    """
    n = len(vectors)
    ok = np.zeros(n, dtype=bool)
    for a in range(0, n, chunk):
        block = np.asarray(vectors[a:a + chunk], dtype=np.float32)
        ok[a:a + chunk] = np.isfinite(block).all(axis=1) & (np.abs(block).sum(axis=1) > 0)
    valid = np.flatnonzero(ok)
    dim = vectors.shape[1] if vectors.ndim == 2 else 0
    in_place = overwrite and vectors.dtype == np.float32 and vectors.flags.c_contiguous and vectors.flags.writeable
    unit = vectors if in_place else np.empty((len(valid), dim), dtype=np.float32)
    for a in range(0, len(valid), chunk):
        block = np.asarray(vectors[valid[a:a + chunk]], dtype=np.float32)
        unit[a:a + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return valid, unit[:len(valid)]


def _pairs_between(unit: np.ndarray, queries: np.ndarray, members: np.ndarray, threshold: float,
                   chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(q, m)``, ``m < q``, of ``queries`` x ``members`` (positions) with cosine >= threshold."""
    found_q: list[np.ndarray] = []
    found_m: list[np.ndarray] = []
    if not len(queries) or not len(members):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    m_vecs = unit[members]
    step = max(1, min(chunk, EMBEDDING_BLOCK // len(members)))
    for a in range(0, len(queries), step):
        q = queries[a:a + step]
        qi, mi = np.nonzero(unit[q] @ m_vecs.T >= threshold)
        earlier = members[mi] < q[qi]
        found_q.append(q[qi[earlier]])
        found_m.append(members[mi[earlier]])
    return np.concatenate(found_q), np.concatenate(found_m)


def _centroids(unit: np.ndarray, k: int, rng: np.random.Generator, iters: int, chunk: int) -> np.ndarray:
    """Spherical k-means on a sample of ``unit`` (about 40 rows per centroid)."""
    sample = unit[np.sort(rng.choice(len(unit), size=min(len(unit), 40 * k), replace=False))]
    cents = sample[rng.choice(len(sample), size=k, replace=False)].copy()
    for _ in range(iters):
        assign = np.concatenate([np.argmax(sample[a:a + chunk] @ cents.T, axis=1)
                                 for a in range(0, len(sample), chunk)])
        order = np.argsort(assign, kind="stable")
        present, starts = np.unique(assign[order], return_index=True)
        sums = np.zeros_like(cents)
        sums[present] = np.add.reduceat(sample[order], starts, axis=0)
        norms = np.linalg.norm(sums, axis=1)
        filled = norms > 0
        cents[filled] = sums[filled] / norms[filled, None]  # an empty cluster keeps its centroid
    return cents


def embedding_pairs(vectors: np.ndarray, threshold: float, exact_below: int = EMBEDDING_EXACT_BELOW,
                    probes: int = EMBEDDING_PROBES, chunk: int = EMBEDDING_CHUNK, seed: int = 0,
                    overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(i, j)``, ``j < i``, of rows whose cosine is >= ``threshold`` (rows that are not
    finite vectors pair with nothing).

    Up to ``exact_below`` valid rows every pair is compared (in blocks). Above it, an inverted
    file: spherical k-means centroids (about ``sqrt(probes * n)`` of them, trained on a sample),
    each row filed under its nearest centroid and compared with the rows filed under its
    ``probes`` nearest ones. Work grows with ``n**1.5`` instead of ``n**2``; a pair is missed only
    when neither row's nearest centroid is among the other's ``probes`` nearest, which for
    near-duplicates (cosine close to 1) is rare; ``bench scale`` measures the recall.
    ``overwrite`` lets it normalize a float32 ``vectors`` in place instead of copying it.
    """
    valid, unit = _unit_rows(np.asarray(vectors), chunk, overwrite)
    n = len(valid)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if n <= exact_below:
        everyone = np.arange(n)
        qi, mi = _pairs_between(unit, everyone, everyone, threshold, chunk)
        return valid[qi], valid[mi]
    rng = np.random.default_rng(seed)
    space, loose = unit, threshold
    if unit.shape[1] > 2 * EMBEDDING_PROJECTED_DIM:
        # Candidates are found in a random projection (cosines move by a few hundredths there,
        # so a looser threshold keeps every true pair); each is then checked in full.
        space = _project(unit, projection_matrix(unit.shape[1], rng), chunk)
        loose = threshold - projection_margin(threshold, EMBEDDING_PROJECTED_DIM)
    pairs = _ivf_pairs(space, loose, probes, chunk, rng)
    if space is not unit and len(pairs):  # the candidates, checked on the full vectors
        ok = np.concatenate([np.einsum("ij,ij->i", unit[pairs[a:a + chunk, 0]], unit[pairs[a:a + chunk, 1]])
                             for a in range(0, len(pairs), chunk)]) >= threshold
        pairs = pairs[ok]
    return valid[pairs[:, 0]], valid[pairs[:, 1]]


def _ivf_pairs(space: np.ndarray, threshold: float, probes: int, chunk: int,
               rng: np.random.Generator) -> np.ndarray:
    """``(i, j)`` rows, ``j < i``, of unit rows ``space`` with cosine >= ``threshold`` found by the
    inverted file (see :func:`embedding_pairs`), unique, as an ``m x 2`` array."""
    n = len(space)
    k = max(2, min(n // 8, int(math.sqrt(probes * n))))
    cents = _centroids(space, k, rng, iters=6, chunk=chunk)
    probes = min(probes, k)
    near = np.empty((n, probes), dtype=np.int32)
    for a in range(0, n, chunk):
        sims = space[a:a + chunk] @ cents.T
        rows = np.arange(len(sims))
        for p in range(probes):  # the nearest centroids in order (a few argmax passes beat a partition)
            near[a:a + chunk, p] = best = np.argmax(sims, axis=1)
            sims[rows, best] = -np.inf
    home = near[:, 0]
    by_home = np.argsort(home, kind="stable")
    home_starts = np.searchsorted(home[by_home], np.arange(k + 1))
    by_probe = np.argsort(near.ravel(), kind="stable")
    probe_starts = np.searchsorted(near.ravel()[by_probe], np.arange(k + 1))
    del near
    found_q: list[np.ndarray] = []
    found_m: list[np.ndarray] = []
    for c in range(k):
        members = by_home[home_starts[c]:home_starts[c + 1]]  # ascending: the sort is stable
        queries = by_probe[probe_starts[c]:probe_starts[c + 1]] // probes
        qi, mi = _pairs_between(space, queries, members, threshold, chunk)
        found_q.append(qi)
        found_m.append(mi)
    return np.unique(np.stack([np.concatenate(found_q), np.concatenate(found_m)], axis=1), axis=0)


def projection_matrix(dim: int, rng: np.random.Generator, dims: int = EMBEDDING_PROJECTED_DIM) -> np.ndarray:
    """The Gaussian random projection ``dim -> dims`` (float32) the inverted file searches in."""
    return (rng.standard_normal((dim, dims)) / math.sqrt(dims)).astype(np.float32)


def project_rows(block: np.ndarray, proj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For raw vectors ``block``: which rows are finite and non-zero, and those rows scaled to unit
    length, projected through ``proj`` and scaled to unit length again (float32)."""
    b = np.asarray(block, dtype=np.float32)
    good = np.isfinite(b).all(axis=1) & (np.abs(b).sum(axis=1) > 0)
    u = b[good]
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    p = u @ proj
    p /= np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)
    return good, p


def projected_pairs(space: np.ndarray, ok: np.ndarray, threshold: float,
                    fetch: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
                    probes: int = EMBEDDING_PROBES, chunk: int = EMBEDDING_CHUNK,
                    verify_rows: int = 65_536) -> tuple[np.ndarray, np.ndarray]:
    """:func:`embedding_pairs` for vectors too large to hold: ``space`` holds every row's projection
    (:func:`project_rows` with :func:`projection_matrix` drawn first from ``rng``; rows where ``ok``
    is false are ignored), and ``fetch(rows)`` returns the raw vectors of the given rows. Candidates
    are found in the projection and checked on full vectors fetched ``verify_rows`` at a time, so
    memory holds the projection (512 bytes a row) and one block, never every full vector. Finds the
    same pairs as :func:`embedding_pairs` with the same seed.

    ``space`` is compacted in place (its valid rows moved to the front)."""
    valid = np.flatnonzero(ok)
    for a in range(0, len(valid), chunk):  # in place: each chunk reads rows at or after the ones it writes
        take = valid[a:a + chunk]
        space[a:a + len(take)] = space[take]
    space = space[:len(valid)]
    if len(valid) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    loose = threshold - projection_margin(threshold, space.shape[1])
    pairs = _ivf_pairs(space, loose, probes, chunk, rng)
    keep = np.zeros(len(pairs), dtype=bool)
    step = max(1, verify_rows // 2)
    for a in range(0, len(pairs), step):  # each block fetches at most ``verify_rows`` full vectors
        block = pairs[a:a + step]
        rows = np.unique(block)
        full = np.asarray(fetch(valid[rows]), dtype=np.float32)
        full /= np.linalg.norm(full, axis=1, keepdims=True)
        i, j = np.searchsorted(rows, block[:, 0]), np.searchsorted(rows, block[:, 1])
        keep[a:a + len(block)] = np.einsum("ij,ij->i", full[i], full[j]) >= threshold
    pairs = pairs[keep]
    return valid[pairs[:, 0]], valid[pairs[:, 1]]


def projection_margin(threshold: float, dims: int) -> float:
    """How much looser the candidate threshold is in a ``dims``-d random projection: six standard
    deviations of a projected cosine near ``threshold`` (about ``(1 - c**2) / sqrt(dims)``), plus 0.01.

    >>> round(projection_margin(0.95, 128), 3)
    0.062
    """
    return 6 * (1 - threshold ** 2) / math.sqrt(dims) + 0.01


def _project(unit: np.ndarray, proj: np.ndarray, chunk: int) -> np.ndarray:
    """Rows of ``unit`` through the projection ``proj``, scaled to unit length again."""
    out = np.empty((len(unit), proj.shape[1]), dtype=np.float32)
    for a in range(0, len(unit), chunk):
        block = unit[a:a + chunk] @ proj
        out[a:a + chunk] = block / np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
    return out


def near_duplicates_embedding(vectors: np.ndarray, threshold: float, exact_below: int = EMBEDDING_EXACT_BELOW,
                              overwrite: bool = False) -> list[bool]:
    """Greedy in the given order: keep a vector unless its cosine with a kept one is >= threshold
    (pairs from :func:`embedding_pairs`; rows without a finite vector are kept).

    >>> near_duplicates_embedding(np.array([[1.0, 0.0], [0.99, 0.05], [0.0, 1.0], [np.nan, 0.0]]), 0.95)
    [True, False, True, True]
    """
    n = len(vectors)
    later, earlier = embedding_pairs(vectors, threshold, exact_below=exact_below, overwrite=overwrite)
    return greedy_keep(n, later, earlier).tolist()
