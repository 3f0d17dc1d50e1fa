"""Compacted files in every output format (parquet, feather, orc, csv), incremental runs reading them back."""

from __future__ import annotations

import datetime as _dt
import decimal as _dec
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog, ContentType
from flash_pipeline.catalog.files import csv_unsupported_columns, unsupported_columns
from flash_pipeline.cli import main
from flash_pipeline.merge_on_read import read as merge_on_read
from tests.compaction_helpers import FILE, OP, POS, ROW, DeltaLog, oracle, read_compacted, rows_of, run_compact

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("ts", pa.int64()), ("x", pa.float64())])


def _delta(rng: np.random.Generator, n: int) -> pa.Table:
    keys = rng.integers(0, 300, n)
    return pa.table({"k": keys, "s": np.char.add("v", keys.astype(str)), "ts": rng.integers(0, 30, n), "x": rng.random(n)}, schema=SCHEMA)


@pytest.mark.parametrize("fmt", list(ContentType))
def test_each_output_format_compacts_and_recompacts(lake: Catalog, fmt: ContentType) -> None:
    rng = np.random.default_rng(hash(fmt.value) % 1000)
    log = DeltaLog(lake, "F.T", {"d": "1"}, SCHEMA)
    log.append("upsert", [_delta(rng, 400), _delta(rng, 100)])
    log.append("delete", [_delta(rng, 40).select(["k"])])
    run_compact(lake, "F.T", ["k"], [("ts", "ascending")], compacted_file_content_type=fmt, rows_per_compacted_file=90, hash_bucket_count=2)
    log.append("upsert", [_delta(rng, 60)])
    run_compact(lake, "F.T", None, None)  # reads the compacted files of this format back (rewritten or carried)
    latest = lake.latest_compacted("F.T", (("d", "1"),))
    assert latest is not None and {f.content_type for f in latest.files} == {fmt}
    assert all(f.key.endswith(fmt.extension) for f in latest.files)
    expected = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert rows_of(read_compacted(lake, "F.T", {"d": "1"}), SCHEMA.names) == rows_of(expected, SCHEMA.names)
    if fmt in (ContentType.PARQUET, ContentType.FEATHER):  # annotations ride in the schema metadata (ORC/CSV: manifest only)
        meta = lake.read_file(latest.files[0]).schema.metadata
        assert meta[b"flash.compacted_table_id"] == b"F.T" and meta[b"flash.operation_type"] == b"upsert"


# ----- every column type the catalog accepts, in every output format ---------------------------------------
TZ = "America/Los_Angeles"
SCALAR_TYPES = pa.schema([
    ("k", pa.int64()), ("seq", pa.int64()),
    ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()),
    ("u8", pa.uint8()), ("u16", pa.uint16()), ("u32", pa.uint32()), ("u64", pa.uint64()),
    ("f32", pa.float32()), ("f64", pa.float64()), ("b", pa.bool_()),
    ("s", pa.string()), ("ls", pa.large_string()),
    ("d32", pa.date32()), ("ts_ms", pa.timestamp("ms")), ("ts_us_tz", pa.timestamp("us", tz=TZ)), ("ts_ns", pa.timestamp("ns")),
    ("dec", pa.decimal128(12, 3)), ("t64", pa.time64("us")), ("dur", pa.duration("us")),
    # Arrow's newer decimals, which its CSV and ORC readers cannot produce: compacted into CSV or ORC they once
    # gave a version nothing could read
    ("dec32", pa.decimal32(7, 2)), ("dec64", pa.decimal64(12, 2)),
])
NON_CSV_TYPES = pa.schema([("bin", pa.binary()), ("lst", pa.list_(pa.int64())), ("st", pa.struct([("a", pa.int32()), ("s", pa.string())]))])
# values that text formats tend to lose: null vs "" vs "null", NaN, +-inf, -0.0, extremes, separators in text
TRICKY_TEXT = ["", "null", "NaN", "a,b", 'say "hi"', "line1\nline2", "cr\r\nlf", " padded ", "ünï", "NA", "\\N", "1e3", "true"]


