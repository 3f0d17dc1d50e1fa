"""Column statistics in the Iceberg manifests (iceberg_stats.py): every data file's counts and bounds hold for the
file's actual rows, bounds are the bytes pyiceberg's own serializer gives for the file's min and max, and filtered
scans (which prune files by those bounds) return every matching row. Checked on random histories over every
bounded type, with nulls, long and non-ASCII strings, deletion vectors and carried files."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import lake_readers
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog import avro_files
from flash_pipeline.catalog import iceberg_metadata as im
from flash_pipeline.catalog.iceberg_stats import TRUNCATE

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2)),
                    ("day", pa.date32()), ("at", pa.timestamp("us")), ("flag", pa.bool_()), ("small", pa.int16()),
                    ("score", pa.float64())])
EXACT = {"id", "v", "amount", "day", "at", "flag", "small"}  # bounds equal the file's min and max


def _quiet(_: str) -> None:
    pass


def _row(rng: random.Random, key: int, step: int) -> dict[str, Any]:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    word = rng.choice(["a", "zz", "name-" * rng.randint(1, 6), "é" * rng.randint(1, 20), "\U0010ffff" * 17, "ß-" * 9])
    return {"id": key, "v": step * 1000 + rng.randint(-500, 500), "name": maybe(word),
            "amount": maybe(Decimal(rng.randint(-10**6, 10**6)) / 100),
            "day": maybe(datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randint(0, 3000))),
            "at": maybe(datetime.datetime(2026, 1, 1) + datetime.timedelta(microseconds=rng.randint(-10**12, 10**12))),
            "flag": maybe(rng.random() < 0.5), "small": maybe(rng.randint(-300, 300)), "score": maybe(rng.random())}


def _history(seed: int, lake: Path) -> Catalog:
    rng = random.Random(seed)
    cat = Catalog(lake)
    keys = rng.randint(30, 90)
    for step in range(rng.randint(2, 4)):
        op = "delete" if step and rng.random() < 0.3 else "upsert"
        chosen = range(1, keys + 1) if step == 0 else rng.sample(range(1, keys + 1), rng.randint(1, keys // 3))
        rows = [_row(rng, k, step) for k in chosen]
        cat.append("S", {"p": "x"}, op, [pa.Table.from_pylist(rows, schema=SCHEMA)])
        options = CompactOptions(primary_keys=("id",), sort_keys=(("v", "ascending"),),
                                 destination_compacted_table_id="C", rows_per_compacted_file=rng.choice([7, 20, 1000]),
                                 deletion_vectors=rng.random() < 0.6)
        compact("S", options, catalog=cat, progress=_quiet)
    return cat


def _check_file_statistics(table: Any, snapshot_id: int) -> int:
    """Every data file of the snapshot: value and null counts equal the file's, bounds hold its min and max
    (exactly, serialized as pyiceberg serializes them, for the exact types). Returns the files checked."""
    from pyiceberg.conversions import from_bytes, to_bytes

    schema = table.schema()
    checked = 0
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        f = task.file
        data = pq.read_table(f.file_path)
        for field in schema.fields:
            if field.name not in data.column_names:
                continue
            column = data.column(field.name)
            fid = field.field_id
            assert f.value_counts[fid] == data.num_rows, (field.name, f.file_path)
            assert f.null_value_counts[fid] == column.null_count, (field.name, f.file_path)
            assert f.column_sizes[fid] > 0
            values = column.drop_null()
            if field.name == "score" or len(values) == 0:
                assert fid not in f.lower_bounds and fid not in f.upper_bounds, field.name
                continue
            lowest, highest = pc.min(values).as_py(), pc.max(values).as_py()
            lower = from_bytes(field.field_type, f.lower_bounds[fid])
            upper = from_bytes(field.field_type, f.upper_bounds[fid]) if fid in f.upper_bounds else None
            if field.name in EXACT:
                assert f.lower_bounds[fid] == to_bytes(field.field_type, _iceberg_value(lowest)), field.name
                assert f.upper_bounds[fid] == to_bytes(field.field_type, _iceberg_value(highest)), field.name
            else:  # strings: a prefix of at most TRUNCATE characters below, an incremented prefix above
                assert lower == lowest[:TRUNCATE] and lower <= lowest, (lower, lowest)
                if fid in f.upper_bounds:
                    assert upper >= highest and len(upper) <= TRUNCATE, (upper, highest)
                else:  # only when no prefix of the value can be incremented
                    assert set(highest[:TRUNCATE]) == {"\U0010ffff"}, highest
        checked += 1
    return checked


def _iceberg_value(value: Any) -> Any:
    """pyiceberg's to_bytes takes dates as days and timestamps as microseconds."""
    if isinstance(value, datetime.datetime):
        return (value - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    if isinstance(value, datetime.date):
        return (value - datetime.date(1970, 1, 1)).days
    return value


@pytest.mark.parametrize("seed", range(4))
def test_every_file_of_every_snapshot_has_statistics_that_hold_and_filtered_scans_lose_no_row(
        tmp_path: Path, seed: int) -> None:
    lake = tmp_path / "lake"
    cat = _history(seed, lake)
    keys = (("p", "x"),)
    table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("C", keys))
    rng = random.Random(seed)
    files = scans = 0
    for v in cat.compacted_versions("C", keys):
        files += _check_file_statistics(table, v)
        exported = cat.export("C", tmp_path / f"export-{v}", {"p": "x"}, version=v)
        expected = pa.concat_tables([pq.read_table(p) for p in exported]) if exported else None
        if expected is not None and expected.num_rows:
            scans += lake_readers.filtered_reads_match(table, v, expected, rng)
    assert files >= 2 and scans >= 10, (files, scans)


