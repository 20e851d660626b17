"""Deduplication at scale, vectorized: exact (by hash), pHash near-duplicates, embeddings.

All three are greedy in the given order (curation sorts by resolution, then id): an item is
kept unless it duplicates an item kept before it.

pHash near-duplicates are found exactly (every pair within the distance, as an all-pairs
comparison would find). Identical hashes are collapsed first (they share their fate). Then, by
pigeonhole, two hashes within ``d`` bits agree exactly on at least ``B - d`` of ``B`` blocks of
their 64 bits: for each choice of ``B - d`` blocks (``C(B, d)`` tables) the hashes are sorted by
those blocks and every run of equal keys is compared on all 64 bits (the permuted-table method
used for simhash near-duplicates of web pages). ``B`` is chosen so that a key holds a handful
of hashes; where that needs too many tables (large distances) multi-index hashing takes over:
``m`` substrings, each probed within radius ``d // m``. The work grows with ``n`` times the
tables, not with ``n**2``, and every step is a vectorized pass (memory a few arrays of ``n``).

Embedding near-duplicates (cosine at or above a threshold) are exact up to
``EMBEDDING_EXACT_BELOW`` vectors; above it, candidates come from an inverted multi-index over
int8 codes of the vectors (:mod:`prx_assets.core.curate.multi_index`) and are checked on the
full vectors. Its recall against the exact method is measured by ``bench scale``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np

from prx_assets.core.curate.multi_index import (
    ASSIGN_CHUNK,
    CODE_MARGIN,
    SearchModel,
    SearchModels,
    encode_rows,
    multi_index_pairs,
    random_rotation,
    row_products,
    unique_pairs,
)


class KeptPhashPairs(Protocol):
    """A recipe's kept pHash pairs (:class:`prx_assets.core.curate.phash_pairs.KeptPhashPairs`)."""

    def pairs(self, hashes: np.ndarray, distance: int, keep_found: bool) -> tuple[np.ndarray, np.ndarray]:
        """The pairs of distinct ``hashes`` within ``distance`` bits, kept ones not searched again."""
        ...


