"""catalog/numpy_sets.py gives NumPy's sets (np.unique, np.union1d) on random integer arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.numpy_sets import sorted_union, sorted_unique

ints = st.lists(st.integers(-(2**62), 2**62) | st.integers(-5, 5), max_size=200)


@settings(max_examples=200, deadline=None)
@given(ints, ints)
def test_unique_and_union_equal_numpys(a: list[int], b: list[int]) -> None:
    x, y = np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)
    assert np.array_equal(sorted_unique(x), np.unique(x)) and sorted_unique(x).dtype == np.int64
    assert np.array_equal(sorted_union(x, y), np.union1d(x, y))
    assert sorted(set(a) | set(b)) == sorted_union(x, y).tolist()
