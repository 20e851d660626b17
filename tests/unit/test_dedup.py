"""Vectorized dedup finds exactly what the all-pairs greedy method finds."""

import numpy as np
import pytest

from prx_assets.core.curate.dedup import first_occurrences, near_duplicates_phash, phash_pairs


def greedy_reference(hashes: list[int], distance: int) -> list[bool]:
    """The definition: keep an item unless it is within ``distance`` bits of an item kept before it."""
    kept: list[int] = []
    out = []
    for h in hashes:
        dup = any((h ^ k).bit_count() <= distance for k in kept)
        out.append(not dup)
        if not dup:
            kept.append(h)
    return out


def clustered(n: int, seed: int) -> list[int]:
    """Random 64-bit hashes, a third of them near copies (1-6 bits flipped) of earlier ones."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(n):
        if out and rng.random() < 0.33:
            h = out[int(rng.integers(len(out)))]
            for b in rng.choice(64, int(rng.integers(1, 7)), replace=False):
                h ^= 1 << int(b)
        else:
            h = int(rng.integers(0, 2**63)) | (int(rng.integers(0, 2)) << 63)
        out.append(h)
    return out


@pytest.mark.parametrize(("n", "distance", "seed"), [(2000, 4, 0), (3000, 2, 1), (1500, 8, 2), (500, 0, 3),
                                                     (4000, 6, 4)])
def test_the_same_items_as_all_pairs(n: int, distance: int, seed: int) -> None:
    hashes = clustered(n, seed)
    assert near_duplicates_phash(hashes, distance) == greedy_reference(hashes, distance)


def test_every_pair_within_the_distance_is_found() -> None:
    hashes = clustered(1200, 7)
    h = np.array(hashes, dtype=np.uint64)
    i, j = phash_pairs(h, 5, chunk=100)  # small chunks: the expansion is chunked too
    found = set(zip(i.tolist(), j.tolist(), strict=True))
    expected = {(a, b) for a in range(len(hashes)) for b in range(a)
                if (hashes[a] ^ hashes[b]).bit_count() <= 5}
    assert found == expected and expected


def test_exact_dedup_keeps_first_occurrences() -> None:
    assert first_occurrences(np.array(["b", "a", "b", "c", "a"])).tolist() == [True, True, False, True, False]
    assert near_duplicates_phash([], 4) == []
