"""Materialize reads a unit larger than a task's share of the round budget one column at a time: the compacted
rows are those of the issue's semantics (DuckDB oracle) for prior units that lose rows and for delta units, and the
column path is the one that ran."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline import Catalog
from flash_pipeline.compactor.steps import materialize
from tests.compaction_helpers import FILE, OP, POS, ROW, DeltaLog, oracle, read_compacted, rows_of, run_compact

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("name", pa.string()), ("x", pa.float64()), ("flag", pa.bool_())])


def _upserts(rng: np.random.Generator, n: int, key_space: int) -> pa.Table:
    names = np.char.add("n-", rng.integers(0, 1000, n).astype(str)).astype(object)
    names[rng.random(n) < 0.2] = None
    return pa.table({"k": rng.integers(0, key_space, n), "ts": rng.integers(0, 50, n), "name": pa.array(names, pa.string()),
                     "x": rng.random(n), "flag": rng.random(n) < 0.5}, schema=SCHEMA)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), deltas=st.integers(2, 3), delete_share=st.floats(0.0, 0.3))
def test_large_units_read_by_column_give_the_oracles_rows(tmp_path_factory, seed: int, deltas: int, delete_share: float) -> None:
    rng = np.random.default_rng(seed)
    key_space = int(rng.integers(15_000, 40_000))
    root = tmp_path_factory.mktemp("lake")
    log = DeltaLog(Catalog(root / "lake"), "T", (), SCHEMA)
    log.append("upsert", [_upserts(rng, int(rng.integers(20_000, 30_000)), key_space)])
    # no budget: the prior compacted file gets row groups of up to 256k rows, one group here
    run_compact(log.cat, "T", ["k"], [("ts", "ascending")], executor="in-process", hash_bucket_count=3)
    # upsert deltas as Spark writes them, in row groups of 10.5k rows: each group a unit, more units than
    # materialize tasks (so a task gets several consecutive units, small in bytes and large in rows: each read by
    # column must stay a run of its own); then a delete and one more upsert delta
    def append_upsert_file(rows: int) -> None:
        path = root / f"u{len(log.records)}.parquet"
        table = _upserts(rng, rows, key_space)
        pq.write_table(table, path, row_group_size=10_500)
        position = log.cat.append("T", (), "upsert", [path]).position
        log.records.extend({**row, POS: position, FILE: 1, ROW: i, OP: "upsert"} for i, row in enumerate(table.to_pylist()))

    for _ in range(deltas):
        append_upsert_file(int(rng.integers(53_000, 62_000)))  # the last row group under 10k rows: a unit not read by column
    keys = rng.integers(0, key_space, max(1, int(delete_share * 10_000)))
    log.append("delete", [pa.table({"k": keys}, schema=pa.schema([("k", pa.int64())]))])
    append_upsert_file(int(rng.integers(11_000, 16_000)))

    calls: list[bool] = []  # whether each unit read by column was a prior one
    by_column = materialize._select_by_column

    def counting(storage, plan, source, schema, select):  # type: ignore[no-untyped-def]
        calls.append(source.prior)
        return by_column(storage, plan, source, schema, select)

    # the least budget: materialize tasks of 10k rows, so every unit here (11k+ rows) is read by column
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(materialize, "_select_by_column", counting)
        run_compact(log.cat, "T", ["k"], [("ts", "ascending")], executor="in-process", max_round_bytes=1)
    assert True in calls and False in calls, f"prior and delta units must both be read by column: {calls}"
    expected = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert rows_of(read_compacted(log.cat, "T", ()), SCHEMA.names) == rows_of(expected, SCHEMA.names)
