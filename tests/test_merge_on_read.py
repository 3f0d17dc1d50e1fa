"""Merge-on-read: the latest compacted version merged with pending deltas equals compact-then-export, and
writes nothing to the lake."""

from __future__ import annotations

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
from compaction_streams import COLUMNS, FAST, PARTITION, PKS, SCHEMA, streams


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


# ----- the CLI read on delete-only streams and its terminal preview -----------------------------------------
KSCHEMA = pa.schema([("k", pa.int64()), ("t", pa.int64()), ("v", pa.string())])


def _cli(*args: str) -> int:
    return main(list(args))


def _read_out(lake: Catalog, tmp: Path, *extra: str) -> pa.Table | None:
    """``flash-compactor read --out`` into a fresh folder; the rows it wrote (None when it wrote nothing)."""
    import uuid

    out = tmp / uuid.uuid4().hex[:8]
    assert _cli("read", "--catalog", lake.uri, *extra, "--out", str(out)) == 0
    files = sorted(out.rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in files]) if files else None


def test_cli_read_after_delete_only_stream_compacted_with_sort_key(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stream of only deletes compacted with a sort key records a version with just the key column; reading
    it, with more deletes and then upserts pending, and after compacting those, equals the oracle."""
    log = DeltaLog(lake, "T.DEL", None, KSCHEMA)
    log.append("delete", [pa.table({"k": pa.array([1, 2], pa.int64())})])
    assert _cli("compact", "--catalog", lake.uri, "--table", "T.DEL", "--primary-key", "k", "--sort-key", "t") == 0
    capsys.readouterr()
    assert _cli("read", "--catalog", lake.uri, "--table", "T.DEL") == 0
    assert capsys.readouterr().out == "0 rows, columns ['k']\n"
    log.append("delete", [pa.table({"k": pa.array([3], pa.int64())})])
    assert _cli("read", "--catalog", lake.uri, "--table", "T.DEL") == 0
    assert capsys.readouterr().out == "0 rows, columns ['k']\n"
    log.append("upsert", [pa.table({"k": [1, 2, 3, 4, 4], "t": [5, None, 1, 9, 2], "v": ["a", "b", "c", "d", "e"]}, schema=KSCHEMA)])
    log.append("upsert", [pa.table({"k": [4, 2], "t": [3, 0], "v": ["f", None]}, schema=KSCHEMA)])
    expected = rows_of(oracle(log.log_table(), ["k"], [("t", "ascending")], KSCHEMA.names), KSCHEMA.names)
    assert rows_of(_read_out(lake, tmp_path, "--table", "T.DEL"), KSCHEMA.names) == expected
    capsys.readouterr()
    assert _cli("read", "--catalog", lake.uri, "--table", "T.DEL", "--columns", "v", "k") == 0
    assert capsys.readouterr().out.startswith(f"{len(expected)} rows, columns ['v', 'k']\n")
    assert _cli("compact", "--catalog", lake.uri, "--table", "T.DEL") == 0
    assert rows_of(_read_out(lake, tmp_path, "--table", "T.DEL"), KSCHEMA.names) == expected


def test_cli_read_columns_on_a_partition_of_only_deletes(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``read --columns`` over a table one of whose partitions holds only delete deltas (compacted or not)."""
    up = DeltaLog(lake, "T.PD", {"d": "1"}, KSCHEMA)
    up.append("upsert", [pa.table({"k": [1, 2, 2], "t": [1, 1, 2], "v": ["a", "b", "c"]}, schema=KSCHEMA)])
    dl = DeltaLog(lake, "T.PD", {"d": "2"}, KSCHEMA)
    dl.append("delete", [pa.table({"k": pa.array([1, 2], pa.int64())})])
    expected = rows_of(oracle(up.log_table(), ["k"], [("t", "ascending")], ["v"]), ["v"])
    keys = ("--primary-key", "k", "--sort-key", "t")
    assert rows_of(_read_out(lake, tmp_path, "--table", "T.PD", *keys, "--columns", "v"), ["v"]) == expected
    assert _cli("compact", "--catalog", lake.uri, "--table", "T.PD", *keys) == 0
    capsys.readouterr()
    for args in ([], ["--partition", "d=1"]):
        assert rows_of(_read_out(lake, tmp_path, "--table", "T.PD", *args, "--columns", "v"), ["v"]) == expected
        capsys.readouterr()
        assert _cli("read", "--catalog", lake.uri, "--table", "T.PD", *args, "--columns", "v") == 0
        assert capsys.readouterr().out.startswith(f"{len(expected)} rows, columns ['v']\n")
    assert _read_out(lake, tmp_path, "--table", "T.PD", "--partition", "d=2", "--columns", "v") is None
    capsys.readouterr()
    for cols in (["v"], ["k", "t"]):
        assert _cli("read", "--catalog", lake.uri, "--table", "T.PD", "--partition", "d=2", "--columns", *cols) == 0
        assert capsys.readouterr().out == f"0 rows, columns {cols}\n"
    got = read(lake, "T.PD", partitions=[{"d": "2"}], columns=["k", "v"])
    assert got.num_rows == 0 and got.schema.field("k").type == pa.int64()


def test_cli_read_preview_one_line_per_row(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """The preview has a header line, then exactly one line per row and no blank line, whatever the values
    hold (newlines, CR, "", "null", null, NaN, bytes); ambiguous strings are quoted and escaped."""
    schema = pa.schema([("k", pa.int64()), ("s", pa.string()), ("f", pa.float64()), ("b", pa.binary())])
    values = {1: "plain", 2: "", 3: None, 4: "null", 5: "two\nlines", 6: "ends with newline\n", 7: "cr\r\nlf", 8: "a|b", 9: "\n"}
    table = pa.table({"k": list(values), "s": list(values.values()), "f": [float("nan"), float("inf"), None, -0.0, 1.5, 2.0, 3.0, 4.0, 5.0],
                      "b": [b"\x00\n", None, b"", b"x", b"y", b"z", b"w", b"v", b"u"]}, schema=schema)
    log = DeltaLog(lake, "T.PRE", None, schema)
    log.append("upsert", [table])
    log.append("upsert", [table.slice(0, 2)])  # duplicates: the later delta wins
    expected = oracle(log.log_table(), ["k"], None, schema.names)
    assert _cli("read", "--catalog", lake.uri, "--table", "T.PRE", "--primary-key", "k", "--limit", "100") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"{expected.num_rows} rows, columns {schema.names}"
    assert len(lines) == expected.num_rows + 2 and all(line.strip() for line in lines), out
    header, rows = lines[1], [[c.strip() for c in line.split(" | ")] for line in lines[2:]]
    assert [c.strip() for c in header.split(" | ")] == schema.names
    by_key = {int(r[0]): r for r in rows}
    assert sorted(by_key) == sorted(expected.column("k").to_pylist())
    shown = {1: "plain", 2: "''", 3: "null", 4: "'null'", 5: r"'two\nlines'", 6: r"'ends with newline\n'", 7: r"'cr\r\nlf'", 8: "'a|b'", 9: r"'\n'"}
    assert {k: r[1] for k, r in by_key.items()} == shown
    assert (by_key[1][2], by_key[2][2], by_key[3][2], by_key[4][2]) == ("nan", "inf", "null", "-0")
    assert (by_key[1][3], by_key[3][3]) == (r"b'\x00\n'", "b''")
    assert _cli("read", "--catalog", lake.uri, "--table", "T.PRE", "--primary-key", "k", "--limit", "3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 1 + 3 + 1 and lines[-1] == f"  ... {expected.num_rows - 3} more rows (use --out DIR for all of them)"


@settings(FAST, max_examples=15)
@given(s=streams(), data=st.data())
def test_a_new_partition_of_a_keyed_table_reads_and_compacts_with_the_tables_keys(s: dict[str, Any], data: st.DataObject) -> None:
    """Keys are the table's: a partition never compacted, in a table whose other partition records keys, is read
    (merge-on-read) and compacted without keys given as with those keys: equal to the oracle, also when an optimize
    from before any compaction packed it into an unkeyed version. Before, read() returned one row per delta row
    (duplicate keys, deletes ignored) and compact() refused the whole table."""
    from flash_pipeline.optimize import optimize

    deltas = s["deltas"]
    cut = data.draw(st.integers(1, len(deltas)), label="deltas of the first partition compacted")
    packed = data.draw(st.booleans(), label="optimize before the first compaction")
    table, other = "ACME.NEWPART.V1", {"region": "us"}
    with fresh_lake() as cat:
        first = DeltaLog(cat, table, PARTITION, SCHEMA)
        for op, files in deltas[:cut]:
            first.append(op, files)
        second = DeltaLog(cat, table, other, SCHEMA)
        for op, files in deltas:
            second.append(op, files)
        if packed:  # no keys anywhere yet: both partitions' upserts packed into unkeyed versions
            optimize(cat, table)
        run_compact(cat, table, PKS, s["sort_keys"], hash_bucket_count=s["buckets"], partitions=[PARTITION])
        want = rows_of(oracle(second.log_table(), PKS, s["sort_keys"], COLUMNS), COLUMNS)
        listing = cat.listing()
        assert rows_of(read(cat, table, partitions=[other]), COLUMNS) == want
        assert cat.listing() == listing
        run_compact(cat, table, None, None)  # no keys given: the first partition's, for the new one too
        assert rows_of(read(cat, table, partitions=[other]), COLUMNS) == want  # now the compacted rows
        from flash_pipeline.catalog.encoding import normalize_partition

        version = cat.latest_compacted(table, normalize_partition(other))
        assert version is not None and list(version.primary_keys) == sorted(PKS)
        assert rows_of(pa.concat_tables([cat.read_live(f) for f in version.files]) if version.files else None, COLUMNS) == want


@pytest.mark.parametrize("seed", range(4))
def test_merge_on_read_applies_deletion_vectors_with_and_without_pending_deltas(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compactions with deletion vectors carry files whose superseded rows are marked dead; read() must drop them
    whether deltas are pending (the merge) or not (the compacted rows as they are: it returned the dead rows).
    Random upserts and deletes of a few keys at a time over a 60-row table, compacted one delta at a time."""
    import numpy as np

    monkeypatch.setenv("FLASH_DV_MAX_DEAD_FRACTION", "1")  # carry a file with a vector whatever share of it died
    rng = np.random.default_rng(seed)
    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])
    names = schema.names
    with fresh_lake() as cat:
        log = DeltaLog(cat, "ACME.MORDV.V1", PARTITION, schema)
        log.append("upsert", [pa.table({"k": np.arange(60), "ts": np.zeros(60, dtype=np.int64), "v": [f"v0-{i}" for i in range(60)]}, schema=schema)])
        run_compact(cat, "ACME.MORDV.V1", ["k"], [("ts", "ascending")], rows_per_compacted_file=10, hash_bucket_count=2, deletion_vectors=True)
        vectors = 0
        for step in range(1, 9):
            keys = rng.choice(70, size=int(rng.integers(1, 6)), replace=False)
            if step % 3:
                log.append("upsert", [pa.table({"k": keys, "ts": np.full(len(keys), step), "v": [f"v{step}-{k}" for k in keys]}, schema=schema)])
            else:
                log.append("delete", [pa.table({"k": keys})])
            want = rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], names), names)
            assert rows_of(read(cat, "ACME.MORDV.V1"), names) == want, ("pending", step)
            run_compact(cat, "ACME.MORDV.V1", None, None)
            latest = cat.latest_compacted("ACME.MORDV.V1", next(iter(cat.partitions("ACME.MORDV.V1"))))
            vectors += sum(f.deletion_vector is not None for f in latest.files)
            assert rows_of(read(cat, "ACME.MORDV.V1"), names) == want, ("compacted", step)
        assert vectors, "no compaction carried a file with a deletion vector: the test checks nothing"


def test_a_source_read_through_a_destination_another_source_wrote_merges_its_own_stream(lake: Catalog) -> None:
    """Two sources compacted into one destination replace each other (on purpose: rebuild=True, compact refuses
    otherwise); read() of a source through that destination must equal what compacting it there gives, not the
    other source's rows (it returned them, reading nothing of the source)."""
    lake.append("T.S1", None, "upsert", [pa.table({"k": [1, 2, 3], "v": ["s1", "s1", "s1"]})])
    lake.append("T.S1", None, "upsert", [pa.table({"k": [3], "v": ["s1b"]})])
    lake.append("T.S2", None, "upsert", [pa.table({"k": [7, 8], "v": ["s2", "s2"]})])
    run_compact(lake, "T.S1", ["k"], None, destination_compacted_table_id="T.D")
    run_compact(lake, "T.S2", ["k"], None, destination_compacted_table_id="T.D", rebuild=True)
    got = sorted(read(lake, "T.S1", compacted_table_id="T.D").to_pylist(), key=lambda r: r["k"])
    assert sorted(read(lake, "T.S2", compacted_table_id="T.D").to_pylist(), key=lambda r: r["k"]) == [{"k": 7, "v": "s2"}, {"k": 8, "v": "s2"}]
    run_compact(lake, "T.S1", None, None, destination_compacted_table_id="T.D", rebuild=True)
    assert got == sorted(read(lake, "T.D").to_pylist(), key=lambda r: r["k"]) == [{"k": 1, "v": "s1"}, {"k": 2, "v": "s1"}, {"k": 3, "v": "s1b"}]


def test_read_through_an_unknown_compacted_table_is_refused_in_one_line(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt --compacted-table found no compacted version, so no keys, and printed every delta row with
    exit 0; it is an error naming the table now, and the lake is unchanged."""
    t = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    lake.append("T.S", None, "upsert", [t])
    lake.append("T.S", None, "upsert", [t])
    run_compact(lake, "T.S", ["k"], None, destination_compacted_table_id="T.DEST")
    listing = lake.listing()
    assert main(["read", "--catalog", lake.uri, "--table", "T.S", "--compacted-table", "T.DEST"]) == 0
    assert "3 rows" in capsys.readouterr().out
    assert main(["read", "--catalog", lake.uri, "--table", "T.S", "--compacted-table", "T.DESTT"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'T.DESTT'" in err[0] and "--destination" in err[0]
    assert lake.listing() == listing


def test_cli_read_out_refuses_a_non_empty_dir_unless_overwrite(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """read --out, like export: a stale file beside the new ones would bring deleted rows back to a reader of the
    directory, so a non-empty DIR is refused in one line (and left as it was) unless --overwrite replaces it."""
    lake.append("T.O", {"d": "1"}, "upsert", [pa.table({"k": [1, 2], "v": ["a", "b"]})])
    run_compact(lake, "T.O", ["k"], None)
    lake.append("T.O", {"d": "1"}, "delete", [pa.table({"k": [2]})])
    out = tmp_path / "out"
    stale = out / "d=1" / "part-00009.parquet"
    stale.parent.mkdir(parents=True)
    pq.write_table(pa.table({"k": [2], "v": ["b"]}), stale)
    assert main(["read", "--catalog", lake.uri, "--table", "T.O", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0] and "--overwrite" in err[0]
    assert sorted(p.name for p in out.rglob("*.parquet")) == ["part-00009.parquet"]
    assert main(["read", "--catalog", lake.uri, "--table", "T.O", "--out", str(out), "--overwrite"]) == 0
    files = sorted(out.rglob("*.parquet"))
    assert [str(p) for p in files] == capsys.readouterr().out.split()
    assert pa.concat_tables([pq.read_table(p) for p in files]).to_pylist() == [{"k": 1, "v": "a"}]
    assert not list(tmp_path.glob(".out.*"))  # no temporary directory left beside it


def test_a_source_compacted_into_another_table_reads_through_it_without_naming_it(tmp_path: Path) -> None:
    """``read`` of a source compacted with --destination, without --compacted-table: the keys and compacted rows
    live in the destination. It returned one row per delta row (duplicate keys, deletes ignored), exit 0."""
    cat = Catalog(tmp_path / "lake")
    part = {"p": "a"}
    cat.append("S", part, "upsert", [pa.table({"k": [1, 2, 3, 1], "ts": [1, 1, 1, 2], "v": ["a", "b", "c", "a2"]})])
    run_compact(cat, "S", ["k"], [("ts", "ascending")], destination_compacted_table_id="D")
    cat.append("S", part, "upsert", [pa.table({"k": [1, 3], "ts": [0, 5], "v": ["stale", "c5"]})])
    cat.append("S", part, "delete", [pa.table({"k": [2]})])
    before = cat.listing()
    got = sorted(read(cat, "S").to_pylist(), key=lambda r: r["k"])
    assert got == sorted(read(cat, "S", compacted_table_id="D").to_pylist(), key=lambda r: r["k"])
    assert got == [{"k": 1, "ts": 2, "v": "a2"}, {"k": 3, "ts": 5, "v": "c5"}]
    assert cat.listing() == before


def test_a_new_partition_read_with_primary_keys_alone_keeps_the_tables_sort_keys(tmp_path: Path) -> None:
    """As compact: sort keys not given are the table's (another partition records them); read fell back to the
    stream position, so the stale row won."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"p": "a"}, "upsert", [pa.table({"k": [1], "ts": [1], "v": ["x"]})])
    run_compact(cat, "T", ["k"], [("ts", "ascending")])
    cat.append("T", {"p": "b"}, "upsert", [pa.table({"k": [1], "ts": [10], "v": ["new"]})])
    cat.append("T", {"p": "b"}, "upsert", [pa.table({"k": [1], "ts": [5], "v": ["stale"]})])
    assert read(cat, "T", partitions=[{"p": "b"}], primary_keys=["k"]).to_pylist() == [{"k": 1, "ts": 10, "v": "new"}]


def test_reading_the_destination_includes_source_partitions_never_compacted_into_it(tmp_path: Path) -> None:
    """read() of the destination table (its versions name their source) planned the destination's own partitions
    only: a source partition not yet compacted there was left out, where compacting then reading gives its rows."""
    cat = Catalog(tmp_path / "lake")
    cat.append("SRC", {"p": "a"}, "upsert", [pa.table({"k": [1, 2], "v": ["a1", "a2"]})])
    run_compact(cat, "SRC", ["k"], None, destination_compacted_table_id="DEST")
    cat.append("SRC", {"p": "b"}, "upsert", [pa.table({"k": [3], "v": ["b3"]})])
    before = cat.listing()
    got = sorted(read(cat, "DEST").to_pylist(), key=lambda r: r["k"])
    assert got == sorted(read(cat, "SRC", compacted_table_id="DEST").to_pylist(), key=lambda r: r["k"])
    assert [r["k"] for r in got] == [1, 2, 3] and cat.listing() == before
    assert [r["k"] for r in read(cat, "DEST", partitions=[{"p": "b"}]).to_pylist()] == [3]
    run_compact(cat, "SRC", None, None, destination_compacted_table_id="DEST")
    assert sorted(read(cat, "DEST").to_pylist(), key=lambda r: r["k"]) == got


def test_reading_through_destinations_keeps_a_destinations_own_deltas_and_the_recorded_keys(tmp_path: Path) -> None:
    """The review of this session's read fixes: a destination with deltas of its own keeps them (read of it once
    dropped them, and a partition filter named the source); a source partition never compacted anywhere reads
    with the keys its destination records, also when the primary keys alone are given."""
    cat = Catalog(tmp_path / "lake")
    cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1, 1], "ts": [9, 1], "v": ["a-win", "a-stale"]})])
    run_compact(cat, "S", ["k"], [("ts", "ascending")], destination_compacted_table_id="D")
    cat.append("S", {"p": "b"}, "upsert", [pa.table({"k": [1, 1], "ts": [9, 1], "v": ["b-win", "b-stale"]})])
    want = [{"k": 1, "ts": 9, "v": "a-win"}, {"k": 1, "ts": 9, "v": "b-win"}]
    assert read(cat, "S").to_pylist() == want == read(cat, "S", primary_keys=["k"]).to_pylist()
    assert read(cat, "S", partitions=[{"p": "b"}]).to_pylist() == want[1:]
    assert read(cat, "D").to_pylist() == want
    cat.append("D", {"p": "c"}, "upsert", [pa.table({"k": [2], "ts": [1], "v": ["D-own"]})])
    assert [r["v"] for r in read(cat, "D").to_pylist()] == ["a-win", "D-own", "b-win"]
    assert [r["v"] for r in read(cat, "D", partitions=[{"p": "c"}]).to_pylist()] == ["D-own"]
    with pytest.raises(FlashError, match=r"unknown partition p=zz of table 'D'"):
        read(cat, "D", partitions=[{"p": "zz"}])


