"""Parquet footers read from the end of the object (catalog/parquet_footers.py): the metadata equals what PyArrow
reads from the whole file, whatever the footer's size against the first ranged read; on S3 the Iceberg statistics
of a compaction and the planning of a large delta read tails, never a whole file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog import parquet_footers
from flash_pipeline.catalog.parquet_footers import read_footer
from flash_pipeline.catalog.storage import Storage


def _parquet(columns: int, rows: int, row_group: int) -> bytes:
    table = pa.table({f"c{i}": pa.array([(j * 7 + i) % 1000 for j in range(rows)], pa.int64()) for i in range(columns)})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group)
    return sink.getvalue()


class _Spy:
    """Records which keys a storage reads whole and how many bytes it reads by range; the storage itself serves."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.whole: list[str] = []
        self.ranged: list[tuple[str, int]] = []
        read, read_range = storage.read, storage.read_range

        def spy_read(key: str) -> bytes:
            self.whole.append(key)
            return read(key)

        def spy_range(key: str, offset: int, length: int) -> bytes:
            self.ranged.append((key, length))
            return read_range(key, offset, length)

        storage.read = spy_read  # type: ignore[method-assign]
        storage.read_range = spy_range  # type: ignore[method-assign]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=st.integers(1, 12), rows=st.integers(0, 400), row_group=st.integers(1, 200),
       guess=st.sampled_from([16, 64, 300, 4096, 64 << 10]))
def test_the_footer_equals_the_whole_files_metadata_whatever_the_first_reads_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int, rows: int, row_group: int, guess: int) -> None:
    data = _parquet(columns, rows, row_group)
    catalog = Catalog(tmp_path / "lake")
    catalog.storage.write("f.parquet", data)
    monkeypatch.setattr(parquet_footers, "FOOTER_GUESS", guess)
    spy = _Spy(catalog.storage)
    meta = read_footer(catalog.storage, "f.parquet", len(data))
    assert meta.equals(pq.read_metadata(io.BytesIO(data)))
    assert spy.whole == []
    footer = int.from_bytes(data[-8:-4], "little") + 8
    assert len(spy.ranged) == (1 if footer <= min(guess, len(data)) else 2)
    assert sum(n for _, n in spy.ranged) <= max(min(guess, len(data)), footer)


def test_a_size_that_does_not_match_the_file_falls_back_to_the_whole_file_and_its_errors(tmp_path: Path) -> None:
    data = _parquet(3, 100, 10)
    catalog = Catalog(tmp_path / "lake")
    catalog.storage.write("f.parquet", data)
    assert read_footer(catalog.storage, "f.parquet", len(data) - 5).equals(pq.read_metadata(io.BytesIO(data)))
    catalog.storage.write("bad.parquet", b"not a parquet file at all, just some bytes")
    with pytest.raises(pa.ArrowInvalid):
        read_footer(catalog.storage, "bad.parquet", 42)


def _compacted_keys(catalog: Catalog) -> set[str]:
    from flash_pipeline.catalog.encoding import normalize_partition

    version = catalog.latest_compacted("C", normalize_partition({"p": "x"}))
    assert version is not None
    return {f.key for f in version.files}


def test_on_s3_a_compactions_iceberg_statistics_and_a_large_deltas_planning_read_only_tails(
        s3_lake: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    from flash_pipeline.compactor.steps import source_io

    monkeypatch.setattr(source_io, "UNIT_ROWS", 500)  # the delta (4 row groups of 1,000 rows) is split by its footer
    rows = pa.table({"id": pa.array(range(4000), pa.int64()), "v": pa.array(range(4000), pa.int64()),
                     "s": pa.array([str(i) * 3 for i in range(4000)])})
    sink = io.BytesIO()
    pq.write_table(rows, sink, row_group_size=1000)
    path = Path(str(s3_lake.uri).replace("/", "_") + ".parquet")
    local = Path("/tmp") / path.name
    local.write_bytes(sink.getvalue())
    try:
        s3_lake.append("S", {"p": "x"}, "upsert", [str(local)])
    finally:
        local.unlink()
    spy = _Spy(s3_lake.storage)
    options = CompactOptions(primary_keys=("id",), sort_keys=(("v", "ascending"),), destination_compacted_table_id="C",
                             rows_per_compacted_file=1500)
    compact("S", options, catalog=s3_lake, progress=lambda _: None, executor="in-process")
    written = _compacted_keys(s3_lake)
    assert len(written) >= 2
    assert not written & set(spy.whole), "a written file was read whole"
    tails: dict[str, Any] = {}
    for key, n in spy.ranged:
        tails.setdefault(key, []).append(n)
    assert written <= set(tails), "every written file's footer is read for its Iceberg statistics"
    assert all(n <= parquet_footers.FOOTER_GUESS for key in written for n in tails[key])
    delta_keys = [k for k in tails if "/streams/" in k]
    assert delta_keys, "the large delta's footer is read by range"
