"""The compiled digest kernels against plain-Python references (hashlib, int.from_bytes, sorted()), and every
scalar primary key type: framed by value, unambiguous, and compacted like a plain-Python model."""

from __future__ import annotations

import decimal
import hashlib
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.files import ContentType, read_table, write_table
from compaction_helpers import kernel_form
from flash_pipeline.compactor.kernels import digest
from flash_pipeline.errors import FlashError


def test_sha1_kernel_matches_hashlib_across_block_boundaries() -> None:
    lengths = list(range(0, 130)) + [183, 184, 247, 248, 1000]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    buf = np.frombuffer(os.urandom(int(offsets[-1])), dtype=np.uint8)
    with kernel_form("compiled"):
        got = digest.sha1_rows(buf, offsets)
    raw = buf.tobytes()
    expected = [hashlib.sha1(raw[a:b]).digest() for a, b in zip(offsets[:-1], offsets[1:])]
    assert [bytes(r) for r in got] == expected


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 9000))
def test_side_by_side_sha1_matches_hashlib_over_chunk_and_lane_boundaries(seed: int, n: int) -> None:
    """Thousands of rows (past LANE_CHUNK and across partial lane groups), mostly one block, some longer."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 56, n)
    longer = rng.random(n) < 0.05
    lengths[longer] = rng.integers(56, 300, int(longer.sum()))
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    buf = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    with kernel_form("compiled"):
        got = digest.sha1_rows(buf, offsets)
    raw = buf.tobytes()
    assert [bytes(r) for r in got] == [hashlib.sha1(raw[a:b]).digest() for a, b in zip(offsets[:-1], offsets[1:])]


def _kernels() -> list:
    from flash_pipeline.compactor.kernels import sha1, sha1_ni

    kernels = [pytest.param(sha1.sha1_rows_lanes, id="side-by-side"), pytest.param(sha1.sha1_rows_numba, id="row-at-a-time")]
    ni = pytest.mark.skipif(not sha1_ni.usable(), reason="this CPU has no SHA extensions (the kernel cannot be compiled here)")
    return kernels + [pytest.param(sha1_ni.sha1_rows_ni, id="sha-extensions", marks=ni)]


@pytest.mark.parametrize("kernel", _kernels())
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 3000), st.integers(0, 70))
def test_every_sha1_kernel_matches_hashlib(kernel, seed: int, n: int, tail: int) -> None:
    """Each kernel itself (sha1_rows uses the fastest this CPU runs): one-block rows, longer rows, and rows whose
    64 bytes would run past the buffer's end (the SHA-extension kernel pads those in memory, not in registers)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 56, n)
    longer = rng.random(n) < 0.05
    lengths[longer] = rng.integers(56, 300, int(longer.sum()))
    lengths = np.concatenate((lengths, rng.integers(0, 56, min(tail, 8))))
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    buf = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    out = np.empty((len(lengths), 20), dtype=np.uint8)
    kernel(buf, offsets, out)
    raw = buf.tobytes()
    assert [bytes(r) for r in out] == [hashlib.sha1(raw[a:b]).digest() for a, b in zip(offsets[:-1], offsets[1:])]


def test_sha1_rows_uses_the_sha_extensions_where_the_cpu_has_them_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from flash_pipeline.compactor.kernels import sha1, sha1_choice, sha1_ni, sha1_race

    monkeypatch.delenv("FLASH_SHA_EXTENSIONS", raising=False)
    fast = sha1_ni._cpu_has_extensions() and sha1_race.faster(sha1_ni.sha1_rows_ni, sha1.sha1_rows_lanes)
    assert sha1_choice.sha1_kernel() is (sha1_ni.sha1_rows_ni if fast else sha1.sha1_rows_lanes)
    monkeypatch.setenv("FLASH_SHA_EXTENSIONS", "off")
    assert sha1_choice.sha1_kernel() is sha1.sha1_rows_lanes