def _typed_delta(rng: np.random.Generator, n: int, keys: int, seq0: int, schema: pa.Schema) -> pa.Table:
    """n rows of ``schema`` (keys drawn from 0..keys-1) with about 20% nulls and every tricky value."""
    def pick(values: list, null_share: float = 0.2, gen: np.random.Generator = rng) -> list:
        out = [values[i] for i in gen.integers(0, len(values), n)]
        return [None if m else v for v, m in zip(out, gen.random(n) < null_share)]

    later = np.random.default_rng(seq0)  # columns added later draw apart: the others' rows stay as they were

    base = _dt.datetime(2001, 2, 3, 4, 5, 6, 789123)
    cols = {
        "k": list(map(int, rng.integers(0, keys, n))), "seq": list(range(seq0, seq0 + n)),
        "i8": pick([-128, 127, 0, -1]), "i16": pick([-(2**15), 2**15 - 1, 7]), "i32": pick([-(2**31), 2**31 - 1, 3]),
        "u8": pick([0, 255]), "u16": pick([0, 65535]), "u32": pick([0, 2**32 - 1]), "u64": pick([0, 2**63, 2**64 - 1, 12345]),
        "f32": pick([float("nan"), float("inf"), float("-inf"), -0.0, 1.5, 3.4028235e38]),
        "f64": pick([float("nan"), float("inf"), float("-inf"), -0.0, 0.1, 1e-300, 5e-324]),
        "b": pick([True, False]), "s": pick(TRICKY_TEXT), "ls": pick(TRICKY_TEXT),
        "d32": pick([_dt.date(1970, 1, 1), _dt.date(2262, 4, 10), _dt.date(1700, 12, 31)]),
        "ts_ms": pick([base, _dt.datetime(1969, 12, 31, 23, 59, 59, 999000)]),
        "ts_us_tz": pick([base.replace(tzinfo=_dt.timezone.utc), _dt.datetime(2020, 3, 8, 10, 0, tzinfo=_dt.timezone.utc)]),
        "ts_ns": pick([1, -1, 1_600_000_000_123_456_789]),
        "dec": pick([_dec.Decimal("0.000"), _dec.Decimal("-123456789.012"), _dec.Decimal("1.5")]),
        "t64": pick([_dt.time(0, 0), _dt.time(23, 59, 59, 999999)]),
        "dur": pick([_dt.timedelta(microseconds=-1), _dt.timedelta(days=3, microseconds=7)]),
        "bin": pick([b"", b"\x00\xff,\n\"", b"null"]), "lst": pick([[], [1, None, -2], [2**62]]),
        "st": pick([{"a": 1, "s": ""}, {"a": None, "s": None}, {"a": -1, "s": "x,\n"}]),
        "dec32": pick([_dec.Decimal("0.00"), _dec.Decimal("-99999.99"), _dec.Decimal("12.5")], gen=later),
        "dec64": pick([_dec.Decimal("0.00"), _dec.Decimal("-9999999999.99"), _dec.Decimal("1.25")], gen=later),
    }
    return pa.table({f.name: pa.array(cols[f.name], f.type) for f in schema}, schema=schema)


class _ArrowLog:
    """The appended rows as Arrow (exact types), with position, file number and row index of each row."""

    def __init__(self, cat: Catalog, table_id: str, schema: pa.Schema) -> None:
        self.cat, self.table_id, self.schema, self.parts = cat, table_id, schema, []

    def append(self, op: str, files: list[pa.Table]) -> None:
        delta = self.cat.append(self.table_id, None, op, files)
        for number, t in enumerate(files, 1):
            full = t if op == "upsert" else pa.table({f.name: t.column(f.name) if f.name in t.column_names else pa.nulls(t.num_rows, f.type) for f in self.schema})
            meta = {POS: pa.array(np.full(t.num_rows, delta.position)), FILE: pa.array(np.full(t.num_rows, number)),
                    ROW: pa.array(np.arange(t.num_rows)), OP: pa.array([op] * t.num_rows)}
            self.parts.append(pa.table({**{n: full.column(n) for n in self.schema.names}, **meta}))

    def expected(self) -> pa.Table:
        """The surviving rows: which ones from the DuckDB oracle (on keys and rank only), their values from Arrow."""
        log = pa.concat_tables(self.parts)
        ids = oracle(log.select(["k", "seq", POS, FILE, ROW, OP]), ["k"], [("seq", "ascending")], [POS, FILE, ROW])
        rid = lambda t: pc.add(pc.multiply(t.column(POS), 10**9), pc.add(pc.multiply(t.column(FILE), 10**6), t.column(ROW)))  # noqa: E731
        return log.filter(pc.is_in(rid(log), rid(ids))).select(self.schema.names)


def assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    """Same columns, same types, same rows (by primary key k): NaN equals NaN, null equals only null."""
    assert got.schema.names == expected.schema.names
    for f in expected.schema:
        assert got.schema.field(f.name).type == f.type, (f.name, got.schema.field(f.name).type, f.type)
    assert got.num_rows == expected.num_rows
    got = got.take(pc.sort_indices(got, [("k", "ascending")]))
    expected = expected.take(pc.sort_indices(expected, [("k", "ascending")]))
    for name in expected.column_names:
        a, b = got.column(name).combine_chunks(), expected.column(name).combine_chunks()
        if pa.types.is_floating(a.type):
            x, y = a.cast(pa.float64()), b.cast(pa.float64())
            assert x.is_null().equals(y.is_null()), name
            xs, ys = x.fill_null(0).to_numpy(), y.fill_null(0).to_numpy()
            assert np.array_equal(xs, ys, equal_nan=True) and np.array_equal(np.signbit(xs), np.signbit(ys)), name
        else:
            assert a.equals(b), (name, a, b)


def _exported(cat: Catalog, table_id: str, out: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in cat.export(table_id, out)])


@pytest.mark.parametrize("fmt", list(ContentType))
def test_every_column_type_round_trips_in_each_format(lake: Catalog, fmt: ContentType, tmp_path: Path) -> None:
    """Compact into ``fmt``, then read the compacted files back three ways: export, merge-on-read (with a
    pending delta), and an incremental compaction that rewrites and carries them. Types and values (nulls, "",
    NaN, +-inf, -0.0, separators) equal the input."""
    schema = SCALAR_TYPES if fmt is ContentType.CSV else pa.schema(list(SCALAR_TYPES) + list(NON_CSV_TYPES))
    rng = np.random.default_rng(7)
    log = _ArrowLog(lake, "TY.T", schema)
    log.append("upsert", [_typed_delta(rng, 80, 50, 0, schema), _typed_delta(rng, 40, 50, 80, schema)])
    log.append("delete", [pa.table({"k": pa.array([1, 2, 3, 4, 5], pa.int64())})])
    run_compact(lake, "TY.T", ["k"], [("seq", "ascending")], compacted_file_content_type=fmt,
                rows_per_compacted_file=9, hash_bucket_count=3)
    cv = lake.latest_compacted("TY.T", ())
    assert cv is not None and {f.content_type for f in cv.files} == {fmt}
    assert_same_rows(_exported(lake, "TY.T", tmp_path / "e1"), log.expected())
    assert_same_rows(merge_on_read(lake, "TY.T"), log.expected())

    log.append("upsert", [_typed_delta(rng, 12, 50, 1000, schema)])  # touches a few compacted files only
    assert_same_rows(merge_on_read(lake, "TY.T"), log.expected())  # compacted files of fmt + a pending delta
    run_compact(lake, "TY.T", None, None)  # materialize reads the prior fmt files (kept rows) back
    cv2 = lake.latest_compacted("TY.T", ())
    assert cv2 is not None and cv2.version == cv.version + 1 and {f.content_type for f in cv2.files} == {fmt}
    assert {f.key for f in cv2.files} & {f.key for f in cv.files}, "some files should be carried"
    assert_same_rows(_exported(lake, "TY.T", tmp_path / "e2"), log.expected())
    assert_same_rows(merge_on_read(lake, "TY.T", columns=["k", "s", "f64", "u64"]), log.expected().select(["k", "s", "f64", "u64"]))


