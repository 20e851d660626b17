"""Membership in a sorted array (core/sorted_lookup.py), whichever path the queries take."""

import numpy as np

from prx_assets.core.sorted_lookup import SORT_QUERIES_ABOVE, lookup


def test_sorted_lookup_in_any_order_of_queries() -> None:
    """Queries sorted first (many, in no order) or searched as they come give the same answer."""
    rng = np.random.default_rng(5)
    values = np.unique(rng.integers(0, 50_000, 20_000, dtype=np.uint64))
    for n in (10, SORT_QUERIES_ABOVE + 1, 30_000):
        queries = rng.integers(0, 50_001, n, dtype=np.uint64)
        for q in (queries, np.sort(queries)):
            hit, at = lookup(values, q)
            assert hit.tolist() == np.isin(q, values).tolist()
            assert (values[at[hit]] == q[hit]).all() and (at >= 0).all() and (at < len(values)).all()
    assert lookup(np.zeros(0, np.uint64), np.arange(5, dtype=np.uint64))[0].tolist() == [False] * 5
