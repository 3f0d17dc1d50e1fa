"""Randomized acceptance tests: the compacted table equals an independent DuckDB formulation of the semantics.

Streams are small (1-6 deltas, 1-3 files per delta, 0-8 rows per file, empty files included) over a composite
primary key drawn from a tiny pool of values (two string columns whose concatenations collide, with "", "null"
and null, plus an int column with null), so duplicates, ties, deletes of absent keys, delete-then-reinsert and
older sort keys arriving later are all frequent. Every example runs in a fresh temporary lake.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from compaction_helpers import (
    KEY_INTS,
    KEY_STRINGS,
    DeltaLog,
    assert_layout_invariants,
    fresh_lake,
    oracle,
    read_compacted,
    rows_of,
    run_compact,
)

PKS = ["ks", "kt", "kn"]  # "kn" sorts first: the recorded key order is kn, ks, kt
SCHEMA = pa.schema(
    [
        pa.field("ks", pa.string()),
        pa.field("kt", pa.string()),
        pa.field("kn", pa.int64()),
        pa.field("sk_i", pa.int64()),
        pa.field("sk_f", pa.float64()),
        pa.field("sk_t", pa.timestamp("us")),
        pa.field("v", pa.int64()),  # unique per row: tells which of two equal-looking rows survived
        pa.field("note", pa.string()),
    ]
)
COLUMNS = SCHEMA.names
KEY_SCHEMA = pa.schema([SCHEMA.field(k) for k in PKS])
PARTITION = {"region": "eu"}

T0 = dt.datetime(1995, 4, 3, 12, 0, 0)
SK_INTS = [None, -2, 0, 1, 5]
SK_FLOATS = [None, -1.5, 0.0, 2.25, 1e300, float("-inf"), float("inf")]
SK_TIMES = [None, T0, T0 + dt.timedelta(microseconds=1), T0 - dt.timedelta(days=400), T0 + dt.timedelta(hours=5)]

DIRECTIONS = st.sampled_from(["ascending", "descending"])
SORT_KEYS = st.one_of(
    st.just(None),
    st.tuples(DIRECTIONS).map(lambda d: [("sk_i", d[0])]),
    st.tuples(DIRECTIONS).map(lambda d: [("sk_f", d[0])]),
    st.tuples(DIRECTIONS).map(lambda d: [("sk_t", d[0])]),
    st.tuples(DIRECTIONS, DIRECTIONS).map(lambda d: [("sk_i", d[0]), ("sk_t", d[1])]),
)

KEY = st.tuples(st.sampled_from(KEY_STRINGS), st.sampled_from(KEY_STRINGS), st.sampled_from(KEY_INTS))


@st.composite
def streams(draw: st.DrawFn) -> dict[str, Any]:
    """A key pool and 1-6 deltas of 1-3 files of 0-8 rows each, keys drawn from the pool."""
    pool = draw(st.lists(KEY, min_size=1, max_size=6, unique=True))
    counter = itertools.count(1)
    deltas = []
    for i in range(draw(st.integers(1, 6))):
        # deletes often hit keys not inserted yet, and a stream may start with deletes only
        op = draw(st.sampled_from(["upsert", "upsert", "delete"]))
        full_delete = op == "delete" and draw(st.booleans())  # deletes usually carry only the key columns
        files = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.integers(0, 8))
            rows = []
            for _ in range(n):
                ks, kt, kn = draw(st.sampled_from(pool))
                row = {"ks": ks, "kt": kt, "kn": kn}
                if op == "upsert" or full_delete:
                    row.update(
                        sk_i=draw(st.sampled_from(SK_INTS)),
                        sk_f=draw(st.sampled_from(SK_FLOATS)),
                        sk_t=draw(st.sampled_from(SK_TIMES)),
                        v=next(counter),
                        note=draw(st.sampled_from(["", "x", None])),
                    )
                rows.append(row)
            schema = SCHEMA if (op == "upsert" or full_delete) else KEY_SCHEMA
            files.append(pa.Table.from_pylist(rows, schema=schema))
        deltas.append((op, files))
    return {
        "deltas": deltas,
        "sort_keys": draw(SORT_KEYS),
        "buckets": draw(st.sampled_from([1, 2, 3, 7])),
        "rows_per_file": draw(st.integers(1, 5)),
        "rows_per_index_file": draw(st.integers(1, 5)),
    }


FAST = settings(
    max_examples=25,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _check(cat: Any, table_id: str, log: DeltaLog, sort_keys: Any, s: dict[str, Any], up_to: int | None = None) -> list[tuple]:
    expected = rows_of(oracle(log.log_table(up_to), PKS, sort_keys, COLUMNS), COLUMNS)
    got = rows_of(read_compacted(cat, table_id, PARTITION), COLUMNS)
    assert got == expected
    assert_layout_invariants(cat, table_id, PARTITION, s["rows_per_file"], s["rows_per_index_file"])
    return got


@FAST
@given(s=streams())
def test_compacted_table_equals_duckdb_oracle(s: dict[str, Any]) -> None:
    with fresh_lake() as cat:
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
        )
        got = _check(cat, "ACME.RANDOM.V1", log, s["sort_keys"], s)
        (p,) = result.partitions
        assert p.rows_out == len(got)
        assert p.rows_in == sum(1 for r in log.records if r["__op"] == "upsert")
        assert p.hash_bucket_count == s["buckets"]


@settings(FAST, max_examples=12)
@given(s=streams(), data=st.data())
def test_incremental_compaction_equals_oracle_and_full_rebuild(s: dict[str, Any], data: st.DataObject) -> None:
    """Compact a prefix, append the rest, compact again: same answer as the oracle and as one compaction."""
    deltas = s["deltas"]
    cut = data.draw(st.integers(1, len(deltas)), label="deltas before the first compaction")
    kwargs = dict(
        hash_bucket_count=s["buckets"],
        rows_per_compacted_file=s["rows_per_file"],
        rows_per_primary_key_index_file=s["rows_per_index_file"],
    )
    with fresh_lake() as cat:
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
