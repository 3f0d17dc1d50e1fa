"""The planner's arithmetic (planning/sizing.py): bucket counts and round budgets, against the paper's rules."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.model.options import MAX_HASH_BUCKETS
from flash_pipeline.compactor.planning.sizing import (
    check_bucket_count,
    choose_bucket_count,
    dedupe_bytes_per_row,
    default_round_budget,
    delta_round_bytes,
)
from flash_pipeline.errors import FlashError

FAST = settings(max_examples=300, deadline=None)
rows_st = st.integers(0, 10**10)
memory_st = st.integers(64 << 20, 64 << 30)


@FAST
@given(rows_st, st.integers(0, 40), memory_st, st.integers(1, 64))
def test_a_fresh_index_uses_at_most_half_of_task_memory_per_bucket(rows: int, width: int, memory: int, cpus: int) -> None:
    choice = choose_bucket_count(rows, width, memory, cpus)
    assert not choice.rehash_needed and choice.bucket_count >= 1
    assert rows * dedupe_bytes_per_row(width) / choice.bucket_count <= 0.5 * memory
    # the fewest buckets that fit, raised to one per CPU (at most one per 100k rows) for parallelism
    need = max(1, math.ceil(rows * dedupe_bytes_per_row(width) / (0.5 * memory)))
    assert choice.bucket_count == max(need, min(cpus, max(1, rows // 100_000)) if rows else 1)


@FAST
@given(rows_st, st.integers(0, 40), memory_st, st.integers(1, 64), st.integers(1, 4096))
def test_an_inherited_count_is_kept_below_90_percent_and_rehashed_above(rows: int, width: int, memory: int, cpus: int, inherited: int) -> None:
    choice = choose_bucket_count(rows, width, memory, cpus, inherited=inherited)
    use = rows * dedupe_bytes_per_row(width) / inherited / memory
    if use > 0.9:
        assert choice.rehash_needed and choice.bucket_count >= inherited
        assert rows * dedupe_bytes_per_row(width) / choice.bucket_count <= 0.5 * memory + dedupe_bytes_per_row(width)
    else:
        assert not choice.rehash_needed and choice.bucket_count == inherited


@FAST
@given(st.integers(1, MAX_HASH_BUCKETS), st.one_of(st.none(), st.integers(1, 4096)))
def test_a_requested_count_wins_and_rehashes_a_different_index(requested: int, inherited: int | None) -> None:
    choice = choose_bucket_count(10**6, 8, 1 << 30, 2, inherited=inherited, requested=requested)
    assert choice.bucket_count == requested
    assert choice.rehash_needed == (inherited is not None and inherited != requested)


@pytest.mark.parametrize(("bad", "why"), [(0, "out of range"), (-1, "out of range"), (MAX_HASH_BUCKETS + 1, "out of range"),
                                         (True, "not a whole number"), (2.0, "not a whole number"), ("3", "not a whole number"),
                                         (None, "not a whole number")])
def test_bucket_counts_outside_the_documented_range_are_refused(bad: object, why: str) -> None:
    with pytest.raises(FlashError, match=f"{why}: use 1 to {MAX_HASH_BUCKETS}"):
        check_bucket_count(bad)


@FAST
@given(st.integers(0, 10**9), st.integers(0, 40), st.integers(0, 10**6))
def test_round_bytes_grow_with_rows_and_width(rows: int, width: int, more_rows: int) -> None:
    base = delta_round_bytes(rows, width)
    assert base >= 0
    assert delta_round_bytes(rows + more_rows, width + 1) >= base


@FAST
@given(st.integers(0, 1 << 40), st.integers(0, 1 << 40))
def test_the_default_round_budget_is_half_the_smaller_memory_with_a_floor(heap: int, store: int) -> None:
    assert default_round_budget(heap, store) == max(16 << 20, min(heap, store) // 2)
    assert default_round_budget(heap, store) <= max(16 << 20, heap, store)