def test_the_sha1_race_picks_the_kernel_that_runs_faster_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU may report the SHA extensions and run them slowly (a VM seen here: ~10 us a key against 0.14 us):
    the race between two real kernels, one of them held back per call, picks the other either way round."""
    from flash_pipeline.compactor.kernels import sha1, sha1_race

    monkeypatch.setattr(sha1_race, "_races", {})

    def slowed(buf: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
        time.sleep(0.002)
        sha1.sha1_rows_lanes(buf, offsets, out)

    assert sha1_race.faster(sha1.sha1_rows_lanes, slowed) is True
    assert sha1_race.faster(slowed, sha1.sha1_rows_lanes) is False


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_flash_sha_extensions_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path: Path, value: str) -> None:
    from compaction_helpers import assert_compact_command_refused

    assert_compact_command_refused(tmp_path, {"FLASH_SHA_EXTENSIONS": value}, "FLASH_SHA_EXTENSIONS")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.integers(-2**63, 2**63 - 1))), min_size=1, max_size=30)
)
def test_framing_kernels_match_numpy_and_keys_are_unambiguous(rows: list) -> None:
    """The compiled kernel copies a value of up to 16 bytes as 16 (sha1.frame_rows): values shorter and longer
    than that, with nulls between them, must frame as NumPy does."""
    table = pa.table({"s": [r[0] for r in rows], "i": pa.array([r[1] for r in rows], pa.int64()),
                      "t": [None if r[0] is None else r[0] * 3 for r in rows]})
    with kernel_form("compiled"):
        buf, offsets = digest.primary_key_bytes(table, ["t", "i", "s"])
    with kernel_form("interpreted"):  # the NumPy path
        buf2, offsets2 = digest.primary_key_bytes(table, ["t", "i", "s"])
    assert (offsets == offsets2).all() and (buf == buf2).all()
    frames = {buf[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])}
    assert len(frames) == len(set(rows)), "different keys must frame differently, equal keys equally"


def test_null_empty_and_the_string_null_are_three_keys() -> None:
    table = pa.table({"s": [None, "", "null"], "t": ["ab", "ab", "ab"]})
    d = digest.primary_key_digests(table, ["s", "t"])
    assert len({bytes(r) for r in d}) == 3
    joined = digest.primary_key_digests(pa.table({"a": ["ab", "a"], "b": ["c", "bc"]}), ["a", "b"])
    assert bytes(joined[0]) != bytes(joined[1])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(min_size=20, max_size=20), min_size=1, max_size=50),
       st.one_of(st.integers(1, 2**31 - 1), st.sampled_from([1, 2, 4, 8, 64, 1 << 20, 1 << 30])))  # powers of two: a fast path
def test_hash_buckets_equal_int_from_bytes_modulo(digests: list[bytes], n: int) -> None:
    arr = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 20)
    for form in ("compiled", "interpreted"):  # Numba's kernel, NumPy's Horner rule
        with kernel_form(form):
            assert digest.hash_buckets(arr, n).tolist() == [int.from_bytes(x, "big") % n for x in digests], form


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.floats(allow_nan=True, width=64)), min_size=2, max_size=30),
    st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=2, max_size=30),
    st.sampled_from(["ascending", "descending"]),
)
def test_sort_key_bytes_order_like_the_values(floats: list, ints: list, direction: str) -> None:
    """memcmp order of the bytes == value order (nulls lowest in both directions; -0.0 == 0.0; NaN above all)."""
    for values, typ in ((floats, pa.float64()), (ints, pa.int64())):
        b = digest.sort_key_bytes(pa.table({"x": pa.array(values, typ)}), [("x", direction)])
        encoded = [bytes(r) for r in b]

        def rank(v: object) -> tuple:  # the reference order
            if v is None:
                return (0,)
            if isinstance(v, float) and math.isnan(v):
                return (1, 1, 0.0) if direction == "ascending" else (1, 0, 0.0)
            v = v + 0.0 if isinstance(v, float) else v  # -0.0 -> 0.0
            return (1, 0, v) if direction == "ascending" else (1, 1, -v)

        for i in range(len(values)):
            for j in range(len(values)):
                ri, rj = rank(values[i]), rank(values[j])
                assert (encoded[i] < encoded[j]) == (ri < rj), (values[i], values[j], direction)
                assert (encoded[i] == encoded[j]) == (ri == rj), (values[i], values[j], direction)


# ----- every scalar key type: framed by value, unambiguous, the same however a file returned it ---------------
D = decimal.Decimal
I64 = st.integers(-2**62, 2**62)
# type -> strategy of values that ``pa.array(values, type)`` takes; equal drawn values are equal keys
KEY_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy]] = {
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "decimal128": (pa.decimal128(12, 2), st.decimals(-10**9, 10**9, places=2, allow_nan=False, allow_infinity=False)),
    "decimal256": (pa.decimal256(60, 3), st.decimals(-10**50, 10**50, places=3, allow_nan=False, allow_infinity=False)),
    "date32": (pa.date32(), st.integers(-10**6, 10**6)),
    "date64": (pa.date64(), st.integers(-10**6, 10**6).map(lambda d: d * 86_400_000)),
    "time32[s]": (pa.time32("s"), st.integers(0, 86_399)),
    "time32[ms]": (pa.time32("ms"), st.integers(0, 86_399_999)),
    "time64[us]": (pa.time64("us"), st.integers(0, 86_399_999_999)),
    "time64[ns]": (pa.time64("ns"), st.integers(0, 86_399_999_999_999)),
    "timestamp[s]": (pa.timestamp("s"), st.integers(-2**40, 2**40)),
    "timestamp[ms]": (pa.timestamp("ms"), I64),
    "timestamp[us, tz]": (pa.timestamp("us", tz="America/Los_Angeles"), I64),
    "timestamp[ns, UTC]": (pa.timestamp("ns", tz="UTC"), I64),
    "duration[s]": (pa.duration("s"), I64),
    "duration[ns]": (pa.duration("ns"), I64),
    "fixed_size_binary": (pa.binary(3), st.binary(min_size=3, max_size=3)),
    "large_string": (pa.large_string(), st.text(max_size=6)),
    "large_binary": (pa.large_binary(), st.binary(max_size=6)),
    "string_view": (pa.string_view(), st.text(max_size=6)),
    "float32": (pa.float32(), st.sampled_from([0.0, -0.0, 1.5, -1.5, float("nan"), float("inf"), float("-inf")])),
    "float64": (pa.float64(), st.floats(allow_nan=True).map(lambda f: f if f == f else float("nan"))),
    "bool": (pa.bool_(), st.booleans()),
}


def _value_class(v: object) -> object:
    """The equality class of a drawn key value: -0.0 is 0.0 and every NaN is one NaN (as in SQL engines)."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else v + 0.0
    return v