def test_the_avro_reader_reads_back_manifests_with_statistics(tmp_path: Path) -> None:
    """read_container is the inverse of container on random manifest entries with every statistics map (negative
    and large numbers, empty and non-ASCII bytes), and pyiceberg's reader agrees on the bounds."""
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import (
        DataFile,
        ManifestEntry,
        data_file_with_partition,
        manifest_entry_schema_with_data_file,
    )

    rng = random.Random(3)

    def pairs(kind: str) -> list[dict[str, Any]]:
        ids = sorted(rng.sample(range(1, 40), rng.randint(0, 5)))
        if kind == "bytes":
            return [{"key": i, "value": bytes(rng.randrange(256) for _ in range(rng.randint(0, 20)))} for i in ids]
        return [{"key": i, "value": rng.randint(0, 1 << 50)} for i in ids]

    entries = []
    for i in range(40):
        stats = {"column_sizes": pairs("long"), "value_counts": pairs("long"), "null_value_counts": pairs("long"),
                 "lower_bounds": pairs("bytes"), "upper_bounds": pairs("bytes")}
        entries.append(im.file_entry(f"/d/{i}-{'é' * rng.randint(0, 3)}.parquet", rng.randint(0, 1 << 40),
                                     rng.randint(1, 1 << 33), rng.random() < 0.5, rng.randint(1, 9), rng.randint(1, 9),
                                     stats=stats if rng.random() < 0.8 else None))
    schema = {"type": "struct", "schema-id": 0, "fields": []}
    data = im.manifest(entries, schema, "data")
    meta, back = avro_files.read_container(data)
    assert meta["content"] == "data" and meta["format-version"] == "2"
    for written, read in zip(entries, back, strict=True):
        for name, value in written["data_file"].items():
            assert read["data_file"][name] == value, name
        for name in ("lower_bounds", "upper_bounds", "column_sizes"):
            if name not in written["data_file"]:
                assert read["data_file"][name] is None
    path = tmp_path / "m.avro"
    path.write_bytes(data)
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.schema import Schema

    read_schema = manifest_entry_schema_with_data_file(
        2, data_file_with_partition(UNPARTITIONED_PARTITION_SPEC.partition_type(Schema()), 2))
    with AvroFile[ManifestEntry](PyArrowFileIO().new_input(str(path)), read_schema,
                                 read_types={-1: ManifestEntry, 2: DataFile}) as f:
        theirs = list(f)
    for written, entry in zip(entries, theirs, strict=True):
        bounds = {p["key"]: p["value"] for p in written["data_file"].get("lower_bounds") or []}
        assert dict(entry.data_file.lower_bounds or {}) == bounds


