"""Key ranges (flash_pipeline/catalog/key_ranges.py): the first key column's [min, max] of a set of rows, known
only for integer columns without nulls, checked against Python's own min and max on random inputs."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.key_ranges import KeyRange, KeyRangeBuilder, merged
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.catalog.files import ContentType

INT_TYPES = {
    pa.int8(): (-(1 << 7), (1 << 7) - 1), pa.int64(): (-(1 << 63), (1 << 63) - 1),
    pa.uint8(): (0, (1 << 8) - 1), pa.uint64(): (0, (1 << 64) - 1),
}


@st.composite
def batches(draw: st.DrawFn) -> tuple[pa.DataType, list[list[int | None]]]:
    t = draw(st.sampled_from(list(INT_TYPES)))
    lo, hi = INT_TYPES[t]
    values = st.one_of(st.none(), st.integers(lo, hi)) if draw(st.booleans()) else st.integers(lo, hi)
    return t, draw(st.lists(st.lists(values, max_size=6), max_size=4))


@settings(max_examples=150, deadline=None)
@given(batches())
def test_the_range_of_integer_batches_is_their_min_and_max_unless_a_null_is_seen(case: tuple[pa.DataType, list[list[int | None]]]) -> None:
    t, parts = case
    whole = KeyRangeBuilder("k")
    per_part = []
    for values in parts:
        table = pa.table({"k": pa.array(values, type=t), "v": pa.array([0] * len(values))})
        whole.add(table)
        one = KeyRangeBuilder("k")
        one.add(table)
        per_part.append(one)
    flat = [v for values in parts for v in values]
    if any(v is None for v in flat):
        expected = None
    elif flat:
        expected = KeyRange("k", min(flat), max(flat))
    else:
        expected = None  # no row seen: nothing to describe
    assert whole.result() == expected
    assert merged(per_part, "k") == expected  # Ray tasks' builders, merged by the driver
    if expected is not None:
        assert DataFile.from_json(DataFile(1, "x", 1, 1, ContentType.PARQUET, key_range=expected).to_json()).key_range == expected


def test_columns_without_an_exact_integer_order_get_no_range() -> None:
    for values in ([0.0, -0.0, float("nan")], ["a", "b"], [True, False]):
        b = KeyRangeBuilder("k")
        b.add(pa.table({"k": values}))
        assert b.result() is None, values
    b = KeyRangeBuilder("k")
    b.add(pa.table({"other": [1, 2]}))
    assert b.result() is None, "a batch without the column"
    assert merged([KeyRangeBuilder("k"), None], "k") is None, "a task that gathered nothing"


def test_ranges_overlap_as_closed_intervals_and_never_across_columns() -> None:
    r = KeyRange("k", 10, 20)
    assert r.overlaps(KeyRange("k", 20, 30)) and r.overlaps(KeyRange("k", 0, 10)) and r.overlaps(KeyRange("k", 12, 13))
    assert not r.overlaps(KeyRange("k", 21, 30)) and not r.overlaps(KeyRange("k", -5, 9))
    assert r.overlaps(KeyRange("other", 100, 200)), "a range of another column proves nothing"
