"""Merge-on-read: the latest compacted version merged with pending deltas equals compact-then-export, and
writes nothing to the lake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import DeltaLog, fresh_lake, oracle, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import main
from flash_pipeline.errors import FlashError
from flash_pipeline.merge_on_read import read, to_spark
from test_compaction_semantics import COLUMNS, FAST, PARTITION, PKS, SCHEMA, streams


def _export_rows(cat: Catalog, table_id: str, tmp: Path) -> list[tuple]:
    written = cat.export(table_id, tmp)
    tables = [pq.read_table(p) for p in written]
    return rows_of(pa.concat_tables(tables) if tables else None, COLUMNS)


@settings(FAST, max_examples=20)
@given(s=streams(), data=st.data())
def test_merge_on_read_equals_compact_then_export(s: dict[str, Any], data: st.DataObject) -> None:
    """Compact a prefix (or nothing), append the rest: read() == the oracle == compacting now and exporting."""
    deltas = s["deltas"]
    cut = data.draw(st.integers(0, len(deltas)), label="deltas compacted before reading")
    kwargs = dict(hash_bucket_count=s["buckets"], rows_per_compacted_file=s["rows_per_file"],
                  rows_per_primary_key_index_file=s["rows_per_index_file"])
    with fresh_lake() as cat:
        table = "ACME.MOR.V1"
        log = DeltaLog(cat, table, PARTITION, SCHEMA)
        for op, files in deltas[:cut]:
            log.append(op, files)
        if cut:
            run_compact(cat, table, PKS, s["sort_keys"], **kwargs)
        for op, files in deltas[cut:]:
            log.append(op, files)
        listing = cat.listing()
        keys = {} if cut else {"primary_keys": PKS, "sort_keys": s["sort_keys"]}
        got = rows_of(read(cat, table, **keys), COLUMNS)
        assert cat.listing() == listing  # merge-on-read writes nothing
        assert got == rows_of(oracle(log.log_table(), PKS, s["sort_keys"], COLUMNS), COLUMNS)
        run_compact(cat, table, PKS, s["sort_keys"], **kwargs)
        out = Path(cat.uri).parent / "export"
        assert _export_rows(cat, table, out) == got
        assert rows_of(read(cat, table), COLUMNS) == got  # nothing pending: the compacted rows themselves


def test_unkeyed_never_compacted_table_reads_as_all_rows(lake: Catalog) -> None:
    a = pa.table({"x": [1, 1, 2], "y": ["a", "b", "c"]})
    b = pa.table({"y": ["d"], "x": [1]})  # columns in another order
    lake.append("T.LOG", {"d": "1"}, "upsert", [a])
    lake.append("T.LOG", {"d": "2"}, "upsert", [a, b])
    got = read(lake, "T.LOG")
    assert got.column_names == ["x", "y"] and got.num_rows == 7
    assert read(lake, "T.LOG", partitions=[{"d": "2"}], columns=["y"]).column("y").to_pylist() == ["a", "b", "c", "d"]
    lake.append("T.LOG", {"d": "2"}, "delete", [pa.table({"x": [1]})])
    with pytest.raises(FlashError, match="no primary keys"):
        read(lake, "T.LOG")
    keyed = read(lake, "T.LOG", primary_keys=["x"])  # latest row per x, then the delete of x=1 in d=2
    assert sorted(keyed.to_pylist(), key=repr) == sorted(
        [{"x": 1, "y": "b"}, {"x": 2, "y": "c"}, {"x": 2, "y": "c"}], key=repr
    )


def test_read_uses_recorded_keys_and_refuses_others(lake: Catalog) -> None:
    lake.append("T.K", None, "upsert", [pa.table({"k": [1, 2], "t": [5, 5], "v": ["a", "b"]})])
    run_compact(lake, "T.K", ["k"], [("t", "descending")])
    lake.append("T.K", None, "upsert", [pa.table({"k": [1, 2], "t": [4, 6], "v": ["c", "d"]})])
    got = read(lake, "T.K")
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == [{"k": 1, "t": 4, "v": "c"}, {"k": 2, "t": 5, "v": "b"}]
    with pytest.raises(FlashError, match="read with the recorded keys"):
        read(lake, "T.K", primary_keys=["v"])
    with pytest.raises(FlashError, match="unknown column"):
        read(lake, "T.K", columns=["nope"])


def test_destination_table_reads_through_its_source(lake: Catalog) -> None:
    lake.append("T.SRC", None, "upsert", [pa.table({"k": [1, 2], "v": [1, 2]})])
    run_compact(lake, "T.SRC", ["k"], None, destination_compacted_table_id="T.DST")
    lake.append("T.SRC", None, "delete", [pa.table({"k": [1]})])
    assert read(lake, "T.SRC", compacted_table_id="T.DST").to_pylist() == [{"k": 2, "v": 2}]
    assert read(lake, "T.DST").to_pylist() == [{"k": 2, "v": 2}]


def test_to_spark_builds_a_dataframe_from_the_arrow_table(lake: Catalog) -> None:
    lake.append("T.S", None, "upsert", [pa.table({"k": [1, 2]})])

    class FakeConf:
        def __init__(self) -> None:
            self.values: dict[str, str] = {}

        def set(self, k: str, v: str) -> None:
            self.values[k] = v

    class FakeSpark:
        conf = FakeConf()

        def createDataFrame(self, frame: Any) -> Any:  # noqa: N802 - PySpark's name
            return frame

    spark = FakeSpark()
    frame = to_spark(spark, lake, "T.S")
    assert isinstance(frame, pa.Table) and frame.column("k").to_pylist() == [1, 2]
    assert spark.conf.values["spark.sql.execution.arrow.pyspark.enabled"] == "true"


def test_cli_read_preview_and_out(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake.append("T.CLI", {"d": "1"}, "upsert", [pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})])
    lake.append("T.CLI", {"d": "1"}, "upsert", [pa.table({"k": [1], "v": ["z"]})])
    lake.append("T.CLI", {"d": "2"}, "upsert", [pa.table({"k": [9], "v": ["q"]})])
    assert main(["read", "--catalog", lake.uri, "--table", "T.CLI", "--primary-key", "k", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 rows, columns ['k', 'v']") and "2 more rows" in out
    assert main(["read", "--catalog", lake.uri, "--table", "T.CLI", "--partition", "d=1", "--primary-key", "k",
                 "--columns", "v", "--out", str(tmp_path / "o")]) == 0
    (path,) = capsys.readouterr().out.split()
    assert sorted(pq.read_table(path).column("v").to_pylist()) == ["b", "c", "z"]
    snapshot = lake.listing()
    assert main(["read", "--catalog", lake.uri, "--table", "T.CLI", "--columns", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flash-compactor: error: ") and err.count("\n") == 1
    assert main(["read", "--catalog", lake.uri, "--table", "T.CLI", "--partition", "d=3"]) == 2
    assert lake.listing() == snapshot
