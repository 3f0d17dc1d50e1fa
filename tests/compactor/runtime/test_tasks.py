"""The Ray task wrappers' own logic, without Ray: coalesced units packed into one Ray object and back."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.runtime.tasks import pack_units, unpack_units


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.integers(0, 1000), st.lists(st.integers(-5, 5), max_size=6), max_size=8))
def test_packed_units_unpack_to_the_same_units(rows: dict[int, list[int]]) -> None:
    """Units of any sizes (empty ones too) come back under their src ids with their rows in order, as zero-copy
    slices of one contiguous table."""
    units = {src: pa.table({"k": pa.array(values, pa.int64()), "s": pa.array([str(v) for v in values], pa.string())}) for src, values in rows.items()}
    srcs, offsets, table = pack_units(units)
    assert list(srcs) == sorted(units) and len(offsets) == len(units) + 1
    back = unpack_units((srcs, offsets, table))
    assert {src: t.to_pylist() for src, t in back.items()} == {src: t.to_pylist() for src, t in units.items()}
    if table is not None:
        assert table.column("k").num_chunks == 1  # one contiguous table: few buffers in the object store
