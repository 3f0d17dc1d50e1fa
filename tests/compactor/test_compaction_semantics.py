"""Randomized acceptance tests: the compacted table equals an independent DuckDB formulation of the semantics.

Streams are small (1-6 deltas, 1-3 files per delta, 0-8 rows per file, empty files included) over a composite
primary key drawn from a tiny pool of values (two string columns whose concatenations collide, with "", "null"
and null, plus an int column with null), so duplicates, ties, deletes of absent keys, delete-then-reinsert and
older sort keys arriving later are all frequent. Every example runs in a fresh temporary lake.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import (
    DeltaLog,
    assert_layout_invariants,
    fresh_lake,
    kernel_form,
    oracle,
    read_compacted,
    rows_of,
    run_compact,
)
from compaction_streams import COLUMNS, FAST, PARTITION, PKS, SCHEMA, streams

def _check(cat: Any, table_id: str, log: DeltaLog, sort_keys: Any, s: dict[str, Any], up_to: int | None = None) -> list[tuple]:
    expected = rows_of(oracle(log.log_table(up_to), PKS, sort_keys, COLUMNS), COLUMNS)
    got = rows_of(read_compacted(cat, table_id, PARTITION), COLUMNS)
    assert got == expected
    assert_layout_invariants(cat, table_id, PARTITION, s["rows_per_file"], s["rows_per_index_file"])
    return got


# in this process with the kernels as Numba's machine code and as their Python source (kernels/jit.py), and on Ray
EXECUTORS = pytest.mark.parametrize("executor, form", [("in-process", "compiled"), ("in-process", "interpreted"), ("ray", "auto")])


@EXECUTORS
@FAST
@given(s=streams())
def test_compacted_table_equals_duckdb_oracle(s: dict[str, Any], executor: str, form: str) -> None:
    with fresh_lake() as cat, kernel_form(form):
        log = DeltaLog(cat, "ACME.RANDOM.V1", PARTITION, SCHEMA)
        for op, files in s["deltas"]:
            log.append(op, files)
        result = run_compact(
            cat,
            "ACME.RANDOM.V1",
            PKS,
            s["sort_keys"],
            hash_bucket_count=s["buckets"],
            rows_per_compacted_file=s["rows_per_file"],
            rows_per_primary_key_index_file=s["rows_per_index_file"],
            executor=executor,
        )
        got = _check(cat, "ACME.RANDOM.V1", log, s["sort_keys"], s)
        (p,) = result.partitions
        assert p.rows_out == len(got)
        assert p.rows_in == sum(1 for r in log.records if r["__op"] == "upsert")
        assert p.hash_bucket_count == s["buckets"]


@EXECUTORS
@settings(FAST, max_examples=12)
@given(s=streams(), data=st.data())
def test_incremental_compaction_equals_oracle_and_full_rebuild(s: dict[str, Any], data: st.DataObject, executor: str, form: str) -> None:
    """Compact a prefix, append the rest, compact again: same answer as the oracle and as one compaction."""
    deltas = s["deltas"]
    cut = data.draw(st.integers(1, len(deltas)), label="deltas before the first compaction")
    kwargs = dict(
        hash_bucket_count=s["buckets"],
        rows_per_compacted_file=s["rows_per_file"],
        rows_per_primary_key_index_file=s["rows_per_index_file"],
        executor=executor,
    )
    with fresh_lake() as cat, kernel_form(form):
        log = DeltaLog(cat, "ACME.INCR.V1", PARTITION, SCHEMA)
        for op, files in deltas[:cut]:
            log.append(op, files)
        run_compact(cat, "ACME.INCR.V1", PKS, s["sort_keys"], **kwargs)
        _check(cat, "ACME.INCR.V1", log, s["sort_keys"], s)
        for op, files in deltas[cut:]:
            log.append(op, files)
        # later runs may omit the keys: they were recorded with the compacted table
        run_compact(cat, "ACME.INCR.V1", None, None, **kwargs)
        got = _check(cat, "ACME.INCR.V1", log, s["sort_keys"], s)
        # a from-scratch compaction of the whole stream into another destination gives the same rows
        run_compact(cat, "ACME.INCR.V1", PKS, s["sort_keys"], destination_compacted_table_id="ACME.SCRATCH.V1", **kwargs)
        assert rows_of(read_compacted(cat, "ACME.SCRATCH.V1", PARTITION), COLUMNS) == got


# ----- pinned edge cases (deterministic, cheap) ----------------------------------------------------------------
def _single(cat: Any, table_id: str, rows_by_delta: list[tuple[str, list[dict]]], pks: list[str], sort_keys: Any, schema: pa.Schema) -> tuple[list, list]:
    key_schema = pa.schema([schema.field(k) for k in pks])
    log = DeltaLog(cat, table_id, PARTITION, schema)
    for op, files in rows_by_delta:
        log.append(op, [pa.Table.from_pylist(rows, schema=schema if op == "upsert" else key_schema) for rows in files])
    run_compact(cat, table_id, pks, sort_keys, hash_bucket_count=3, rows_per_compacted_file=2)
    expected = rows_of(oracle(log.log_table(), pks, sort_keys, schema.names), schema.names)
    got = rows_of(read_compacted(cat, table_id, PARTITION), schema.names)
    return got, expected


def test_colliding_concatenations_and_null_spellings_are_distinct_keys() -> None:
    schema = pa.schema([("a", pa.string()), ("b", pa.string()), ("v", pa.int64())])
    keys = [("ab", "c"), ("a", "bc"), ("abc", ""), ("", "abc"), (None, "x"), ("", "x"), ("null", "x"), (None, None), ("", "")]
    rows = [{"a": a, "b": b, "v": i} for i, (a, b) in enumerate(keys)]
    with fresh_lake() as cat:
        got, expected = _single(cat, "ACME.KEYS.V1", [("upsert", [rows])], ["a", "b"], None, schema)
    assert got == expected
    assert len(got) == len(keys)  # nine different keys, nine rows


def test_float_sort_key_signed_zero_ties_fall_back_to_stream_position() -> None:
    """-0.0 == 0.0: neither value is greater, so the later delta wins (as for any other tie)."""
    schema = pa.schema([("k", pa.string()), ("f", pa.float64()), ("v", pa.int64())])
    deltas = [("upsert", [[{"k": "x", "f": 0.0, "v": 1}]]), ("upsert", [[{"k": "x", "f": -0.0, "v": 2}]])]
    with fresh_lake() as cat:
        got, expected = _single(cat, "ACME.ZERO.V1", deltas, ["k"], [("f", "ascending")], schema)
    assert expected == [("x", -0.0, 2)]
    assert got == expected


def test_stream_of_key_only_deletes_compacts_to_nothing_with_a_sort_key() -> None:
    schema = pa.schema([("k", pa.string()), ("ver", pa.int64()), ("v", pa.int64())])
    with fresh_lake() as cat:
        got, expected = _single(cat, "ACME.DELONLY.V1", [("delete", [[{"k": "x"}]])], ["k"], [("ver", "ascending")], schema)
    assert got == expected == []


def test_deletes_carrying_a_non_key_column_compact_with_a_sort_key_and_then_take_upserts() -> None:
    """Delete deltas need only the primary key; one that also carries another upsert column (allowed at append)
    was taken as the table's columns, and a sort key missing from it refused the partition (and the whole job of
    a partitioned table). The sort key is judged once an upsert exists, as for key-only deletes."""
    with fresh_lake() as cat:
        cat.append("ACME.DELCOL.V1", (), "delete", [pa.table({"k": ["x"], "v": [1]})])
        run_compact(cat, "ACME.DELCOL.V1", ["k"], [("ver", "ascending")])
        log = DeltaLog(cat, "ACME.DELCOL.V1", (), pa.schema([("k", pa.string()), ("ver", pa.int64()), ("v", pa.int64())]))
        log.append("upsert", [pa.table({"k": ["x", "y", "x"], "ver": [2, 1, 1], "v": [5, 6, 7]})])
        run_compact(cat, "ACME.DELCOL.V1", None, None)
        got = rows_of(read_compacted(cat, "ACME.DELCOL.V1", ()), ["k", "ver", "v"])
    assert got == [("x", 2, 5), ("y", 1, 6)]


@pytest.mark.parametrize("executor", ["in-process", "ray"])
def test_an_emptied_table_keeps_its_columns_through_delete_only_compactions(executor: str) -> None:
    """Every row deleted, then a compaction of deletes only (of absent keys): the empty version keeps the table's
    columns (it took the key columns alone, so export and its Delta table lost the others until the next upsert).
    A later upsert compacts as usual; every version's rows equal the DuckDB oracle's, columns included."""
    import deltalake
    import pyarrow.parquet as pq

    schema = pa.schema([("k", pa.string()), ("ver", pa.int64()), ("v", pa.int64())])
    key_schema = pa.schema([schema.field("k")])
    steps = [[("upsert", [{"k": "x", "ver": 1, "v": 1}, {"k": "y", "ver": 1, "v": 2}]), ("delete", [{"k": "x"}, {"k": "y"}])],
             [("delete", [{"k": "z"}])], [("delete", [{"k": "x"}])], [("upsert", [{"k": "w", "ver": 2, "v": 3}])]]
    with fresh_lake() as cat:
        log = DeltaLog(cat, "ACME.EMPTIED.V1", PARTITION, schema)
        for i, step in enumerate(steps):
            for op, rows in step:
                log.append(op, [pa.Table.from_pylist(rows, schema=schema if op == "upsert" else key_schema)])
            run_compact(cat, "ACME.EMPTIED.V1", ["k"] if i == 0 else None, [("ver", "ascending")] if i == 0 else None, executor=executor)
            part = next(iter(cat.partitions("ACME.EMPTIED.V1")))
            assert cat.latest_compacted("ACME.EMPTIED.V1", part).pa_schema().names == schema.names, i
            exported = cat.export("ACME.EMPTIED.V1", str(cat.storage.root) + f"-export-{i}")
            assert all(pq.read_schema(path).names == schema.names for path in exported), i
            table = read_compacted(cat, "ACME.EMPTIED.V1", PARTITION)
            got = rows_of(table, schema.names) if table is not None else []
            assert got == rows_of(oracle(log.log_table(), ["k"], [("ver", "ascending")], schema.names), schema.names)
            delta = deltalake.DeltaTable(cat.deltalake_location("ACME.EMPTIED.V1", part)).to_pyarrow_table()
            assert delta.schema.names == schema.names, (i, delta.schema)


@settings(FAST, max_examples=12)
@given(s=streams(), data=st.data())
def test_primary_keys_given_alone_keep_the_recorded_sort_keys(s: dict[str, Any], data: st.DataObject) -> None:
    """Sort keys not given again are the recorded ones, as every remembered setting: for a partition's first
    compaction (the table's other partition records them) and for a rebuild given the primary keys alone. Both
    once fell back to the stream position, so a row with a smaller sort key could win (exit 0)."""
    from flash_pipeline.catalog.encoding import normalize_partition

    deltas = s["deltas"]
    table, other = "ACME.SORTKEYS.V1", {"region": "us"}
    with fresh_lake() as cat:
        first = DeltaLog(cat, table, PARTITION, SCHEMA)
        second = DeltaLog(cat, table, other, SCHEMA)
        for op, files in deltas:
            first.append(op, files)
            second.append(op, files)
        run_compact(cat, table, PKS, s["sort_keys"], hash_bucket_count=s["buckets"], partitions=[PARTITION])
        want = rows_of(oracle(first.log_table(), PKS, s["sort_keys"], COLUMNS), COLUMNS)
        recorded = [list(k) for k in cat.latest_compacted(table, normalize_partition(PARTITION)).sort_keys]
        run_compact(cat, table, PKS, None, partitions=[other])  # the other partition's first compaction
        rebuild = data.draw(st.booleans(), label="then a rebuild of the first partition, primary keys alone")
        if rebuild:
            run_compact(cat, table, PKS, None, rebuild=True, partitions=[PARTITION])
        for part in (PARTITION, other):
            version = cat.latest_compacted(table, normalize_partition(part))
            assert [list(k) for k in version.sort_keys] == recorded
            assert rows_of(read_compacted(cat, table, part), COLUMNS) == want