def test_a_copied_lake_publishes_its_next_snapshot_with_statistics(tmp_path: Path) -> None:
    """A lake copied elsewhere: the previous snapshot's manifests are at the old location (Iceberg records absolute
    paths), so the copy's next snapshot reads its files' footers instead, and reads right through its catalog."""
    import shutil

    cat = _history(2, tmp_path / "lake")
    shutil.copytree(tmp_path / "lake", tmp_path / "copy")
    copy = Catalog(tmp_path / "copy")
    rng = random.Random(2)
    copy.append("S", {"p": "x"}, "upsert", [pa.Table.from_pylist([_row(rng, k, 9) for k in (1, 2, 3)], schema=SCHEMA)])
    compact("S", CompactOptions(destination_compacted_table_id="C"), catalog=copy, progress=_quiet)
    keys = (("p", "x"),)
    latest = copy.latest_compacted("C", keys)
    assert latest.version > cat.latest_compacted("C", keys).version
    table = lake_readers.pyiceberg_table(copy.iceberg_catalog_uri(), copy.iceberg_identifier("C", keys))
    assert table.current_snapshot().snapshot_id == latest.version
    assert _check_file_statistics(table, latest.version) == len(latest.files)
    exported = copy.export("C", tmp_path / "export", {"p": "x"})
    expected = pa.concat_tables([pq.read_table(p) for p in exported])
    assert lake_readers.filtered_reads_match(table, latest.version, expected, rng) >= 4


def test_a_column_dropped_and_added_again_narrower_keeps_its_fields_type_and_another_type_is_not_published(
        tmp_path: Path) -> None:
    """``evolve --drop a`` then an append with a narrower ``a``: Iceberg never narrows a field (and the name keeps
    its field id), so the snapshot keeps the field's wider type and readers read the narrower files promoted;
    every snapshot's bounds then decode under the current schema (filtered scans at every version, pyiceberg's
    time travel binding them to it). Added again as a string, the version stays unpublished with the reason."""
    from compaction_helpers import run_compact
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    from flash_pipeline.catalog.schema_edits import rename_and_drop

    cat = Catalog(tmp_path / "lake")
    part, keys = {"p": "x"}, (("p", "x"),)
    cat.append("T", part, "upsert", [pa.table({"k": pa.array([1, 2, 3], pa.int32()),
                                               "a": pa.array([-42, 7, 2**40], pa.int64())})])
    run_compact(cat, "T", ["k"], None, executor="in-process")
    rename_and_drop(cat, "T", drops=["a"])
    cat.append("T", part, "upsert", [pa.table({"k": pa.array([1, 4], pa.int32()), "a": pa.array([-5, 9], pa.int8())})])
    run_compact(cat, "T", ["k"], None, executor="in-process")
    versions = cat.compacted_versions("T", keys)
    assert len(versions) == 2 and all(cat.iceberg_blocker(cat.compacted_version("T", keys, v)) is None for v in versions)
    table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("T", keys))
    assert str(table.schema().find_field("a").field_type) == "long"
    assert [str(s.find_field("a").field_type) for s in table.schemas().values()] == ["long"], "no narrowed schema"
    rng = random.Random(0)
    for v in versions:
        exported = cat.export("T", tmp_path / f"export-{v}", part, version=v)
        expected = pa.concat_tables([pq.read_table(p) for p in exported])
        assert lake_readers.filtered_reads_match(table, v, expected, rng) == 4
        for got in (lake_readers.pyiceberg_rows(cat.iceberg_catalog_uri(), cat.iceberg_identifier("T", keys), v),
                    lake_readers.iceberg_scan(cat.iceberg_uri(cat.iceberg_metadata_key("T", keys, v)))):
            assert sorted(got.select(["k", "a"]).to_pylist(), key=repr) == sorted(expected.to_pylist(), key=repr)
        for task in table.scan(snapshot_id=v).plan_files():  # the bounds: the file's min and max, as long
            fid, values = table.schema().find_field("a").field_id, pq.read_table(task.file.file_path).column("a")
            assert (from_bytes(LongType(), task.file.lower_bounds[fid]), from_bytes(LongType(), task.file.upper_bounds[fid])
                    ) == (pc.min(values).as_py(), pc.max(values).as_py())

    rename_and_drop(cat, "T", drops=["a"])
    cat.append("T", part, "upsert", [pa.table({"k": pa.array([5], pa.int32()), "a": pa.array(["text"])})])
    run_compact(cat, "T", ["k"], None, executor="in-process")
    third = cat.compacted_version("T", keys, cat.compacted_versions("T", keys)[-1])
    reason = cat.iceberg_blocker(third)
    assert reason is not None and "'a' is string" in reason and "was long" in reason, reason
    table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("T", keys))
    assert table.current_snapshot().snapshot_id == versions[-1], "the Iceberg table stays at the last version it can read"