def _frames(table: pa.Table, keys: list[str]) -> list[bytes]:
    buf, offsets = digest.primary_key_bytes(table, keys)
    return [buf[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])]


@settings(max_examples=25, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(KEY_TYPES)))
def test_every_scalar_key_type_frames_by_value_and_unambiguously(data: st.DataObject, name: str) -> None:
    """Two rows frame alike iff their keys are equal: alone, beside a string key ("ab"+"c" vs "a"+"bc"), with
    nulls distinct from every value; the compiled and the NumPy framing agree; dictionaries frame like values."""
    typ, values = KEY_TYPES[name]
    vals = data.draw(st.lists(st.one_of(st.none(), values), min_size=1, max_size=25), label="values")
    others = data.draw(st.lists(st.sampled_from([None, "", "null", "a", "ab", "bc", "c"]), min_size=len(vals), max_size=len(vals)), label="strings")
    table = pa.table({"k": pa.array(vals, typ), "s": pa.array(others, pa.string())})
    for keys, classes in ((["k"], [(_value_class(v),) for v in vals]), (["k", "s"], [(_value_class(v), o) for v, o in zip(vals, others)])):
        with kernel_form("compiled"):
            frames = _frames(table, keys)
        for i in range(len(vals)):
            for j in range(len(vals)):
                assert (frames[i] == frames[j]) == (classes[i] == classes[j]), (name, keys, vals[i], vals[j])
        with kernel_form("interpreted"):
            assert _frames(table, keys) == frames, "NumPy framing differs from the compiled kernels"
        for form in ("compiled", "interpreted"):
            with kernel_form(form):
                got = digest.primary_key_digests(table, keys)
            assert [bytes(r) for r in got] == [hashlib.sha1(f).digest() for f in frames], form
    if not pa.types.is_floating(typ) and not pa.types.is_string_view(typ):
        encoded = pa.table({"k": pa.array(vals, typ).dictionary_encode()})
        assert _frames(encoded, ["k"]) == _frames(table.select(["k"]), ["k"])


