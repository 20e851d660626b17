"""Membership of many values in a sorted array, vectorized (the join behind kept pairs, kept pHash
pairs, lab keys and row ids)."""

from __future__ import annotations

import numpy as np


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
    at = np.minimum(np.searchsorted(sorted_values, queries), len(sorted_values) - 1)
    return sorted_values[at] == queries, at
