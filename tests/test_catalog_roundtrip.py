"""Round trip of deltas and files through the catalog, on a local directory and on S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.orc as paorc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog import encoding
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.errors import FlashError

WRITERS = {
    "parquet": lambda t, p: pq.write_table(t, p),
    "feather": lambda t, p: feather.write_feather(t, p),
    "orc": lambda t, p: paorc.write_table(t, p),
    "csv": lambda t, p: pacsv.write_csv(t, p),
}


def sample(n: int, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "Order ID": pa.array([offset + i for i in range(n)], pa.int64()),
            "Order Status": pa.array([f"status {i % 3} ü" for i in range(n)], pa.string()),
            "Last Updated": pa.array([1_000_000 + 7 * i for i in range(n)], pa.int64()),
        }
    )


def write(tmp: Path, name: str, table: pa.Table, fmt: str) -> Path:
    path = tmp / f"{name}.{fmt}"
    WRITERS[fmt](table, str(path))
    return path


@pytest.mark.parametrize("fmt", ["parquet", "feather", "orc", "csv"])
def test_round_trip_each_format(any_lake: Catalog, tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    t1, t2, t3 = sample(5), sample(3, 100), sample(4, 200)
    f1, f2 = write(src, "a", t1, fmt), write(src, "b", t2, fmt)
    d1 = any_lake.append("ACME.ORDERS.V1", {"Order Day": "1995-04-03"}, "upsert", [f1, f2])
    f3 = write(src, "c", t3, fmt)
    d2 = any_lake.append("ACME.ORDERS.V1", [("Order Day", "1995-04-03")], "upsert", [f3])
    # the lake holds copies: the sources may go away
    for f in (f1, f2, f3):
        f.unlink()

    assert (d1.position, d2.position) == (1, 2)
    deltas = any_lake.deltas("ACME.ORDERS.V1", (("Order Day", "1995-04-03"),))
    assert [d.position for d in deltas] == [1, 2]
    assert [d.commit_id for d in deltas] == [d1.commit_id, d2.commit_id]
    expected = [[t1, t2], [t3]]
    for delta, tables in zip(deltas, expected):
        assert delta.operation == "upsert"
        assert [f.file_number for f in delta.files] == list(range(1, len(tables) + 1))
        assert delta.rows == sum(t.num_rows for t in tables)
        for data_file, table in zip(delta.files, tables):
            assert data_file.content_type == ContentType(fmt)
            assert data_file.rows == table.num_rows
            assert data_file.bytes == any_lake.storage.size(data_file.key) > 0
            assert any_lake.read_file(data_file).equals(table)
            assert any_lake.read_file(data_file, ["Order ID"]).column("Order ID").equals(table.column("Order ID"))
        assert delta.pa_schema().equals(t1.schema)
        assert [c["name"] for c in delta.schema] == ["Order ID", "Order Status", "Last Updated"]
    # the manifest on storage is plain JSON with the documented fields
    manifest_keys = [k for k in any_lake.listing() if "/deltas/" in k]
    assert len(manifest_keys) == 2
    doc = json.loads(any_lake.storage.read(manifest_keys[0]))
    assert doc["position"] == 1 and doc["operation"] == "upsert" and len(doc["files"]) == 2
    assert manifest_keys[0].endswith("/deltas/" + "1".zfill(20) + ".json")
    assert any_lake.tables() == ["ACME.ORDERS.V1"]


def test_in_memory_tables_and_mixed_formats(any_lake: Catalog, tmp_path: Path) -> None:
    t = sample(3)
    csv = write(tmp_path, "x", sample(2, 10), "csv")
    delta = any_lake.append("T", None, "upsert", [t, csv])
    assert [f.content_type for f in delta.files] == [ContentType.PARQUET, ContentType.CSV]
    assert any_lake.read_file(delta.files[0]).equals(t)
    assert any_lake.read_file(delta.files[1]).equals(sample(2, 10))
    assert any_lake.partitions("T") == [()]
    d = any_lake.append("T", (), "delete", [t.select(["Order ID"])])
    assert (d.position, d.operation) == (2, "delete")
    assert [x.operation for x in any_lake.deltas("T", ())] == ["upsert", "delete"]


def test_parquet_file_readable_by_duckdb(lake: Catalog, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    t = sample(6)
    delta = lake.append("ACME.ORDERS.V1", {"d": "1"}, "upsert", [write(tmp_path, "a", t, "parquet")])
    path = Path(lake.storage.uri) / delta.files[0].key
    rows = duckdb.sql(f"select \"Order ID\", \"Last Updated\" from read_parquet('{path}') order by 1").fetchall()
    assert rows == list(zip(t.column("Order ID").to_pylist(), t.column("Last Updated").to_pylist()))


NASTY_VALUES = [
    "/", "..", ".", "=", "a=b", "a/b", "../../etc", "/abs", " ", "with spaces", "ünïcødé ✓", "日本", "",
    None, "null", "n", "v", "%2F", "%", "a&b=c", "~", "p", "h" + "0" * 64, "x" * 400, "x" * 401, "\\", "\n",
]


def test_nasty_partition_values_stay_inside_and_distinct(any_lake: Catalog, tmp_path: Path) -> None:
    table = "ACME/../../T.V1"
    for i, value in enumerate(NASTY_VALUES):
        any_lake.append(table, [("Order Day", value), ("a=b/c", "k")], "upsert", [pa.table({"i": [i]})])
    parts = any_lake.partitions(table)
    assert len(parts) == len(NASTY_VALUES)
    assert sorted(map(repr, parts)) == sorted(repr((("Order Day", v), ("a=b/c", "k"))) for v in NASTY_VALUES)
    for i, value in enumerate(NASTY_VALUES):
        part = (("Order Day", value), ("a=b/c", "k"))
        deltas = any_lake.deltas(table, part)
        assert [d.position for d in deltas] == [1], value
        assert any_lake.read_file(deltas[0].files[0]).column("i").to_pylist() == [i]
    keys = any_lake.listing()
    assert all(k.startswith("tables/") for k in keys)
    for key in keys:
        assert all(c not in ("", ".", "..") for c in key.split("/")), key
    assert any_lake.tables() == [table]
    if any_lake.storage.uri.startswith("s3://"):
        return
    # nothing was written outside the lake root
    root = Path(any_lake.storage.uri)
    outside = [p for p in tmp_path.rglob("*") if root not in p.parents and p != root]
    assert outside == []


def test_table_ids_are_data(any_lake: Catalog) -> None:
    ids = ["A.B.V1", "a.b.v1", "..", "../x", "x/y", "x y", "ü", "null", "vA"]
    for i, tid in enumerate(ids):
        any_lake.append(tid, None, "upsert", [pa.table({"i": [i]})])
    assert any_lake.tables() == sorted(ids)
    for i, tid in enumerate(ids):
        (delta,) = any_lake.deltas(tid, ())
        assert any_lake.read_file(delta.files[0]).column("i").to_pylist() == [i]
    with pytest.raises(FlashError):
        any_lake.append("", None, "upsert", [pa.table({"i": [1]})])


def test_stream_versions_and_lifecycle(any_lake: Catalog) -> None:
    part = (("d", "1"),)
    any_lake.append("T", part, "upsert", [pa.table({"i": [1]})])
    v2 = any_lake.new_stream_version("T", part)
    assert v2.version == 2
    assert [(s.version, s.state) for s in any_lake.streams("T", part)] == [(1, "deprecated"), (2, "active")]
    d = any_lake.append("T", part, "upsert", [pa.table({"i": [2]})])
    assert (d.stream_version, d.position) == (2, 1)
    assert [x.position for x in any_lake.deltas("T", part, stream_version=1)] == [1]
    assert any_lake.deltas("T", part, after_position=1) == []
    with pytest.raises(FlashError):
        any_lake.set_stream_state(v2, "bogus")


partition_values = st.one_of(st.none(), st.text(max_size=30))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), partition_values), max_size=3, unique_by=lambda p: p[0]),
       st.lists(st.tuples(st.text(min_size=1, max_size=8), partition_values), max_size=3, unique_by=lambda p: p[0]))
def test_partition_encoding_is_injective_and_path_safe(a: list, b: list) -> None:
    pa_, pb = encoding.normalize_partition(a), encoding.normalize_partition(b)
    ca, cb = encoding.partition_component(pa_), encoding.partition_component(pb)
    for c in (ca, cb):
        assert "/" not in c and "\\" not in c and c not in ("", ".", "..") and "\x00" not in c
    assert (ca == cb) == (pa_ == pb)


@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1), st.text(min_size=1))
def test_table_encoding_is_injective_and_path_safe(a: str, b: str) -> None:
    ca, cb = encoding.table_component(a), encoding.table_component(b)
    assert "/" not in ca and ca not in (".", "..")
    assert (ca == cb) == (a == b)


def test_many_deltas_listed_in_position_order(any_lake: Catalog) -> None:
    """``deltas`` reads many manifests (concurrently on S3): each comes back once, in position order, with its
    own operation, rows and schema, skipped ones and those at or before ``after_position`` left out; a damaged
    manifest among them is one error naming its key."""
    part = (("d", "x"),)
    model = []
    for i in range(1, 31):
        op = "delete" if i % 7 == 0 else "upsert"
        cols = {"i": pa.array(list(range(i)), pa.int64())}
        if op == "upsert":
            cols["v"] = pa.array([float(i)] * i)  # deletes carry the key only: two schemas, interleaved
        any_lake.append("T", part, op, [pa.table(cols)])
        model.append((i, op, i, sorted(cols)))
    for skipped in (4, 15):
        any_lake.skip_delta("T", part, skipped)
    got = [(d.position, d.operation, d.rows, sorted(d.pa_schema().names)) for d in any_lake.deltas("T", part)]
    assert got == [m for m in model if m[0] not in (4, 15)]
    assert [d.position for d in any_lake.deltas("T", part, after_position=20)] == list(range(21, 31))
    stream = any_lake.active_stream("T", part)
    assert stream is not None
    prefix = f"{any_lake.stream_prefix('T', part, stream.version)}/deltas"
    (name,) = [n for n in any_lake.storage.list_children(prefix) if n.endswith(".json") and int(n[:-5]) == 23]
    key = f"{prefix}/{name}"
    any_lake.storage.write(key, b"{not json")
    with pytest.raises(FlashError, match=name):
        any_lake.deltas("T", part)


def test_ranged_reads_into_a_reused_buffer(any_lake: Catalog) -> None:
    """``read_range_into`` (the index readers' chunked read) gives the bytes ``read_range`` gives, fewer at the end
    of the object, into a buffer used again for every read; a missing object is NotFound."""
    from flash_pipeline.errors import NotFound

    data = bytes(range(256)) * 41 + b"tail"
    any_lake.storage.write("x/blob.bin", data)
    buffer = bytearray(b"\xff" * 1000)
    for offset, length in [(0, 1000), (5, 17), (10_400, 1000), (len(data) - 3, 50), (len(data), 10)]:
        view = memoryview(buffer)[:length]
        n = any_lake.storage.read_range_into("x/blob.bin", offset, view)
        assert bytes(view[:n]) == data[offset : offset + length] == any_lake.storage.read_range("x/blob.bin", offset, length)
    with pytest.raises(NotFound, match="missing.bin"):
        any_lake.storage.read_range_into("x/missing.bin", 0, memoryview(buffer))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 25_000), cardinalities=st.lists(st.integers(1, 30_000), min_size=1, max_size=4),
       repeat_from=st.integers(0, 25_000), seed=st.integers(0, 2**32 - 1))
def test_dictionary_columns_follow_the_sampled_distinct_ratio(rows: int, cardinalities: list[int], repeat_from: int, seed: int) -> None:
    """A column is dictionary encoded when at most half the values of the first 20,000 rows are distinct, unless
    more than half of its first 2,000 are (the cheap probe); checked against counts of Python sets, on columns
    whose values start repeating part-way (where the probe and the sample can disagree)."""
    import numpy as np

    from flash_pipeline.catalog.files import (
        DICTIONARY_MAX_DISTINCT_RATIO, DICTIONARY_PROBE_ROWS, DICTIONARY_SAMPLE_ROWS, dictionary_columns,
    )

    rng = np.random.default_rng(seed)
    columns = {}
    for i, card in enumerate(cardinalities):
        values = rng.integers(0, card, rows)
        values[repeat_from:] = values[repeat_from:] % 7  # from here on, few distinct values
        columns[f"c{i}"] = pa.array(values.astype(str) if i % 2 else values, mask=rng.random(rows) < 0.05)
    table = pa.table(columns)

    def few(values: list) -> bool:
        return len(set(values)) <= DICTIONARY_MAX_DISTINCT_RATIO * len(values)

    want = []
    for name in table.column_names:
        values = table.column(name).to_pylist()
        sample, probe = values[:DICTIONARY_SAMPLE_ROWS], values[:DICTIONARY_PROBE_ROWS]
        if rows == 0 or ((len(sample) <= DICTIONARY_PROBE_ROWS or few(probe)) and few(sample)):
            want.append(name)
    assert dictionary_columns(table) == want


@pytest.mark.parametrize("executor", ["in-process", "ray"])
def test_list_and_map_columns_from_parquet_feather_and_memory_share_a_stream(tmp_path: Path, executor: str) -> None:
    """Parquet names a list's child ``element``, Arrow and Feather ``item``: the same type (PyArrow's == agrees).
    Appends of the same columns from each source must share a stream (the Parquet one was refused as a schema
    change) and compact to the latest row per key; a list of another value type is still refused in one line."""
    import deltalake

    from flash_pipeline import compact

    cat = Catalog(tmp_path / "lake")
    mtype = pa.map_(pa.string(), pa.int64())
    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string())), ("m", mtype), ("s", pa.struct([("l", pa.list_(pa.int32()))]))])
    latest: dict[int, dict] = {}
    for step, writer in enumerate(["feather", "parquet", "memory", "parquet"]):
        rows = [{"id": i, "tags": [f"t{step}", None] if i % 2 else None, "m": [(f"k{i}", step)], "s": {"l": [step, i]}}
                for i in range(step, step + 4)]
        table = pa.Table.from_pylist(rows, schema=schema)
        path = tmp_path / f"d{step}.{'feather' if writer == 'feather' else 'parquet'}"
        if writer == "feather":
            feather.write_feather(table, path)
        elif writer == "parquet":
            pq.write_table(table, path)
        cat.append("L.T", {"p": "1"}, "upsert", [table if writer == "memory" else str(path)])
        latest.update({r["id"]: r for r in rows})
    listing = cat.listing()
    other = pa.table({"id": [9], "tags": pa.array([[1]], pa.list_(pa.int64())), "m": pa.array([[]], mtype), "s": pa.array([{"l": []}], schema.field("s").type)})
    with pytest.raises(FlashError, match="column 'tags'") as refused:
        cat.append("L.T", {"p": "1"}, "upsert", [other])
    assert "\n" not in str(refused.value) and cat.listing() == listing
    compact("L.T", ["id"], catalog=cat, executor=executor, progress=lambda _: None)
    want = [latest[k] for k in sorted(latest)]
    got = pa.concat_tables([pq.read_table(p) for p in cat.export("L.T", tmp_path / "out")]).sort_by("id").to_pylist()
    assert got == want
    location = cat.deltalake_location("L.T", (("p", "1"),))
    assert deltalake.DeltaTable(location).to_pyarrow_table().sort_by("id").to_pylist() == want


def test_a_partition_given_as_one_name_value_string_is_that_partition() -> None:
    """An SQS instruction's "partitions": ["day=d1"] reached normalize_partition as a bare string, walked character
    by character ("invalid --partition 'd'"); one NAME=VALUE string is now that one-key partition."""
    from flash_pipeline.catalog.encoding import normalize_partition
    from flash_pipeline.errors import FlashError

    assert normalize_partition("day=d1") == normalize_partition({"day": "d1"}) == normalize_partition(["day=d1"]) == (("day", "d1"),)
    assert normalize_partition("a=b=c") == (("a", "b=c"),)
    with pytest.raises(FlashError, match="invalid --partition 'day'"):
        normalize_partition("day")
