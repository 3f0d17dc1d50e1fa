"""Whole-row copies of envelopes and index rows give exactly the rows (every field, every byte) NumPy's
field-by-field copies give, whatever the byte order of the parts, the mask or the positions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.index.pk_index import index_dtype
from flash_pipeline.compactor.model.rows import concat_rows, take_rows
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype


def _rows(rng: np.random.Generator, dtype: np.dtype, n: int) -> np.ndarray:
    rows = np.empty(n, dtype=dtype)
    rows.view(np.uint8)[:] = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    return rows


def _as_lists(rows: np.ndarray) -> list[tuple[object, ...]]:
    return rows.tolist()  # field values, so byte order differences between equal rows do not matter


DTYPES = st.sampled_from([envelope_dtype(0), envelope_dtype(9), index_dtype(0), index_dtype(13)])


@settings(max_examples=100, deadline=None)
@given(dtype=DTYPES, sizes=st.lists(st.integers(0, 40), max_size=5), seed=st.integers(0, 2**32 - 1), native=st.booleans())
def test_concat_rows_equals_numpys_concatenation(dtype: np.dtype, sizes: list[int], seed: int, native: bool) -> None:
    rng = np.random.default_rng(seed)
    parts = [_rows(rng, dtype, n) for n in sizes]
    if native:  # a part in native byte order, as an earlier concatenation may hand back
        parts = [p.astype(p.dtype.newbyteorder("=")) if i % 2 else p for i, p in enumerate(parts)]
    got = concat_rows(parts, dtype)
    assert got.dtype == dtype
    expected = (np.concatenate(parts) if parts else np.empty(0, dtype=dtype)).astype(dtype)  # NumPy may hand back native order
    assert _as_lists(got) == _as_lists(expected)
    assert got.tobytes() == expected.tobytes()


@settings(max_examples=100, deadline=None)
@given(dtype=DTYPES, n=st.integers(0, 60), seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["mask", "positions", "strided"]))
def test_take_rows_equals_numpys_indexing(dtype: np.dtype, n: int, seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    rows = _rows(rng, dtype, n)
    if kind == "strided":  # a view of every other row (a slice of a larger array)
        rows = _rows(rng, dtype, 2 * n)[::2]
    which = rng.random(len(rows)) < 0.5 if kind == "mask" else rng.integers(0, max(1, len(rows)), rng.integers(0, 80) if len(rows) else 0)
    got = take_rows(rows, which)
    assert got.dtype == dtype
    assert got.tobytes() == rows[which].tobytes()