def test_csv_output_refuses_columns_text_cannot_hold(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """binary and nested columns would not read back from CSV: compacting to CSV exits 2 naming the column,
    and nothing is committed; parquet of the same table works."""
    assert csv_unsupported_columns(SCALAR_TYPES) == []
    assert csv_unsupported_columns(NON_CSV_TYPES) == ["'bin' (binary)", "'lst' (list<item: int64>)", "'st' (struct<a: int32, s: string>)"]
    assert unsupported_columns(pa.schema(list(SCALAR_TYPES) + list(NON_CSV_TYPES)), ContentType.ORC) == []
    lake.append("TY.B", None, "upsert", [pa.table({"k": [1, 2], "blob": pa.array([b"\xff\x00", None], pa.binary())})])
    code = main(["compact", "--catalog", lake.uri, "--table", "TY.B", "--primary-key", "k", "--format", "csv"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("flash-compactor: error: ")]
    assert code == 2 and len(errors) == 1 and err.endswith(errors[0] + "\n"), err  # progress lines may come first
    assert "'blob' (binary)" in errors[0] and "csv" in errors[0] and "--format parquet" in errors[0]
    assert lake.latest_compacted("TY.B", ()) is None
    assert main(["compact", "--catalog", lake.uri, "--table", "TY.B", "--primary-key", "k", "--format", "parquet"]) == 0
    assert merge_on_read(lake, "TY.B").sort_by("k").column("blob").to_pylist() == [b"\xff\x00", None]


def test_parquet_output_refuses_what_arrows_parquet_writer_cannot_write(lake: Catalog, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An interval column, accepted from a Feather delta, failed the default Parquet compaction
    mid-run ("unexpected ArrowNotImplementedError", exit 1); it is refused before any work, naming the column and
    only the formats that hold it, and that format compacts it."""
    import pyarrow.feather as pf

    column = pa.array([pa.MonthDayNano([1, 2, 3])] * 2, pa.month_day_nano_interval())
    path = tmp_path / "iv.feather"
    pf.write_feather(pa.table({"k": pa.array([1, 2], pa.int64()), "x": column}), path)
    assert main(["append", "--catalog", lake.uri, "--table", "TY.I", "--op", "upsert", str(path)]) == 0
    capsys.readouterr()
    code = main(["compact", "--catalog", lake.uri, "--table", "TY.I", "--primary-key", "k"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and f"'x' ({column.type})" in line and line.endswith("compact with --format feather"), line
    assert lake.latest_compacted("TY.I", ()) is None
    assert main(["compact", "--catalog", lake.uri, "--table", "TY.I", "--primary-key", "k", "--format", "feather"]) == 0
    assert merge_on_read(lake, "TY.I").sort_by("k").column("x").to_pylist() == column.to_pylist()


def test_user_csv_delta_reads_with_its_recorded_types(lake: Catalog, tmp_path: Path) -> None:
    """A delta CSV file is read with the types recorded when it was appended, also when a read asks for a
    subset of columns; compacting it to CSV and reading back keeps them."""
    src = tmp_path / "in.csv"
    src.write_text('k,when,code,txt\n1,2020-01-01 00:00:01,007,"a,b"\n2,,008,\n3,2020-01-02 10:00:00,,"x\ny"\n')
    delta = lake.append("TY.C", None, "upsert", [str(src)])
    recorded = delta.pa_schema()
    expected = pacsv.read_csv(str(src))  # how the file reads on its own, as appended
    assert recorded == expected.schema
    got = merge_on_read(lake, "TY.C", primary_keys=["k"])
    assert got.schema == recorded and got.sort_by("k").equals(expected)
    assert merge_on_read(lake, "TY.C", primary_keys=["k"], columns=["code"]).schema.field("code").type == recorded.field("code").type
    run_compact(lake, "TY.C", ["k"], None, compacted_file_content_type=ContentType.CSV)
    assert merge_on_read(lake, "TY.C").sort_by("k").equals(expected)


@pytest.mark.parametrize("partition", [{"d": "1"}, {"Order Day": "1995-04-03"}])
def test_csv_output_keeps_null_apart_from_empty_under_any_partition(lake: Catalog, partition: dict[str, str]) -> None:
    """A compacted CSV file tells null (unquoted empty) from "" (quoted), and NaN from null; reading it back must
    use those conventions wherever the file lives. A partition whose key needs ``%`` (the paper's ``Order Day``)
    writes under the lake's ``delta/`` folder, and its files were read back as a user's CSV: the null key became
    "" and collided with the real "" key on the next compaction (two rows for one key)."""
    schema = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("x", pa.float64())])
    log = DeltaLog(lake, "F.N", partition, schema)
    log.append("upsert", [pa.table({"k": [None, "", "a"], "ts": [1, 1, 1], "x": [float("nan"), None, 1.0]}, schema=schema)])
    run_compact(lake, "F.N", ["k"], [("ts", "ascending")], compacted_file_content_type=ContentType.CSV, hash_bucket_count=1)
    log.append("upsert", [pa.table({"k": ["", "b"], "ts": [2, 2], "x": [2.0, None]}, schema=schema)])
    run_compact(lake, "F.N", None, None)  # reads the first version's CSV file back
    got = read_compacted(lake, "F.N", partition)
    want = oracle(log.log_table(), ["k"], [("ts", "ascending")], schema.names)
    assert got.num_rows == 4
    assert sorted(map(repr, got.select(schema.names).to_pylist())) == sorted(map(repr, want.select(schema.names).to_pylist()))


def test_date64_outside_nanosecond_range_round_trips_through_orc(lake: Catalog) -> None:
    """ORC's writer makes a date64 column a nanosecond timestamp, which cannot hold 0001-01-01 or 9999-12-31:
    compacted with --format orc, such a version committed and then nothing could read it (export, merge-on-read,
    the next compaction). It is stored as date32 now (exact: a date64 holds whole days) and cast back."""
    days = [_dt.date(1, 1, 1), _dt.date(9999, 12, 31), None, _dt.date(1970, 1, 1)]
    table = pa.table({"k": pa.array([1, 2, 3, 4], pa.int64()), "d": pa.array(days, pa.date64())})
    lake.append("TY.D", None, "upsert", [table])
    run_compact(lake, "TY.D", ["k"], None, compacted_file_content_type=ContentType.ORC)
    lake.append("TY.D", None, "upsert", [table.slice(3, 1)])
    got = merge_on_read(lake, "TY.D")  # the ORC file read back with a pending delta
    assert got.schema.field("d").type == pa.date64()
    assert dict(zip(got.column("k").to_pylist(), got.column("d").to_pylist())) == dict(zip(range(1, 5), days))
    run_compact(lake, "TY.D", None, None)  # the next compaction reads the ORC file back too
    cv = lake.latest_compacted("TY.D", ())
    back = pa.concat_tables([lake.read_live(f) for f in cv.files])
    assert dict(zip(back.column("k").to_pylist(), back.column("d").to_pylist())) == dict(zip(range(1, 5), days))


@pytest.mark.parametrize(("column", "bad"), [
    (pa.array([-10**11, 0], pa.timestamp("s")), "-1199-02-15"),          # before year 0
    (pa.array([0, 253402300800], pa.timestamp("s", "UTC")), "10000-01-01"),  # after year 9999
    (pa.array([2932897, 0], pa.date32()), "10000-01-01"),
    (pa.array([-2**63 + 1, 0], pa.timestamp("ns")), "1677-09-21"),         # next to int64's minimum
])
def test_csv_output_refuses_dates_its_reader_cannot_parse_back(lake: Catalog, capsys: pytest.CaptureFixture[str],
                                                               column: pa.Array, bad: str) -> None:
    """Arrow's CSV writer writes any date, its reader parses years 0000-9999 only: such a version was committed
    (exit 0) and every later command failed on it (export, read, compact, exit 4). Now compacting to CSV exits 2
    naming the column and its value, nothing committed; the extremes CSV does give back still compact."""
    lake.append("TY.T", None, "upsert", [pa.table({"k": pa.array([1, 2], pa.int64()), "t": column})])
    code = main(["compact", "--catalog", lake.uri, "--table", "TY.T", "--primary-key", "k", "--format", "csv"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flash-compactor: error: ")]
    assert code == 2 and len(errors) == 1 and "'t'" in errors[0] and bad in errors[0] and "--format parquet" in errors[0]
    assert lake.latest_compacted("TY.T", ()) is None
    first_last = [_dt.date(1, 1, 1), _dt.date(9999, 12, 31)]
    if pa.types.is_date(column.type):
        edges = pa.array(first_last, column.type)
    elif column.type.unit == "ns":
        edges = pa.array([-2**63 + 10**9, 2**63 - 1], column.type)
    else:
        edges = pa.array(first_last).cast(pa.timestamp("s")).cast(column.type)
    edge = pa.table({"k": pa.array([3, 4], pa.int64()), "t": edges})
    lake.append("TY.E", None, "upsert", [edge])
    assert main(["compact", "--catalog", lake.uri, "--table", "TY.E", "--primary-key", "k", "--format", "csv"]) == 0
    assert merge_on_read(lake, "TY.E").sort_by("k").column("t").equals(edge.column("t"))


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_a_negative_scale_decimal_is_refused_before_any_work(lake: Catalog, tmp_path: Path, fmt: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """decimal128(5, -2) from a Feather delta: Parquet's writer failed mid-compaction (exit 1) and ORC's ended the
    process (exit 134, no line of ours; found by a review). Both are refused in one line, exit 2, nothing written."""
    import pyarrow.feather as pf

    path = tmp_path / "neg.feather"
    pf.write_feather(pa.table({"k": [1, 2], "n": pa.array([_dec.Decimal("12300"), None], pa.decimal128(5, -2))}), path)
    assert main(["append", "--catalog", lake.uri, "--table", "TY.N", "--op", "upsert", str(path)]) == 0
    capsys.readouterr()
    code = main(["compact", "--catalog", lake.uri, "--table", "TY.N", "--primary-key", "k", "--format", fmt])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "'n' (decimal128(5, -2))" in line and f"cannot be stored in {fmt}" in line, line
    assert lake.latest_compacted("TY.N", ()) is None


def test_a_scale_above_the_precision_is_parquets_limit_not_orcs() -> None:
    """Arrow's ORC writer round-trips decimal128(5, 7); only Parquet's refuses it (a review found ORC refused)."""
    schema = pa.schema([("n", pa.decimal128(5, 7))])
    assert unsupported_columns(schema, ContentType.ORC) == []
    assert unsupported_columns(schema, ContentType.PARQUET) == ["'n' (decimal128(5, 7))"]