def test_reads_through_a_destination_whose_first_partition_is_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The second review of this session's read fixes: a destination whose first-listed partitions are its own (not
    its source's) hid the source (read of the source returned raw rows, optimize packed them), read of the
    destination missed the source's partitions past its first four, read --out wrote fewer rows than read printed,
    and partitions=[] read nothing. Each read equals compacting then reading the destination."""
    from flash_pipeline.optimize import optimize

    cat = Catalog(tmp_path / "lake")
    for p in ("a0", "a1", "a2", "a3", "a4"):  # the destination's own partitions, listed before the source's
        cat.append("D", {"p": p}, "upsert", [pa.table({"k": [0], "v": [f"D-{p}"]})])
    run_compact(cat, "D", ["k"], None)
    cat.append("S", {"p": "b"}, "upsert", [pa.table({"k": [1, 1], "v": ["b-old", "b-new"]})])
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D")
    cat.append("S", {"p": "b"}, "upsert", [pa.table({"k": [1], "v": ["b-newer"]})])
    cat.append("S", {"p": "c"}, "upsert", [pa.table({"k": [2, 2], "v": ["c-old", "c-new"]})])
    assert [r["v"] for r in read(cat, "S").to_pylist()] == ["b-newer", "c-new"] == [r["v"] for r in read(cat, "S", partitions=[]).to_pylist()]
    assert [r["v"] for r in read(cat, "S", partitions=[{"p": "c"}]).to_pylist()] == ["c-new"]
    assert [r["v"] for r in read(cat, "D").to_pylist()] == ["D-a0", "D-a1", "D-a2", "D-a3", "D-a4", "b-newer", "c-new"]
    assert [r["v"] for r in read(cat, "D", partitions=[{"p": "c"}]).to_pylist()] == ["c-new"]
    out = tmp_path / "out"
    assert main(["read", "--catalog", cat.uri, "--table", "D", "--out", str(out)]) == 0
    assert sorted(r["v"] for f in out.rglob("*.parquet") for r in pq.read_table(f).to_pylist()) == sorted(
        ["D-a0", "D-a1", "D-a2", "D-a3", "D-a4", "b-newer", "c-new"])
    assert main(["read", "--catalog", cat.uri, "--table", "D", "--partition", "p=c"]) == 0 and "1 rows" in capsys.readouterr().out
    res = optimize(cat, "S", progress=lambda m: None)
    assert {r.status for r in res.partitions} == {"skipped"} and cat.latest_compacted("S", (("p", "b"),)) is None
    run_compact(cat, "S", None, None, destination_compacted_table_id="D")
    assert [r["v"] for r in read(cat, "D").to_pylist()] == ["D-a0", "D-a1", "D-a2", "D-a3", "D-a4", "b-newer", "c-new"]


def test_a_source_whose_first_partitions_were_never_compacted_reads_through_its_destination(tmp_path: Path) -> None:
    """The third review: a source whose first-listed partitions were compacted nowhere (a later one into D) read
    raw rows with duplicate keys, and optimize published them; read --out of a destination holding two sources
    left one source's partitions out. Each now equals compacting then reading the destination."""
    from flash_pipeline.optimize import optimize

    cat = Catalog(tmp_path / "lake")
    for p in "abcd":
        cat.append("S", {"p": p}, "upsert", [pa.table({"k": [ord(p)] * 2, "v": [f"{p}-old", f"{p}-new"]})])
    cat.append("S", {"p": "e"}, "upsert", [pa.table({"k": [101, 101], "v": ["e-old", "e-new"]})])
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D", partitions=[{"p": "e"}])
    want = ["a-new", "b-new", "c-new", "d-new", "e-new"]
    assert [r["v"] for r in read(cat, "S").to_pylist()] == want
    assert [r["v"] for r in read(cat, "S", partitions=[{"p": "a"}]).to_pylist()] == ["a-new"]
    assert {r.status for r in optimize(cat, "S", progress=lambda m: None).partitions} == {"skipped"}
    assert cat.latest_compacted("S", (("p", "a"),)) is None
    cat.append("S2", {"p": "x"}, "upsert", [pa.table({"k": [7], "v": ["x7"]})])
    cat.append("S2", {"p": "y"}, "upsert", [pa.table({"k": [8], "v": ["y8"]})])
    run_compact(cat, "S2", ["k"], None, destination_compacted_table_id="D", partitions=[{"p": "x"}])
    out = tmp_path / "out"
    assert main(["read", "--catalog", cat.uri, "--table", "D", "--out", str(out)]) == 0
    written = sorted(r["v"] for f in out.rglob("*.parquet") for r in pq.read_table(f).to_pylist())
    assert written == sorted(r["v"] for r in read(cat, "D").to_pylist()) == sorted(want + ["x7", "y8"])
    run_compact(cat, "S", None, None, destination_compacted_table_id="D")
    assert [r["v"] for r in read(cat, "S").to_pylist()] == want