class KeptPairs(Protocol):
    """A recipe's kept embedding pairs (:class:`prx_assets.core.curate.search_pairs.KeptPairs`)."""

    stats: dict[str, Any]

    def known(self, model_id: str, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The pairs kept by earlier cuts among the bound rows, or ``None`` when there are none."""
        ...

    def keep(self, model_id: str, threshold: float, pairs: np.ndarray, held: np.ndarray) -> None:
        """Keep this cut's pairs for the next one."""
        ...

#: Items whose probes are expanded at a time (multi-index hashing).
PHASH_CHUNK = 32_768
#: Most tables the block method may use before multi-index hashing is preferred.
PHASH_MAX_TABLES = 64
#: Above this share of new hashes, pairs with a new hash are found by a whole search, then kept if
#: they hold one: the lookup of every key among the new ones costs with the new hashes times the
#: hashes sharing their key, which grows with the table (synthetic hashes at distance 4: break-even
#: near 0.2 at 1M and 0.1 at 10M; all new at 10M 279.5 s and 5.36 GB against 23.5 s and 0.97 GB).
PHASH_NEW_SHARE = 0.1
#: Up to this many vectors, embedding dedup compares every pair (exact); above it, a multi-index.
EMBEDDING_EXACT_BELOW = 20_000
#: Rows whose products are taken at a time (a chunk x members float32 block).
EMBEDDING_CHUNK = 4_096
#: Above twice this many dimensions, candidates are found in a random projection to it.
EMBEDDING_PROJECTED_DIM = 128
#: Similarities held at a time (float32): 64 MB.
EMBEDDING_BLOCK = 16 * 2**20


def first_occurrences(keys: np.ndarray) -> np.ndarray:
    """Exact dedup: ``True`` for the first occurrence of each key, in order.

    Only the keys that occur more than once (:func:`repeating`) are sorted with their positions; the
    rest are first occurrences by themselves (9.6M pHash values: about half the time of
    ``np.unique(return_index=True)``'s stable sort of every key).

    >>> first_occurrences(np.array([3, 1, 3, 2, 1])).tolist()
    [True, True, False, True, False]
    """
    keys = np.asarray(keys)
    keep = np.ones(len(keys), dtype=bool)
    rows = repeating(keys)
    if len(rows):
        _, first = np.unique(keys[rows], return_index=True)
        keep[rows] = False
        keep[rows[first]] = True
    return keep


def repeating(values: np.ndarray) -> np.ndarray:
    """Positions, in order, of the values that occur more than once in ``values`` (numbers), from a
    sort of the values alone (vectorized, about a tenth of an argsort's time) and a search of each
    value among the repeated ones.

    >>> repeating(np.array([5, 7, 5, 9, 7, 1])).tolist()
    [0, 1, 2, 4]
    """
    if len(values) < 2:
        return np.zeros(0, dtype=np.int64)
    ordered = np.sort(values)
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    if not len(repeated):
        return np.zeros(0, dtype=np.int64)
    at = np.minimum(np.searchsorted(repeated, values), len(repeated) - 1)
    return np.flatnonzero(repeated[at] == values)


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


def phash_blocks(distance: int, n: int, max_tables: int = PHASH_MAX_TABLES) -> int | None:
    """Blocks ``B`` for the block method at ``distance`` over ``n`` hashes (``C(B, distance)``
    tables), or ``None`` when multi-index hashing costs less. The cost model: a sort per table
    (about ten pair checks per item) plus the pairs within its runs of equal keys.

    >>> phash_blocks(4, 10_000_000), phash_blocks(4, 1_000), phash_blocks(12, 10_000_000)
    (6, None, None)
    """
    if distance < 1:
        return None
    best: tuple[float, int] | None = None
    for blocks in range(distance + 1, 65):
        tables = math.comb(blocks, distance)
        if tables > max_tables:
            break
        per_key = n / 2 ** (64 * (blocks - distance) / blocks)
        cost = tables * (10.0 + per_key / 2)
        if best is None or cost < best[0]:
            best = (cost, blocks)
    if best is None:
        return None
    subs = _substrings(distance, n)
    width = 64 // len(subs)
    probes = sum(math.comb(width, r) for r in range(distance // len(subs) + 1))
    mih = len(subs) * probes * (4.0 + 4.0 * n / 2 ** width)
    return best[1] if best[0] <= mih else None


def _block_keys(h: np.ndarray, distance: int, blocks: int) -> Iterator[np.ndarray]:
    """For each of the block method's tables (a choice of ``blocks - distance`` of ``blocks`` blocks of
    the 64 bits), every hash's key there: the chosen blocks' bits, at most 32 of them (the top 32
    of a longer key), as uint64. Two hashes within ``distance`` bits share the key in some table."""
    widths = [64 // blocks + (1 if i < 64 % blocks else 0) for i in range(blocks)]
    shifts = [sum(widths[:i]) for i in range(blocks)]
    for clean in itertools.combinations(range(blocks), blocks - distance):
        key = np.zeros(len(h), dtype=np.uint64)
        at = 0
        for b in clean:
            key |= ((h >> np.uint64(shifts[b])) & np.uint64((1 << widths[b]) - 1)) << np.uint64(at)
            at += widths[b]
        if at > 32:  # the key and the row share one 64-bit word in _block_pairs; keep its top 32 bits
            key >>= np.uint64(at - 32)
        yield key


def _block_pairs(h: np.ndarray, distance: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair within ``distance`` bits by the block method (see module docs), ``(later, earlier)``
    with repeats (a pair that agrees on several block choices is found in each)."""
    n = len(h)
    found_i: list[np.ndarray] = []
    found_j: list[np.ndarray] = []
    rows = np.arange(n, dtype=np.uint64)
    for key in _block_keys(h, distance, blocks):
        packed = (key << np.uint64(32)) | rows
        del key
        packed.sort()  # by key, then row: numpy's vectorized sort, several times an argsort's speed
        order = (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, (packed[1:] >> np.uint64(32)) != (packed[:-1] >> np.uint64(32))])
        del packed
        ends = np.r_[starts[1:], n]
        end = np.repeat(ends, ends - starts)  # per sorted position: where its run of equal keys ends
        hs = h[order]
        pos = np.flatnonzero(end - np.arange(n) > 1)
        step = 1
        while len(pos):  # position p meets p + step in its run; each pair of a run once
            near = np.bitwise_count(hs[pos] ^ hs[pos + step]) <= distance
            a, b = order[pos[near]], order[pos[near] + step]
            found_i.append(np.maximum(a, b))
            found_j.append(np.minimum(a, b))
            step += 1
            pos = pos[end[pos] - pos > step]
    if not found_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(found_i), np.concatenate(found_j)


def _mih_pairs(h: np.ndarray, distance: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair within ``distance`` bits by multi-index hashing, ``(later, earlier)`` with repeats."""
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
    return np.concatenate(found_i), np.concatenate(found_j)


def _new_block_pairs(h: np.ndarray, distance: int, blocks: int, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair within ``distance`` bits with at least one ``new`` hash, by the block method's
    tables: per table, every hash's key is looked up in a filter of the new hashes' keys (a bit per
    slot of a multiplicative hash, at least 64 slots a new hash), and only the few that hit are
    searched among the new keys (sorted), so the work is a pass over the hashes per table and the
    pairs of each with the new hashes of its key, not a sort of every key. ``(later, earlier)`` with
    repeats."""
    fresh = np.flatnonzero(new)
    found_i: list[np.ndarray] = []
    found_j: list[np.ndarray] = []
    bits = min(26, max(16, (64 * len(fresh)).bit_length()))  # a filter of >= 64 slots a new hash
    mark = np.zeros(1 << bits, dtype=bool)
    spread, drop = np.uint64(0x9E3779B97F4A7C15), np.uint64(64 - bits)
    for key in _block_keys(h, distance, blocks):
        fresh_keys = key[fresh]
        order = np.argsort(fresh_keys, kind="stable")
        fresh_keys = fresh_keys[order]
        mark[:] = False
        mark[(fresh_keys * spread) >> drop] = True
        rows = np.flatnonzero(mark[(key * spread) >> drop])  # the new keys' slots: every match, a few more
        key = key[rows]
        lo = np.searchsorted(fresh_keys, key, side="left")
        hi = np.searchsorted(fresh_keys, key, side="right")
        del key
        hit = hi > lo
        rows, lo, hi = rows[hit], lo[hit], hi[hit]
        counts = hi - lo
        i = np.repeat(rows, counts)
        starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
        j = fresh[order[starts + np.arange(len(i))]]
        near = (i != j) & (np.bitwise_count(h[i] ^ h[j]) <= distance)
        i, j = i[near], j[near]
        found_i.append(np.maximum(i, j))
        found_j.append(np.minimum(i, j))
    if not found_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(found_i), np.concatenate(found_j)


def phash_pairs(hashes: np.ndarray, distance: int, chunk: int = PHASH_CHUNK,
                new: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``(i, j)``, ``j < i``, with ``hashes[i]`` and ``hashes[j]`` within ``distance`` bits
    (each pair once, sorted), by the block method or multi-index hashing (see module docs); with
    ``new`` (a mask of the hashes) only the pairs with at least one new hash."""
    h = np.asarray(hashes, dtype=np.uint64)
    if new is not None and not new.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    blocks = phash_blocks(distance, len(h))
    if new is not None and blocks and new.sum() <= PHASH_NEW_SHARE * len(h):
        later, earlier = _new_block_pairs(h, distance, blocks, new)
    else:
        later, earlier = _block_pairs(h, distance, blocks) if blocks else _mih_pairs(h, distance, chunk)
        if new is not None and not new.all():  # many new hashes, or multi-index hashing: every pair, then those
            with_new = new[later] | new[earlier]
            later, earlier = later[with_new], earlier[with_new]
    return unique_pairs(later, earlier)




def near_duplicates_phash(hashes: Sequence[int] | np.ndarray, distance: int) -> list[bool]:
    """Greedy in the given order: keep an item unless it is within ``distance`` bits of a kept one
    (:func:`phash_keep` as a list, for small inputs and tests).

    >>> near_duplicates_phash([0b1111, 0b1110, 0xFFFF << 40, 0b1111], 1)
    [True, False, True, False]
    """
    h = np.asarray(hashes, dtype=np.uint64) if len(hashes) else np.zeros(0, np.uint64)
    return phash_keep(h, distance).tolist()


def phash_keep(hashes: np.ndarray, distance: int, kept: KeptPhashPairs | None = None,
               keep_found: bool = False) -> np.ndarray:
    """Greedy in the given order: ``True`` for each item not within ``distance`` bits of a kept one.

    Items with the same hash share their fate (after the first, each is within distance 0 of it,
    or of whatever dropped it), so the pairs are found among distinct hashes only. Which distinct
    hashes pair is decided by the two hashes alone, so with ``kept`` (a recipe's kept pairs, see
    :mod:`prx_assets.core.curate.phash_pairs`) the pairs among hashes an earlier cut searched are
    taken as kept and only the pairs with a hash it did not see are searched; ``keep_found`` keeps
    this cut's (a cut of the table's latest version)."""
    h = np.asarray(hashes, dtype=np.uint64)
    first = first_occurrences(h)
    if distance <= 0 or not len(h):
        return first
    distinct = np.flatnonzero(first)
    values = h[distinct]
    distance = min(int(distance), 64)
    if kept is None:
        later, earlier = phash_pairs(values, distance)
    else:
        later, earlier = kept.pairs(values, distance, keep_found)
    keep = np.zeros(len(h), dtype=bool)
    keep[distinct] = greedy_keep(len(distinct), later, earlier)
    return keep


#: Rounds of :func:`greedy_keep`'s vectorized pass before the items still undecided (at the end of
#: chains of pairs longer than this) are taken one at a time.
GREEDY_ROUNDS = 32


def greedy_keep(n: int, later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Greedy in order over duplicate pairs ``(later, earlier)``: an item is dropped when one of its
    earlier partners is kept. With every pair given this equals the item-by-item greedy pass.

    Decided in rounds over every pair at once: an item with a partner known to be kept is dropped,
    one whose partners are all known to be dropped is kept (an item without earlier partners is
    kept). A round decides at least the earliest undecided item, and near-duplicate chains are
    short, so a few rounds decide everything (480,000 pairs over 9M items: 0.18 s, against 1.10 s
    item by item); what :data:`GREEDY_ROUNDS` rounds leave is taken item by item, in order.

    >>> greedy_keep(4, np.array([1, 2, 3]), np.array([0, 1, 2])).tolist()
    [True, False, True, False]
    """
    keep = np.ones(n, dtype=bool)
    if not len(later):
        return keep
    order = np.lexsort((earlier, later))  # by later item, then earlier
    later, earlier = later[order], earlier[order]
    starts = np.r_[0, np.flatnonzero(np.diff(later)) + 1]
    items = later[starts]
    decided = np.ones(n, dtype=bool)
    decided[items] = False
    for _ in range(GREEDY_ROUNDS):
        known = decided[earlier]
        any_kept = np.logical_or.reduceat(known & keep[earlier], starts)
        all_known = np.logical_and.reduceat(known, starts)
        open_ = ~decided[items]
        drop = open_ & any_kept
        keep[items[drop]] = False
        decided[items[drop | (open_ & all_known)]] = True
        if decided[items].all():
            return keep
    bounds = np.r_[starts[1:], len(later)]
    for k in np.flatnonzero(~decided[items]):  # in item order: partners' fates are final first
        if keep[earlier[starts[k]:bounds[k]]].any():
            keep[items[k]] = False
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


def embedding_pairs(vectors: np.ndarray, threshold: float, exact_below: int = EMBEDDING_EXACT_BELOW,
                    chunk: int = EMBEDDING_CHUNK, seed: int = 0, overwrite: bool = False,
                    models: SearchModels | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(i, j)``, ``j < i``, of rows whose cosine is >= ``threshold`` (rows that are not
    finite vectors pair with nothing).

    Up to ``exact_below`` valid rows every pair is compared (in blocks). Above it, candidates come
    from an inverted multi-index over int8 codes of the rows (randomly rotated, or projected to
    ``EMBEDDING_PROJECTED_DIM`` dimensions above twice that), at a threshold lowered by the
    projection's and the codes' error margins, and each candidate is checked on the full vectors:
    every pair reported is a true pair; a pair is missed only when neither row's probes reach the
    other's cell in any table (recall measured by ``bench scale``). Work grows with ``n``, not
    ``n**1.5`` or ``n**2``. ``overwrite`` lets the exact method normalize a float32 ``vectors`` in
    place instead of copying it. ``models`` keeps the multi-index's trained part between calls, so
    rows added later (pairing with no earlier row) leave the pairs among earlier rows as they were.
    """
    vectors = np.asarray(vectors)
    n, dim = len(vectors), (vectors.shape[1] if vectors.ndim == 2 else 0)
    if n < 2 or dim == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if n <= exact_below:
        valid, unit = _unit_rows(vectors, chunk, overwrite)
        everyone = np.arange(len(valid))
        qi, mi = _pairs_between(unit, everyone, everyone, threshold, chunk)
        return valid[qi], valid[mi]
    rng = np.random.default_rng(seed)
    mapping = search_map(dim, rng)
    ok = np.zeros(n, dtype=bool)
    codes: list[np.ndarray] = []
    scales: list[np.ndarray] = []
    for a in range(0, n, ASSIGN_CHUNK):
        good, c, sc = encode_for_search(vectors[a:a + ASSIGN_CHUNK], mapping)
        ok[a:a + len(good)] = good
        codes.append(c)
        scales.append(sc)
    return projected_pairs(np.concatenate(codes), np.concatenate(scales), ok, threshold, dim,
                           lambda rows: vectors[rows], rng, models=models)


def projection_matrix(dim: int, rng: np.random.Generator, dims: int = EMBEDDING_PROJECTED_DIM) -> np.ndarray:
    """The Gaussian random projection ``dim -> dims`` (float32) candidates are searched in."""
    return (rng.standard_normal((dim, dims)) / math.sqrt(dims)).astype(np.float32)


def search_map(dim: int, rng: np.random.Generator) -> np.ndarray:
    """The matrix rows pass through before they are encoded for the candidate search: a random
    projection to ``EMBEDDING_PROJECTED_DIM`` above twice that many dimensions, else a random
    rotation (which spreads every vector's energy over its components, so int8 codes are even)."""
    return projection_matrix(dim, rng) if dim > 2 * EMBEDDING_PROJECTED_DIM else random_rotation(dim, rng)


def candidate_threshold(threshold: float, dim: int) -> float:
    """The cosine on encoded rows at or above which a pair is a candidate for ``threshold`` on the
    vectors: lower by the projection's margin (when ``dim`` is projected) and the codes' margin."""
    if dim > 2 * EMBEDDING_PROJECTED_DIM:
        threshold -= projection_margin(threshold, EMBEDDING_PROJECTED_DIM)
    return threshold - CODE_MARGIN


def encode_for_search(block: np.ndarray, mapping: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For raw vectors ``block``: which rows are usable (finite and non-zero: a NaN or infinity
    anywhere makes every mapped component non-finite), and the usable rows through ``mapping``
    (:func:`search_map`), scaled to unit length and encoded (:func:`encode_rows`: codes, scales)."""
    p = row_products(np.asarray(block, dtype=np.float32), mapping)  # a row's code does not depend on its block
    norm = np.linalg.norm(p, axis=1)
    good = np.isfinite(p).all(axis=1) & (norm > 0)
    codes, scale = encode_rows(p[good] / norm[good, None])
    return good, codes, scale


def projected_pairs(codes: np.ndarray, scale: np.ndarray, ok: np.ndarray, threshold: float, dim: int,
                    fetch: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
                    verify_rows: int = 65_536, models: SearchModels | None = None,
                    cells: Callable[[SearchModel, str, int], np.ndarray] | None = None,
                    kept_pairs: KeptPairs | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(i, j)``, ``j < i``, of rows whose cosine is >= ``threshold``, for vectors too many
    to hold: ``codes``/``scale`` hold the usable rows' encodings (:func:`encode_for_search` with
    :func:`search_map` drawn first from ``rng``) in row order, ``ok`` says which of the ``dim``-d
    rows are usable, and ``fetch(rows)`` returns the raw vectors of the given rows. Candidates come
    from the inverted multi-index (:mod:`prx_assets.core.curate.multi_index`) and are checked on
    the full vectors, fetched ``verify_rows`` at a time, so memory holds the codes (about 132 bytes
    a row) and one block, never every full vector. With ``models`` the multi-index's trained part is
    the kept one of the rows' size generation (trained from ``rng`` and kept when there is none), and
    ``cells(model, model_id, t)`` may give the rows' cells in its table ``t`` where they are kept
    (:func:`~prx_assets.core.curate.multi_index.cell_probes`; ``model_id`` names the kept model).
    ``kept_pairs`` (bound to these rows) gives the candidate pairs found by earlier cuts with the same
    model and whether each held on the full vectors, so only pairs with a row they did not cover are
    searched and checked, and keeps what this cut found (:mod:`prx_assets.core.curate.search_pairs`)."""
    valid = np.flatnonzero(ok)
    if len(valid) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    model = models.model_for(codes, scale, rng) if models is not None else None
    kept_cells, model_id = None, None
    if model is not None and models is not None and models.last is not None:
        model_id = str(models.last["model_id"])
        kept_cells = partial(cells, model, model_id) if cells is not None else None
    candidate = candidate_threshold(threshold, dim)
    known = kept_pairs.known(model_id, candidate) if kept_pairs is not None and model_id is not None else None
    if known is None:
        pairs = multi_index_pairs(codes, scale, candidate, rng, model=model, cells=kept_cells)
        earlier_ok = np.zeros(0, dtype=bool)
    else:  # the kept pairs (both rows searched before) and those with a new row: two disjoint sets
        new, earlier, earlier_ok = known
        pairs = np.concatenate([earlier, multi_index_pairs(codes, scale, candidate, rng, model=model,
                                                           cells=kept_cells, new=new)])
    keep = np.zeros(len(pairs), dtype=bool)
    keep[:len(earlier_ok)] = earlier_ok  # kept pairs were checked on the full vectors when found
    step = max(1, verify_rows // 2)
    for a in range(len(earlier_ok), len(pairs), step):  # each block fetches at most ``verify_rows`` full vectors
        block = pairs[a:a + step]
        rows = np.unique(block)
        full = np.asarray(fetch(valid[rows]), dtype=np.float32)
        full /= np.linalg.norm(full, axis=1, keepdims=True)
        i, j = np.searchsorted(rows, block[:, 0]), np.searchsorted(rows, block[:, 1])
        keep[a:a + len(block)] = np.einsum("ij,ij->i", full[i], full[j]) >= threshold
    if kept_pairs is not None and model_id is not None:
        kept_pairs.stats["pairs_found"] = len(pairs) - len(earlier_ok)
        kept_pairs.keep(model_id, candidate, pairs, keep)
    pairs = pairs[keep]
    return valid[pairs[:, 0]], valid[pairs[:, 1]]


def projection_margin(threshold: float, dims: int) -> float:
    """How much looser the candidate threshold is in a ``dims``-d random projection: six standard
    deviations of a projected cosine near ``threshold`` (about ``(1 - c**2) / sqrt(dims)``), plus 0.01.

    >>> round(projection_margin(0.95, 128), 3)
    0.062
    """
    return 6 * (1 - threshold ** 2) / math.sqrt(dims) + 0.01


def near_duplicates_embedding(vectors: np.ndarray, threshold: float, exact_below: int = EMBEDDING_EXACT_BELOW,
                              overwrite: bool = False, models: SearchModels | None = None) -> list[bool]:
    """Greedy in the given order: keep a vector unless its cosine with a kept one is >= threshold
    (pairs from :func:`embedding_pairs`; rows without a finite vector are kept).

    >>> near_duplicates_embedding(np.array([[1.0, 0.0], [0.99, 0.05], [0.0, 1.0], [np.nan, 0.0]]), 0.95)
    [True, False, True, True]
    """
    n = len(vectors)
    later, earlier = embedding_pairs(vectors, threshold, exact_below=exact_below, overwrite=overwrite, models=models)
    return greedy_keep(n, later, earlier).tolist()