ROUND_TRIP_VALUES: dict[str, list] = {
    "uint64": [0, 2**63 - 1, 2**63, 2**64 - 1, None],
    "decimal128": [D("0.00"), D("-1.50"), D("99999.99"), None],
    "decimal256": [D("0.000"), D("-1." + "9" * 3), D("1" + "0" * 50 + ".125"), None],
    "date32": [0, -719_162, 2_932_896, None],
    "date64": [0, -719_162 * 86_400_000, 20_000 * 86_400_000, None],
    "time32[s]": [0, 1, 86_399, None],
    "time32[ms]": [0, 1, 86_399_999, None],
    "time64[us]": [0, 1, 86_399_999_999, None],
    "time64[ns]": [0, 1, 86_399_999_999_999, None],
    "timestamp[s]": [0, -1, 2**40, None],
    "timestamp[ms]": [0, -1, 2**50, None],
    "timestamp[us, tz]": [0, -1, 2**60, None],
    "timestamp[ns, UTC]": [0, -1, 2**62, None],
    "duration[s]": [0, -1, 2**40, None],
    "duration[ns]": [0, -1, 2**62, None],
    "fixed_size_binary": [b"abc", b"\x00\x00\x00", None],
    "large_string": ["", "null", "ab", None],
    "large_binary": [b"", b"\x00", b"\x80\xff", None],  # not UTF-8: once refused
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP_VALUES))
def test_a_key_digests_the_same_however_its_file_returns_it(name: str) -> None:
    """Parquet returns date64 as date32, time32[s] and timestamp[s] in ms; ORC returns large strings as strings
    and fixed-size binaries as binaries; files are read back with those types (and a reader may cast to the
    declared one). Every form of the same key must give the same digest, or a key would survive twice."""
    typ = KEY_TYPES[name][0]
    table = pa.table({"k": pa.array(ROUND_TRIP_VALUES[name], typ)})
    expected = [bytes(r) for r in digest.primary_key_digests(table, ["k"])]
    assert len(set(expected)) == table.num_rows
    with tempfile.TemporaryDirectory() as d:
        for ct in (ContentType.PARQUET, ContentType.FEATHER, ContentType.ORC):
            path = Path(d) / f"f{ct.extension}"
            try:
                with pa.OSFile(str(path), "wb") as sink:
                    write_table(table, sink, ct)
                back = read_table(str(path), ct)
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, FlashError):
                assert ct is ContentType.ORC
                continue  # ORC cannot hold these values: no file of them can come back from it
            bt = back.column("k").type
            if ct is ContentType.ORC and bt != typ and not (pa.types.is_string(bt) or pa.types.is_binary(bt)):
                if not pa.types.is_timestamp(bt):
                    continue  # ORC stored another type (time32 as int32): such a file declares that type instead
                back = back.cast(table.schema)  # ORC returns every timestamp as ns: readers cast to the declared type
            got = [bytes(r) for r in digest.primary_key_digests(back, ["k"])]
            assert got == expected, (ct, back.column("k").type)
            assert [bytes(r) for r in digest.primary_key_digests(back.cast(table.schema), ["k"])] == expected