@settings(FAST, max_examples=12)
@given(s=streams(), data=st.data())
def test_reads_of_a_source_and_its_destination_equal_the_oracle(s: dict[str, Any], data: st.DataObject) -> None:
    """Randomized: a source's partitions, some compacted into a destination (a random prefix of each stream),
    some never; the destination may hold a partition of its own. read() of the source, of the destination, and
    of each partition, without naming the destination, equal the DuckDB oracle of what was appended."""
    deltas = s["deltas"]
    parts = [{"region": r} for r in ("eu", "us", "zz")]
    compacted = data.draw(st.lists(st.booleans(), min_size=3, max_size=3), label="partitions compacted into D")
    own = data.draw(st.booleans(), label="the destination holds a partition of its own")
    with fresh_lake() as cat:
        logs = []
        for part, into in zip(parts, compacted):
            log = DeltaLog(cat, "S", part, SCHEMA)
            cut = data.draw(st.integers(1, len(deltas))) if into else len(deltas)
            for op, files in deltas[:cut]:
                log.append(op, files)
            if into:
                run_compact(cat, "S", PKS, s["sort_keys"], destination_compacted_table_id="D", partitions=[part])
            for op, files in deltas[cut:]:
                log.append(op, files)
            logs.append(log)
        if not any(compacted):  # keys recorded nowhere: read with them given
            run_compact(cat, "S", PKS, s["sort_keys"], destination_compacted_table_id="D", partitions=[parts[0]])
        if own:
            mine = DeltaLog(cat, "D", {"region": "aa"}, SCHEMA)
            mine.append("upsert", [f for op, files in deltas if op == "upsert" for f in files][:1] or [SCHEMA.empty_table()])
        want = [rows_of(oracle(log.log_table(), PKS, s["sort_keys"], COLUMNS), COLUMNS) for log in logs]
        for part, expected in zip(parts, want):
            assert rows_of(read(cat, "S", partitions=[part]), COLUMNS) == expected
            assert rows_of(read(cat, "D", partitions=[part]), COLUMNS) == expected
        assert rows_of(read(cat, "S"), COLUMNS) == sorted((r for w in want for r in w), key=repr)
        if not own:
            assert rows_of(read(cat, "D"), COLUMNS) == sorted((r for w in want for r in w), key=repr)


