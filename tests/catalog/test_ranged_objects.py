"""Large objects on S3 read by ranges (catalog/ranged_objects.py, S3Storage.arrow_source): any read gives the
object's bytes, a reader of a few columns fetches about those columns, a compaction on S3 over large deltas
writes what the same compaction writes on a local lake, and no large object is ever downloaded whole."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog import s3 as s3_module
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.catalog.ranged_objects import RangedObject

PART = {"p": "x"}


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 3000), tail=st.integers(0, 3000), reads=st.lists(
    st.tuples(st.integers(-50, 3100), st.integers(-1, 3100)), max_size=8))
def test_every_read_gives_the_objects_bytes_and_fetches_only_before_the_tail(
        size: int, tail: int, reads: list[tuple[int, int]]) -> None:
    data = bytes((i * 7) % 251 for i in range(size))
    tail = min(tail, size)
    fetched: list[tuple[int, int]] = []

    def read_range(offset: int, length: int) -> bytes:
        fetched.append((offset, length))
        return data[offset : offset + length]

    f = RangedObject(read_range, size, data[size - tail :])
    for position, length in reads:
        if position < 0:
            with pytest.raises(ValueError):
                f.seek(position)
            continue
        f.seek(position)
        assert f.read(length) == (data[position:] if length < 0 else data[position : position + length])
        assert f.tell() == (position if position >= size or length == 0 else min(size, position + length)
                            if length >= 0 else max(position, size))
    assert all(offset >= 0 and offset + length <= size - tail for offset, length in fetched)
    f.seek(0, io.SEEK_END)
    assert f.tell() == size and f.read() == b""


def _big(rows: int, version: int, start: int = 0) -> pa.Table:
    keys = pa.array(range(start, start + rows), pa.int64())
    return pa.table({"id": keys, "v": pa.array([version] * rows, pa.int64()),
                     "text": pa.array([f"{version}-{k}-" + "x" * 40 for k in range(start, start + rows)])})


def _write(tmp: Path, name: str, table: pa.Table) -> str:
    path = tmp / name
    pq.write_table(table, path, row_group_size=5000)
    return str(path)


def _spy(storage: object) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {"whole": [], "ranged": [], "tail": []}
    read, read_range, read_tail = storage.read, storage.read_range, storage.read_tail  # type: ignore[attr-defined]

    def spy_read(key: str) -> bytes:
        data = read(key)
        seen["whole"].append(len(data))
        return data

    def spy_range(key: str, offset: int, length: int) -> bytes:
        seen["ranged"].append(length)
        return read_range(key, offset, length)

    def spy_tail(key: str, length: int) -> tuple[bytes, int]:
        data, size = read_tail(key, length)
        seen["tail"].append(len(data))
        return data, size

    storage.read, storage.read_range, storage.read_tail = spy_read, spy_range, spy_tail  # type: ignore[attr-defined]
    return seen


def test_a_key_column_read_of_a_large_object_fetches_about_that_column(
        s3_lake: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(s3_module, "WHOLE_OBJECT_BYTES", 64 << 10)
    data = Path(_write(tmp_path, "big.parquet", _big(40_000, 0))).read_bytes()
    s3_lake.storage.write("big.parquet", data)
    seen = _spy(s3_lake.storage)
    keys = pq.read_table(s3_lake.storage.arrow_source("big.parquet"), columns=["id"])
    assert keys.equals(_big(40_000, 0).select(["id"]))
    fetched = sum(seen["ranged"]) + sum(seen["tail"])
    meta = pq.read_metadata(io.BytesIO(data))
    id_bytes = sum(meta.row_group(g).column(0).total_compressed_size for g in range(meta.num_row_groups))
    assert seen["whole"] == [] and fetched <= id_bytes + (64 << 10) and fetched < 0.6 * len(data)
    small = _spy(s3_lake.storage)
    s3_lake.storage.write("small.bin", b"0123456789")
    assert s3_lake.storage.arrow_source("small.bin").read() == b"0123456789" and small["ranged"] == []


def _compacted(cat: Catalog) -> pa.Table:
    version = cat.latest_compacted("C", normalize_partition(PART))
    assert version is not None
    return pa.concat_tables([cat.read_file(f) for f in version.files]).sort_by("id")


def test_a_compaction_on_s3_over_large_deltas_reads_them_by_ranges_and_writes_what_a_local_lake_writes(
        s3_lake: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_module, "WHOLE_OBJECT_BYTES", 64 << 10)
    files = [_write(tmp_path, "base.parquet", _big(30_000, 0)),
             _write(tmp_path, "update.parquet", _big(12_000, 1, start=25_000))]
    local = Catalog(tmp_path / "lake")
    options = CompactOptions(primary_keys=("id",), sort_keys=(("v", "ascending"),), destination_compacted_table_id="C",
                             rows_per_compacted_file=10_000, executor="in-process")
    for cat in (local, s3_lake):
        for path in files:
            cat.append("S", PART, "upsert", [path])
    compact("S", options, catalog=local, progress=lambda _: None)
    seen = _spy(s3_lake.storage)
    compact("S", options, catalog=s3_lake, progress=lambda _: None)
    assert _compacted(s3_lake).equals(_compacted(local))
    large = [n for n in seen["whole"] if n > (64 << 10)]
    assert large == [], f"objects of {large} bytes were downloaded whole"
    assert seen["ranged"] and seen["tail"], "the large deltas were read by ranges"


def test_a_whole_file_read_of_a_large_object_gets_a_row_groups_chunks_in_one_request(
        s3_lake: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tables.read_file (export, merge-on-read) reads a large S3 file's column chunks coalesced (PyArrow's
    ParquetFile pre-buffers by default): a GET for the row groups, not one a column chunk (12 here without)."""
    from flash_pipeline.catalog.files import ContentType, read_table

    monkeypatch.setattr(s3_module, "WHOLE_OBJECT_BYTES", 64 << 10)
    n = 200_000
    table = pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array([k * 7919 % 1000003 for k in range(n)]),
                      "text": pa.array([f"{k * 2654435761 % 10**12:012d}" * 3 for k in range(n)])})
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=50_000)
    data = path.read_bytes()
    s3_lake.storage.write("big.parquet", data)
    groups = pq.read_metadata(io.BytesIO(data)).num_row_groups
    seen = _spy(s3_lake.storage)
    assert read_table(s3_lake.storage.arrow_source("big.parquet"), ContentType.PARQUET).equals(table)
    assert len(seen["ranged"]) <= groups + 1 < 3 * groups  # the columns (three) would each be a GET otherwise
