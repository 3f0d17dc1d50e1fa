"""The tests' own comparison helpers can fail: assert_same_rows against rows_of, the per-row formulation."""

from __future__ import annotations

import pyarrow as pa
import pytest
from compaction_helpers import assert_same_rows, rows_of
from hypothesis import given, settings
from hypothesis import strategies as st

ROWS = st.lists(st.tuples(st.one_of(st.none(), st.integers(-3, 3)), st.sampled_from(["a", "b", None])), max_size=12)


def _table(rows: list[tuple[int | None, str | None]]) -> pa.Table:
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "v": pa.array([r[1] for r in rows], pa.string())})


@settings(max_examples=200, deadline=None)
@given(ROWS, ROWS, st.randoms())
def test_assert_same_rows_agrees_with_rows_of(a: list, b: list, rnd) -> None:  # type: ignore[type-arg, no-untyped-def]
    """Equal as multisets (rows_of, sorting Python tuples) exactly when assert_same_rows passes; a shuffled copy
    always passes."""
    shuffled = list(a)
    rnd.shuffle(shuffled)
    assert_same_rows(_table(shuffled), _table(a), ["k", "v"])
    if rows_of(_table(a), ["k", "v"]) == rows_of(_table(b), ["k", "v"]):
        assert_same_rows(_table(a), _table(b), ["k", "v"])
    else:
        with pytest.raises(AssertionError):
            assert_same_rows(_table(a), _table(b), ["k", "v"])