@pytest.mark.parametrize("compacted", [False, True])
def test_partitions_that_evolved_apart_read_together_widened(tmp_path: Path, compacted: bool) -> None:
    """One partition widened a column (int32 -> int64, an accepted change), another did not: read of the whole
    table gives every partition's rows in the wider type, as each partition reads alone; before the fix the
    concatenation failed with an ArrowTypeError (exit 1, "unexpected")."""
    cat = Catalog(tmp_path / "lake")
    narrow = pa.table({"id": pa.array([1, 2], pa.int64()), "amt": pa.array([10, 20], pa.int32())})
    wide = pa.table({"id": pa.array([2], pa.int64()), "amt": pa.array([2**40], pa.int64())})
    cat.append("T", (("d", "a"),), "upsert", [narrow])
    cat.append("T", (("d", "b"),), "upsert", [narrow])
    cat.append("T", (("d", "b"),), "upsert", [wide])
    keys: dict[str, Any] = {"primary_keys": ["id"]}
    if compacted:
        run_compact(cat, "T", ["id"], None)
        keys = {}
    got = read(cat, "T", **keys)
    assert got.schema.field("amt").type == pa.int64()
    parts = [read(cat, "T", [p], **keys) for p in ("d=a", "d=b")]
    assert parts[0].schema.field("amt").type == pa.int32()  # a partition alone keeps its own type
    assert sorted(got.to_pylist(), key=str) == sorted(parts[0].to_pylist() + parts[1].to_pylist(), key=str)
    assert sorted(r["amt"] for r in got.to_pylist()) == [10, 10, 20, 2**40]


