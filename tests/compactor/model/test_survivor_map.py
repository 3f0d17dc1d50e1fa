"""The survivor map (a bucket number per input row) gives materialize the same rows in the same order as the
survivors' ranks did: unit by unit, within a unit bucket by bucket, ascending -- the order the index writers
compute pointers with."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.model.plans import rank_of
from flash_pipeline.compactor.model.survivors import SurvivorMap, map_bytes, map_dtype
from flash_pipeline.compactor.steps.materialize import _rows_of_run
from flash_pipeline.errors import IntegrityError


def _model(units: list[list[int | None]], run: list[int]) -> list[int]:
    """Plain Python: indices into the run's concatenated rows, unit by unit, bucket by bucket, row by row."""
    out, start = [], 0
    for src in run:
        kept = units[src]
        for bucket in sorted({b for b in kept if b is not None}):
            out.extend(start + row for row, b in enumerate(kept) if b == bucket)
        start += len(kept)
    return out


@settings(max_examples=50, deadline=None)
@given(data=st.data(), bucket_count=st.sampled_from([1, 3, 17, 254, 255, 300]))
def test_rows_of_a_run_follow_the_layouts_order(data: st.DataObject, bucket_count: int) -> None:
    n_units = data.draw(st.integers(1, 6))
    units = [
        data.draw(st.lists(st.one_of(st.none(), st.integers(0, bucket_count - 1)), max_size=40))
        for _ in range(n_units)
    ]
    survivors = SurvivorMap.for_units([len(u) for u in units], bucket_count)
    assert survivors.buckets.dtype == map_dtype(bucket_count)
    bucket_ranks = []
    for bucket in range(bucket_count):  # each bucket's survivors as dedupe returns them: ranks ascending
        ranks = np.array([int(rank_of(src, row)) for src, kept in enumerate(units) for row, b in enumerate(kept) if b == bucket],
                         dtype=np.int64)
        bucket_ranks.append(ranks)
        survivors.mark(bucket, ranks)
    first = data.draw(st.integers(0, n_units - 1))
    run = list(range(first, data.draw(st.integers(first + 1, n_units))))
    expected = _model(units, run)
    assert survivors.rows_of_run(run).tolist() == expected
    assert _rows_of_run(bucket_ranks, run, [len(units[s]) for s in run]).tolist() == expected


def test_a_rank_past_its_unit_is_an_integrity_error() -> None:
    survivors = SurvivorMap.for_units([3, 2], 4)
    with pytest.raises(IntegrityError, match="bucket 1"):
        survivors.mark(1, np.array([int(rank_of(1, 2))]))
    with pytest.raises(IntegrityError, match="bucket 2"):
        survivors.mark(2, np.array([int(rank_of(2, 0))]))


def test_a_map_costs_a_byte_a_row_below_255_buckets() -> None:
    assert map_bytes(1000, 48) == 1000
    assert map_bytes(1000, 255) == 2000  # 255 itself marks a row no bucket kept
    assert map_bytes(1000, 70_000) == 4000
