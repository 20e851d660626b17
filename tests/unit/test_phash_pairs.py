"""Kept pHash pairs (core/curate/phash_pairs.py): the pairs with a new hash, added to the kept ones
among the others, are every pair, so each cut keeps exactly the images a whole search keeps."""

from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.dedup import PHASH_NEW_SHARE, phash_blocks, phash_keep, phash_pairs
from prx_assets.core.curate.phash_pairs import PhashPairsError, phash_pairs_kept
from prx_assets.core.curate.recipes import Dedup, Recipe
from prx_assets.core.curate.selection import select
from tests.unit.test_dedup import clustered


@pytest.mark.parametrize(("n", "distance", "seed"), [(20_000, 4, 0), (30_000, 2, 1), (5_000, 8, 2), (20_000, 6, 4)])
def test_pairs_with_a_new_hash_are_the_whole_searchs_pairs_with_one(n: int, distance: int, seed: int) -> None:
    """Both the block method's lookups and multi-index hashing (``30_000, 2``) give, with ``new``,
    exactly the pairs of a whole search that hold a new hash; so does the whole search that many new
    hashes take (above ``PHASH_NEW_SHARE``), and with every hash new, every pair."""
    h = np.unique(np.array(clustered(n, seed), dtype=np.uint64))
    np.random.default_rng(seed).shuffle(h)
    draws = np.random.default_rng(seed + 1).random(len(h))
    whole = np.stack(phash_pairs(h, distance), axis=1)
    for share in (0.05, PHASH_NEW_SHARE, 0.3, 1.0):
        new = draws < share
        got = np.stack(phash_pairs(h, distance, new=new), axis=1)
        assert np.array_equal(got, whole[new[whole[:, 0]] | new[whole[:, 1]]]), share
        assert len(got) > 50
    assert len(phash_pairs(h, distance, new=np.zeros(len(h), bool))[0]) == 0
    if (n, distance) == (30_000, 2):
        assert phash_blocks(distance, len(h)) is None  # this case runs multi-index hashing


def test_kept_pairs_keep_what_a_whole_search_keeps(tmp_path: Path) -> None:
    """Cold, warm, a batch of near copies of kept hashes, hashes gone, another distance, an older
    version's cut (keeps nothing) and a corrupt file: every step keeps what a whole search keeps."""
    root = DataRoot(str(tmp_path / "data"))
    kept = phash_pairs_kept(root, "r")
    rng = np.random.default_rng(3)
    base = np.array(clustered(6_000, 5), dtype=np.uint64)

    def step(h: np.ndarray, distance: int = 4, keep_found: bool = True) -> dict[str, object]:
        got = phash_keep(h, distance, kept=kept, keep_found=keep_found)
        assert np.array_equal(got, phash_keep(h, distance))
        return dict(kept.stats)

    cold = step(base)
    assert cold["pairs_kept"] == 0 and cold["pairs_found"] > 500 and cold["kept"]
    warm = step(base)
    assert warm == {"hashes_new": 0, "pairs_kept": cold["pairs_found"], "pairs_found": 0, "kept": True}
    copies = base[rng.choice(len(base), 400, replace=False)] ^ (np.uint64(1) << rng.integers(0, 64, 400).astype(np.uint64))
    grown = np.concatenate([base, copies, np.array(clustered(300, 9), dtype=np.uint64)])
    order = rng.permutation(len(grown))  # another greedy order: the pairs do not depend on it
    after = step(grown[order])
    assert after["hashes_new"] > 300 and after["pairs_found"] > 300
    fewer = grown[order][::3]
    gone = step(fewer)
    assert gone["hashes_new"] == 0 and gone["pairs_found"] == 0
    other = step(fewer, distance=6)  # another distance: its own file, the other deleted
    assert other["pairs_kept"] == 0
    assert [p.rpartition("/")[2] for p in root.list(layout.phash_pairs("r", 1, 6).rpartition("/")[0])] == \
        ["phash-v1-d6.npz"]
    older = step(grown, distance=6, keep_found=False)  # e.g. a cut of an older version
    assert older["hashes_new"] > 0 and not older["kept"]
    assert step(fewer, distance=6)["hashes_new"] == 0  # the older cut kept nothing
    (tmp_path / "data" / layout.phash_pairs("r", 1, 6)).write_bytes(b"not pairs")
    with pytest.raises(PhashPairsError, match=r"phash-v1-d6\.npz"):
        step(fewer, distance=6)


def test_a_cut_with_kept_phash_pairs_gives_the_same_subset(tmp_path: Path) -> None:
    """Through ``select``: a lab, then a batch of near copies (one bit off) of its images' hashes;
    each cut with kept pairs equals one without, and only the new batch's hashes are searched."""
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    hashes = np.array(clustered(3_000, 11), dtype=np.uint64)

    def write(first: int, h: np.ndarray, mode: str) -> None:
        n = len(h)
        ids = [f"{first + i:012x}" for i in range(n)]
        lance.write_dataset(pa.table({
            "image_id": ids, "uri": [f"/d/{i}.jpg" for i in ids], "sha256": [f"{first + i:064x}" for i in range(n)],
            "ingest_config": ["q92"] * n, "phash": pa.array(h, pa.uint64()),
            "width": pa.array(np.full(n, 512), pa.int32()), "height": pa.array(np.full(n, 512), pa.int32()),
            "aspect_bucket": ["1:1"] * n}), uri, mode=mode, max_rows_per_file=1_000)

    recipe = Recipe(name="r", dedup=Dedup(exact=True, phash_distance=3))
    write(0, hashes, "create")
    first = select(lance.dataset(uri), recipe, phash_pairs=phash_pairs_kept(root, "r"))
    assert first.work["phash_pairs"]["hashes_new"] == first.total - first.dropped["dedup_exact"]
    assert first.image_ids == select(lance.dataset(uri), recipe).image_ids
    write(10**6, hashes[:500] ^ np.uint64(1 << 7), "append")
    again = select(lance.dataset(uri), recipe, phash_pairs=phash_pairs_kept(root, "r"))
    whole = select(lance.dataset(uri), recipe)
    assert again.image_ids == whole.image_ids and again.dropped == whole.dropped
    assert again.dropped["dedup_phash"] >= first.dropped["dedup_phash"] + 400
    assert 0 < again.work["phash_pairs"]["hashes_new"] <= 500