def test_partitions_with_no_common_schema_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("T", (("d", "a"),), "upsert", [pa.table({"id": pa.array([1], pa.int64()), "v": pa.array([1], pa.int64())})])
    cat.append("T", (("d", "b"),), "upsert", [pa.table({"id": pa.array([1], pa.int64()), "v": pa.array(["x"])})])
    with pytest.raises(FlashError, match=r"T: its partitions' rows have no common schema .*--partition"):
        read(cat, "T", primary_keys=["id"])
    listing = cat.listing()
    assert main(["read", "--catalog", str(tmp_path / "lake"), "--table", "T", "--primary-key", "id"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no common schema" in err[0] and cat.listing() == listing
    assert main(["read", "--catalog", str(tmp_path / "lake"), "--table", "T", "--partition", "d=b", "--primary-key", "id"]) == 0


def test_reading_a_table_no_compaction_keyed_looks_its_keys_up_once(tmp_path, monkeypatch) -> None:
    """A partition without keys of its own takes the table's (another partition's): for a table never compacted,
    every partition walked every other partition's record, O(partitions^2) requests (144 s for 50 partitions on
    an S3 endpoint, read --out). One lookup now serves the whole read, read --out and optimize."""
    from compaction_helpers import counted_reads
    from flash_pipeline.cli import main

    cat = Catalog(tmp_path / "lake")
    n = 24
    for i in range(n):
        cat.append("T.MANY", {"d": f"p{i:02d}"}, "upsert", [pa.table({"id": [1, 1, 2], "v": [i, i + 100, i]})])
    reads = counted_reads(monkeypatch)
    got = read(cat, "T.MANY", primary_keys=["id"])
    assert got.num_rows == 2 * n and sorted(got.column("v").to_pylist()) == sorted([i + 100 for i in range(n)] + list(range(n)))
    records = sum(k.endswith("/partition.json") for k in reads)
    assert records <= 3 * n, records  # was ~n*n
    reads.clear()
    assert main(["read", "--catalog", cat.uri, "--table", "T.MANY", "--primary-key", "id", "--out", str(tmp_path / "out")]) == 0
    records = sum(k.endswith("/partition.json") for k in reads)
    assert records <= 4 * n, records
    assert len(list((tmp_path / "out").iterdir())) == n
