"""Sorted sets of integers as NumPy arrays: ``np.unique`` and ``np.union1d`` without their masked-array check.

NumPy's set functions ask ``np.ma.is_masked`` of their input, and that first question imports ``numpy.ma``
(~15 ms, holding the GIL, in a fresh ``flash-compactor`` process); a sort and a comparison give the same sets.
"""

from __future__ import annotations

import numpy as np


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D array, ascending (``np.unique(values)``)."""
    out = np.sort(np.asarray(values).reshape(-1))
    if len(out) < 2:
        return out
    keep = np.empty(len(out), dtype=bool)
    keep[0] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    return out[keep]


def sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct values of both 1-D arrays, ascending (``np.union1d(a, b)``)."""
    return sorted_unique(np.concatenate((np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))))
