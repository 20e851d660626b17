"""The batch forms of the content digest and subset hash give exactly the row-by-row bytes."""

import doctest

import numpy as np
import pyarrow as pa

import prx_assets.core.curate.digests as digests
from prx_assets.core.curate.digests import content_digest, content_hash, content_hash_of, digests_of

AWKWARD = ["a cat", 'a "quoted" cat', "back\\slash", "tab\there", "new\nline", "caf\u00e9", "snow \u2603",
           "emoji \U0001f600", "", "\x7f del", "\x00 nul", "'single'", None]


def test_digests_of_equals_the_row_by_row_definition() -> None:
    rng = np.random.default_rng(0)
    n = 400
    caps_a = [AWKWARD[i] for i in rng.integers(0, len(AWKWARD), n)]
    caps_b = [AWKWARD[i] for i in rng.integers(0, len(AWKWARD), n)]
    sha = [f"{i:064x}" for i in range(n)]
    cfg = ["q92-abc" if i % 7 else "q92 \u00e9" for i in range(n)]
    t = pa.table({"sha256": sha, "ingest_config": cfg, "caption__b": caps_b, "caption__a": caps_a})
    for cols in ([], ["caption__a"], ["caption__b", "caption__a"]):
        expected = [content_digest(sha[k], cfg[k], {c: t.column(c)[k].as_py() for c in cols}) for k in range(n)]
        assert digests_of(t, cols).to_pylist() == expected
        assert digests_of(t.to_batches(max_chunksize=37)[1], cols).to_pylist() == expected[37:74]


def test_content_hash_of_equals_the_streamed_definition() -> None:
    ids = [f"{i:016x}" for i in range(1000)]
    dig = [f"{(i * 7919) % 10**6:016d}" for i in range(1000)]
    t = pa.table({"image_id": ids, "digest": dig})
    cols = ["caption__a", "caption__b"]
    assert content_hash_of(cols, t, chunk=64) == content_hash(cols, zip(ids, dig, strict=True))
    assert content_hash_of(cols, t.slice(100, 300)) == content_hash(cols, zip(ids[100:400], dig[100:400], strict=True))
    odd = pa.table({"image_id": ['x"1', "caf\u00e9", "plain"], "digest": ["d1", "d2", "d3"]})
    assert content_hash_of(cols, odd) == content_hash(cols, zip(*odd.to_pydict().values(), strict=True))
    assert content_hash_of([], t.slice(0, 0)) == content_hash([], [])


def test_digest_examples_hold() -> None:
    assert doctest.testmod(digests).failed == 0
