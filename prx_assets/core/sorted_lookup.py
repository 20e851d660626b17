"""Membership of many values in a sorted array, vectorized (the join behind kept pairs, kept pHash
pairs, lab keys and row ids)."""

from __future__ import annotations

import numpy as np

#: Above this many queries in no order, they are sorted before the search: a binary search per
#: query in random order misses the cache at every level (10M queries into 10M values: 13.6 s),
#: one in ascending order walks the values once (an argsort and that search: 2.6 s).
SORT_QUERIES_ABOVE = 4096


def lookup(sorted_values: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether each of ``queries`` is in the ascending ``sorted_values``, and its position there
    (a valid index, meaningless where it is not in it; zeros when ``sorted_values`` is empty).

    >>> hit, at = lookup(np.array([2, 5, 9]), np.array([5, 1, 9, 10]))
    >>> hit.tolist(), at[hit].tolist()
    ([True, False, True, False], [1, 2])
    """
    queries = np.asarray(queries)
    if not len(sorted_values):
        return np.zeros(len(queries), dtype=bool), np.zeros(len(queries), dtype=np.int64)
    if len(queries) > SORT_QUERIES_ABOVE and not bool((queries[1:] >= queries[:-1]).all()):
        order = np.argsort(queries, kind="stable")
        at = np.empty(len(queries), dtype=np.int64)
        at[order] = np.searchsorted(sorted_values, queries[order])
    else:
        at = np.searchsorted(sorted_values, queries).astype(np.int64, copy=False)
    np.minimum(at, len(sorted_values) - 1, out=at)
    return sorted_values[at] == queries, at
