"""What ``verify`` learns from one data file's bytes (size, checksum, rows, row groups, key range) and the
findings where they differ from what its manifest recorded."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from flash_pipeline.catalog.checksums import checksum_of
from flash_pipeline.catalog.files import ContentType, read_table, written_by_compactor
from flash_pipeline.catalog.key_ranges import KeyRangeBuilder
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.errors import NotFound


@dataclass(frozen=True)
class FileFacts:
    """What storage holds at one key (None size: missing)."""

    size: int | None
    checksum: str = ""
    rows: int | None = None
    unreadable: str = ""  # why the rows could not be counted
    row_groups: tuple[int, ...] = ()  # a Parquet file's rows per row group
    key_values: KeyRangeBuilder | None = None  # the values of the column of its recorded key range, if any


def count_rows(data: bytes, content_type: ContentType, key: str) -> tuple[int, tuple[int, ...]]:
    """Row count (and a Parquet file's rows per row group) from the file's own metadata (no decoding of values
    where the format allows it)."""
    source = pa.BufferReader(data)
    if content_type is ContentType.PARQUET:
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(source).metadata
        return int(meta.num_rows), tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
    if content_type is ContentType.ORC:
        import pyarrow.orc as paorc

        return int(paorc.ORCFile(source).nrows), ()
    if content_type is ContentType.FEATHER:
        with pa.ipc.open_file(source) as reader:
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches)), ()
    # CSV: no footer, parse it
    return read_table(source, content_type, compacted=written_by_compactor(key)).num_rows, ()


def data_facts(storage: Storage, key: str, content_type: ContentType,
               range_column: pa.Field | str | None = None) -> tuple[FileFacts, int]:
    try:
        data = storage.read(key)
    except NotFound:
        return FileFacts(None), 0
    rows: int | None
    row_groups: tuple[int, ...] = ()
    key_values = None
    try:
        rows, row_groups = count_rows(data, content_type, key)
        if range_column is not None:  # one column decoded (a data file records the range of its first key)
            name = range_column.name if isinstance(range_column, pa.Field) else range_column
            recorded = pa.schema([range_column]) if isinstance(range_column, pa.Field) else None
            key_values = KeyRangeBuilder(name)
            key_values.add(read_table(pa.BufferReader(data), content_type, [name], recorded,
                                      compacted=written_by_compactor(key)))
        why = ""
    except Exception as exc:  # noqa: BLE001 - a damaged file is a finding, not a crash
        rows, why = None, (f"unreadable as {content_type.value} "
                           f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")
    return FileFacts(len(data), checksum_of(data), rows, why, row_groups, key_values), len(data)


def row_group_findings(f: DataFile, facts: FileFacts) -> list[str]:
    """A recorded row group size (``DataFile.row_group_rows``) the file's footer does not bear out: a round would
    split the file into units at the wrong rows."""
    size = f.row_group_rows
    if not size or facts.rows != f.rows or not facts.row_groups:
        return []
    expected = [size] * (f.rows // size) + ([f.rows % size] if f.rows % size else [])
    if list(facts.row_groups) == expected:
        return []
    return [f"row groups of {list(facts.row_groups)[:4]}... rows, the manifest recorded {size} rows each (the last may "
            "hold fewer)"]


def key_range_findings(f: DataFile, facts: FileFacts) -> list[str]:
    """A recorded key range (``DataFile.key_range``) the file's rows do not bear out: a round would skip the
    index files of keys the file holds, and keep a superseded row."""
    r, seen = f.key_range, facts.key_values
    if r is None or seen is None or facts.unreadable:
        return []
    if not seen.known:
        return [f"column {r.column} holds nulls or is not an integer column, the manifest recorded a key range "
                f"[{r.low}, {r.high}]"]
    if seen.low is not None and seen.high is not None and (seen.low < r.low or seen.high > r.high):
        return [f"column {r.column} holds values {seen.low} to {seen.high}, outside the recorded key range "
                f"[{r.low}, {r.high}]"]
    return []


def file_findings(recorded_bytes: int, recorded_rows: int, recorded_checksum: str, facts: FileFacts) -> list[str]:
    """What is wrong with one file against its record: [] when nothing."""
    if facts.size is None:
        return [f"missing (recorded {recorded_bytes} B, {recorded_rows} rows)"]
    out = []
    if facts.size != recorded_bytes:
        out.append(f"holds {facts.size} B, the manifest recorded {recorded_bytes} B")
    if recorded_checksum and facts.checksum != recorded_checksum:
        out.append(f"content checksum {facts.checksum[:19]}… differs from the recorded {recorded_checksum[:19]}… "
                   "(replaced or changed after its commit)")
    if facts.unreadable:
        out.append(facts.unreadable)
    elif facts.rows is not None and facts.rows != recorded_rows:
        out.append(f"holds {facts.rows} rows, the manifest recorded {recorded_rows}")
    return out
