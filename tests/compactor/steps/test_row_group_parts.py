"""A row group larger than a task's share of the round budget is cut into parts (source_io.split_units): one
reader streams a group's parts in order, hash bucket and materialize keep them in one task, and the compacted
rows -- and the index pointers a later session dedupes against -- are those of the issue's semantics (DuckDB)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline import Catalog
from flash_pipeline.compactor.planning.rounds import MIN_UNIT_ROWS
from flash_pipeline.compactor.steps import source_io
from flash_pipeline.verify import verify
from tests.compaction_helpers import FILE, OP, POS, ROW, DeltaLog, oracle, read_compacted, rows_of, run_compact

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("name", pa.string()), ("x", pa.float64()), ("flag", pa.bool_())])


def _upserts(rng: np.random.Generator, n: int, key_space: int) -> pa.Table:
    names = np.char.add("n-", rng.integers(0, 1000, n).astype(str)).astype(object)
    names[rng.random(n) < 0.2] = None
    return pa.table({"k": rng.integers(0, key_space, n), "ts": rng.integers(0, 50, n), "name": pa.array(names, pa.string()),
                     "x": rng.random(n), "flag": rng.random(n) < 0.5}, schema=SCHEMA)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), deltas=st.integers(1, 3), delete_share=st.floats(0.0, 0.3))
def test_parts_of_large_row_groups_give_the_oracles_rows(tmp_path_factory, seed: int, deltas: int, delete_share: float) -> None:
    root = tmp_path_factory.mktemp("lake")
    _check_parts(Catalog(root / "lake"), root, np.random.default_rng(seed), deltas, delete_share)


def test_parts_of_large_row_groups_on_s3_give_the_oracles_rows(s3_lake: Catalog, tmp_path) -> None:
    """The same on an S3 lake (moto server): the part reader's ranged reads through PyArrow's S3 file system."""
    _check_parts(s3_lake, tmp_path, np.random.default_rng(15), 2, 0.1)


def _check_parts(cat: Catalog, root, rng: np.random.Generator, deltas: int, delete_share: float) -> None:  # type: ignore[no-untyped-def]
    key_space = int(rng.integers(15_000, 40_000))
    log = DeltaLog(cat, "T", (), SCHEMA)
    log.append("upsert", [_upserts(rng, int(rng.integers(20_000, 30_000)), key_space)])
    # no budget: the prior compacted file gets one row group of all its rows
    run_compact(log.cat, "T", ["k"], [("ts", "ascending")], executor="in-process", hash_bucket_count=3)

    def append_upsert_file(rows: int, row_group_rows: int) -> None:
        path = root / f"u{len(log.records)}.parquet"
        table = _upserts(rng, rows, key_space)
        pq.write_table(table, path, row_group_size=row_group_rows)
        position = log.cat.append("T", (), "upsert", [path]).position
        log.records.extend({**row, POS: position, FILE: 1, ROW: i, OP: "upsert"} for i, row in enumerate(table.to_pylist()))

    for _ in range(deltas):  # one row group each, as a single Spark task writes a delta
        rows = int(rng.integers(21_000, 62_000))
        append_upsert_file(rows, rows)
    keys = rng.integers(0, key_space, max(1, int(delete_share * 10_000)))
    log.append("delete", [pa.table({"k": keys}, schema=pa.schema([("k", pa.int64())]))])
    append_upsert_file(int(rng.integers(25_000, 40_000)), 6_000)  # many small row groups: runs of whole groups

    opened: Counter[tuple[str, tuple[int, ...], tuple[str, ...] | None]] = Counter()
    units: list[tuple[int, int]] = []  # (rows, rows of its row group) of every part read
    real_open, real_read = source_io._GroupParts._open, source_io._GroupParts.read

    def counting_open(self, source, columns):  # type: ignore[no-untyped-def]
        opened[(source.key, source.row_groups, columns)] += 1
        return real_open(self, source, columns)

    def counting_read(self, source, columns, schema):  # type: ignore[no-untyped-def]
        units.append((source.rows, source.group_rows))
        return real_read(self, source, columns, schema)

    # the least budget: tasks of MIN_UNIT_ROWS rows, so every one-group delta and the prior file come in parts
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source_io._GroupParts, "_open", counting_open)
        patch.setattr(source_io._GroupParts, "read", counting_read)
        run_compact(log.cat, "T", ["k"], [("ts", "ascending")], executor="in-process", max_round_bytes=1)
    assert units and all(rows <= MIN_UNIT_ROWS < group for rows, group in units), units
    parts_of = Counter(group for _, group in units)
    assert any(n >= 3 for n in parts_of.values()), parts_of
    # each group decoded once by hash bucket (key columns) and once by materialize (all columns)
    assert opened and max(opened.values()) == 1, opened
    assert {columns for _, _, columns in opened} == {("k", "ts"), tuple(SCHEMA.names)}, set(opened)
    expected = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert rows_of(read_compacted(log.cat, "T", ()), SCHEMA.names) == rows_of(expected, SCHEMA.names)
    assert verify(log.cat, "T").ok

    # the next session dedupes against the index the parts' layout pointed into
    append_upsert_file(int(rng.integers(5_000, 9_000)), 10_000)
    run_compact(log.cat, "T", ["k"], [("ts", "ascending")], executor="in-process")
    expected = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert rows_of(read_compacted(log.cat, "T", ()), SCHEMA.names) == rows_of(expected, SCHEMA.names)
