"""The latency planner's view of where a session's delta keys fall (planning/delta_ranges.py): footers give the
deltas' key range as the rows would, a clustered update is charged for the files it rewrites (checked against the
files a real compaction then carried), a spread one for all of them, and calibration learns from what the session
did, not from the estimate."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.catalog.key_ranges import footer_key_range
from flash_pipeline.compactor.planning import delta_ranges, latency

PART = {"p": "x"}


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-2**62, 2**62)), min_size=1, max_size=300),
       row_group=st.integers(1, 100), width=st.sampled_from([pa.int64(), pa.int32(), pa.int16()]))
def test_a_footers_range_is_the_columns_min_and_max_or_none_with_a_null(values: list[int | None], row_group: int,
                                                                           width: pa.DataType) -> None:
    bound = 2 ** (width.bit_width - 1)
    values = [None if v is None else v % bound for v in values]
    column = pa.array(values, width)
    sink = io.BytesIO()
    pq.write_table(pa.table({"k": column, "s": pa.array([str(v) for v in values])}), sink, row_group_size=row_group)
    meta = pq.read_metadata(io.BytesIO(sink.getvalue()))
    found = footer_key_range(meta, "k")
    if column.null_count:
        assert found is None
    else:
        mm = pc.min_max(column)
        assert found is not None and (found.low, found.high) == (mm["min"].as_py(), mm["max"].as_py())
    assert footer_key_range(meta, "s") is None and footer_key_range(meta, "missing") is None


def test_a_timestamp_column_gives_no_range() -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({"k": pa.array([1, 2], pa.timestamp("us"))}), sink)
    assert footer_key_range(pq.read_metadata(io.BytesIO(sink.getvalue())), "k") is None


def _table(keys: list[int], version: int) -> pa.Table:
    return pa.table({"id": pa.array(keys, pa.int64()), "v": pa.array([version] * len(keys), pa.int64()),
                     "pad": pa.array([f"row-{k}-{version}" * 3 for k in keys])})


def _compact(cat: Catalog, vectors: bool = True) -> Any:
    options = CompactOptions(primary_keys=("id",), sort_keys=(("v", "ascending"),), destination_compacted_table_id="C",
                             rows_per_compacted_file=100, rows_per_primary_key_index_file=100, deletion_vectors=vectors)
    return compact("S", options, catalog=cat, progress=lambda _: None, executor="in-process").partitions[0]


@pytest.mark.parametrize("vectors", [True, False], ids=["vectors", "no-vectors"])
@pytest.mark.parametrize("shape", ["clustered", "spread", "new keys"])
def test_the_estimate_charges_the_files_a_real_compaction_then_rewrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        shape: str, vectors: bool) -> None:
    """Ten files of 100 keys; 20 updates in one file (20% of it dead: rewritten even with vectors), 40 spread
    over all (4% of each: carried with vectors, all rewritten without), or 30 new keys (no file touched)."""
    rng = random.Random(shape)
    cat = Catalog(tmp_path / "lake")
    cat.append("S", PART, "upsert", [_table(list(range(1000)), 0)])
    _compact(cat, vectors)
    prior = cat.latest_compacted("C", normalize_partition(PART))
    assert prior is not None and len(prior.files) == 10 and all(f.key_range is not None for f in prior.files)
    keys = {"clustered": rng.sample(range(300, 400), 20), "spread": rng.sample(range(1000), 40),
            "new keys": list(range(5000, 5030))}[shape]
    cat.append("S", PART, "upsert", [_table(keys, 1)])
    seen: list[tuple[Any, ...]] = []
    estimate = latency.estimate_workload

    def spy(sizing: Any, deltas: Any, prior_: Any, cpus: int, delta_range: Any = None,
            vector_limit: float = -1.0) -> latency.Workload:
        w = estimate(sizing, deltas, prior_, cpus, delta_range, vector_limit)
        seen.append((w, deltas, delta_range))
        return w

    monkeypatch.setattr(latency, "estimate_workload", spy)
    result = _compact(cat, vectors)
    (w, deltas, delta_range), = seen
    assert delta_range is not None and (delta_range.low, delta_range.high) == (min(keys), max(keys))
    upsert_bytes = sum(d.bytes for d in deltas)
    rewritten = prior.bytes - result.bytes_carried  # what the compaction rewrote of the prior files
    predicted = w.rewrite_bytes - upsert_bytes
    if shape == "spread" and not vectors:  # every file may hold a key: 1 - exp(-4) of each, on average
        assert rewritten == prior.bytes and 0.95 * prior.bytes <= predicted <= prior.bytes
    elif shape == "spread":  # ~4% of each file dies: carried with a vector (one unlucky file may pass 10%)
        assert rewritten <= 0.2 * prior.bytes and abs(predicted - rewritten) <= 0.2 * prior.bytes
    else:  # one file (keys 300-399) or none: charged that, not the table
        assert rewritten < prior.bytes / 5
        assert abs(predicted - rewritten) <= 0.01 * prior.bytes
    observed = latency.observed_workload(w, deltas, prior, result.bytes_carried, result.index_bytes_skipped)
    assert observed.rewrite_bytes == upsert_bytes + rewritten
    assert prior.index is not None
    probed = prior.index.rows - prior.index.rows * result.index_bytes_skipped // prior.index.bytes
    assert abs(observed.indexed_rows - probed) <= 1
    if shape != "spread":
        assert w.indexed_rows < prior.index.rows / 2 and observed.indexed_rows < prior.index.rows / 2


def test_many_delta_files_read_no_footer(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("S", PART, "upsert", [_table(list(range(300)), 0)])
    _compact(cat)
    prior = cat.latest_compacted("C", normalize_partition(PART))
    for i in range(delta_ranges.MAX_FOOTERS + 1):
        cat.append("S", PART, "upsert", [_table([i], 1)])
    deltas = cat.deltas("S", normalize_partition(PART))[1:]
    assert len(deltas) == delta_ranges.MAX_FOOTERS + 1
    reads: list[str] = []
    read_range = cat.storage.read_range

    def spy(key: str, offset: int, length: int) -> bytes:
        reads.append(key)
        return read_range(key, offset, length)

    cat.storage.read_range = spy  # type: ignore[method-assign]
    assert delta_ranges.delta_key_range(cat.storage, deltas, prior) is None and reads == []
    assert delta_ranges.delta_key_range(cat.storage, deltas[:3], prior) is not None and len(reads) == 3