@pytest.mark.parametrize(
    "typ",
    [pa.struct([("a", pa.int64())]), pa.list_(pa.int64()), pa.large_list(pa.string()), pa.map_(pa.string(), pa.int64()),
     pa.month_day_nano_interval(), pa.dictionary(pa.int32(), pa.list_(pa.int8()))],
    ids=str,
)
def test_nested_and_interval_keys_are_refused_naming_the_column(typ: pa.DataType) -> None:
    schema = pa.schema([("id", pa.int64()), ("my key", typ)])
    with pytest.raises(FlashError, match=r"primary key column 'my key' of the delta at position 3 has type .*cannot be a primary key"):
        digest.require_key_types(schema, ["id", "my key"], "the delta at position 3")
    digest.require_key_types(schema, ["id", "absent"], "x")  # other columns, and missing ones, are the caller's
    for name, (t, _) in KEY_TYPES.items():
        digest.require_key_types(pa.schema([("k", t)]), ["k"], name)
    table = pa.table({"my key": pa.nulls(2, typ)})
    with pytest.raises(FlashError, match="'my key'"):
        digest.primary_key_digests(table, ["my key"])


COMPACTED_KEY_TYPES = [
    "uint64", "decimal128", "decimal256", "date32", "date64", "time32[s]", "time64[ns]", "timestamp[s]",
    "timestamp[us, tz]", "duration[s]", "fixed_size_binary", "large_string", "large_binary",
]


def _storage_values(column: pa.ChunkedArray | pa.Array, typ: pa.DataType) -> list:
    """Values of ``column`` in ``typ``'s storage form (temporal as integers: no datetime range limits)."""
    arr = column.cast(typ)
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_temporal(typ):
        arr = arr.view(pa.int32() if typ.bit_width == 32 else pa.int64())
    return arr.to_pylist()


def test_compaction_with_every_scalar_key_type_matches_the_reference_model(tmp_path: Path) -> None:
    """Each type as half of a composite key (with a string column), deltas as in-memory tables (stored as
    Parquet) and as Feather files, deletes, an incremental second compaction: the compacted rows equal a
    plain-Python model of the semantics (the latest upsert of a key wins, a later delete removes it)."""
    import random

    from compaction_helpers import read_compacted, run_compact
    from flash_pipeline import Catalog

    rng = random.Random(13)
    cat = Catalog(tmp_path / "lake")
    counter = iter(range(10**6))
    for name in COMPACTED_KEY_TYPES:
        typ, pool = KEY_TYPES[name][0], ROUND_TRIP_VALUES[name]
        table_id = f"KEYS.{name}"
        model: dict[tuple, int] = {}
        for i, op in enumerate(["upsert", "upsert", "delete", "upsert"]):
            files: list = []
            for f in range(2):
                n = rng.randint(0, 6)
                ks, ss = [rng.choice(pool) for _ in range(n)], [rng.choice([None, "", "a"]) for _ in range(n)]
                cols = {"k": pa.array(ks, typ), "s": pa.array(ss, pa.string())}
                if op == "upsert":
                    vs = [next(counter) for _ in range(n)]
                    cols["v"] = pa.array(vs, pa.int64())
                    for key, v in zip(zip(ks, ss), vs):
                        model[key] = v
                else:
                    for key in zip(ks, ss):
                        model.pop(key, None)
                t = pa.table(cols)
                if f == 1:  # the same declared types from a Feather file (Parquet would coerce some of them)
                    path = tmp_path / f"{len(list(tmp_path.iterdir()))}.feather"
                    write_feather(t, path)
                    files.append(path)
                else:
                    files.append(t)
            cat.append(table_id, None, op, files)
            if i == 1:
                run_compact(cat, table_id, ["s", "k"], None, hash_bucket_count=3, rows_per_compacted_file=2, num_cpus=2)
        run_compact(cat, table_id, ["s", "k"], None, num_cpus=2)
        out = read_compacted(cat, table_id, None)
        got = sorted(zip(_storage_values(out.column("k"), typ), out.column("s").to_pylist(), out.column("v").to_pylist()), key=repr) if out is not None else []
        expected = sorted(((k, s, v) for (k, s), v in model.items()), key=repr)
        assert got == expected, name


def write_feather(table: pa.Table, path: Path) -> None:
    import pyarrow.feather as feather

    feather.write_feather(table, str(path))
