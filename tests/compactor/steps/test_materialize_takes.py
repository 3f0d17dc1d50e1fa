"""Materialize takes a unit's survivors record batch by record batch (steps/materialize.py: _taken_pieces);
checked against one plain take of the whole table, on tables whose columns are chunked differently."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.steps import materialize
from flash_pipeline.compactor.steps.materialize import _taken_pieces


def _chunked(values: list, cuts: list[int], type_: pa.DataType) -> pa.ChunkedArray:
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(values))), len(values)]
    return pa.chunked_array([pa.array(values[a:b], type_) for a, b in zip(bounds, bounds[1:])], type_)


def _table(n: int, seed: int, cuts_a: list[int], cuts_b: list[int]) -> pa.Table:
    rng = np.random.default_rng(seed)
    ints = rng.integers(0, 1 << 40, n).tolist()
    text = [None if x % 7 == 0 else f"row-{i}-" + "x" * int(x % 13) for i, x in enumerate(ints)]
    return pa.table({"k": _chunked(ints, cuts_a, pa.int64()), "s": _chunked(text, cuts_b, pa.string())})


def _bucketed_rows(n: int, seed: int, buckets: int, keep: float) -> np.ndarray:
    """Survivors as dedupe hands them to materialize: bucket by bucket, each bucket's rows ascending."""
    rng = np.random.default_rng(seed + 1)
    rows = np.flatnonzero(rng.random(n) < keep)
    return rows[np.argsort(rng.integers(0, buckets, len(rows)), kind="stable")]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 6000),
    seed=st.integers(0, 2**31),
    cuts_a=st.lists(st.integers(0, 6000), max_size=6),
    cuts_b=st.lists(st.integers(0, 6000), max_size=6),
    buckets=st.integers(1, 8),
    keep=st.floats(0.0, 1.0),
    piece_rows=st.integers(1, 3000),
    scattered=st.booleans(),
)
def test_taken_pieces_equal_one_take(n: int, seed: int, cuts_a: list[int], cuts_b: list[int], buckets: int, keep: float,
                                     piece_rows: int, scattered: bool) -> None:
    table = _table(n, seed, cuts_a, cuts_b)
    rows = _bucketed_rows(n, seed, buckets, keep)
    if scattered:
        rows = np.random.default_rng(seed).permutation(rows)
    pieces = list(_taken_pieces([table], rows, piece_rows))
    assert all(0 < p.num_rows <= piece_rows for p in pieces)
    got = pa.concat_tables(pieces) if pieces else table.slice(0, 0)
    assert got.equals(table.take(pa.array(rows, pa.int64())))


def test_a_run_of_units_is_taken_in_order() -> None:
    units = [_table(n, n, [n // 2], []) for n in (5, 300, 1, 40)]
    rows = np.array([0, 4, 5, 200, 304, 305, 306, 345], dtype=np.int64)
    got = pa.concat_tables(list(_taken_pieces(units, rows, 3)))
    assert got.equals(pa.concat_tables(units).take(pa.array(rows)))


def test_a_large_units_string_columns_are_never_taken_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of taking batch by batch: every take of bucketed survivors reads one chunk per column."""
    table = _table(40_000, 3, [10_000, 20_000, 30_000], [10_000, 20_000, 30_000])
    rows = _bucketed_rows(40_000, 3, 4, 0.8)
    chunks_seen = []
    take = materialize._take_rows

    def counting(t: pa.Table, r: np.ndarray) -> pa.Table:
        chunks_seen.append(max(c.num_chunks for c in t.columns))
        return take(t, r)

    monkeypatch.setattr(materialize, "_take_rows", counting)
    got = pa.concat_tables(list(_taken_pieces([table], rows, 4096)))
    assert got.equals(table.take(pa.array(rows)))
    assert chunks_seen and max(chunks_seen) == 1
