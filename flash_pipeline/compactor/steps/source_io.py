"""Reading round inputs: whole files, or the Parquet row groups of one unit of a large delta file."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from flash_pipeline.catalog.files import ContentType, conform_to_schema, read_table, written_by_compactor
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.model.plans import SourceFile
from flash_pipeline.errors import FlashError

# a delta file with more rows than this is split into units of about this many rows (by Parquet row groups)
UNIT_ROWS = 1_000_000


def read_source(storage: Storage, source: SourceFile, columns: Sequence[str] | None, schema: pa.Schema | None = None) -> pa.Table:
    if source.row_groups:
        pf = pq.ParquetFile(storage.arrow_source(source.key))
        table = pf.read_row_groups(list(source.row_groups), columns=list(columns) if columns is not None else None, use_threads=False)
        return conform_to_schema(table, schema) if schema is not None else table
    # the recorded schema gives every format its exact types back (CSV carries none, ORC lacks some)
    return read_table(storage.arrow_source(source.key), source.content_type, columns, schema, written_by_compactor(source.key))


def read_unit(storage: Storage, source: SourceFile, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
    """``read_source`` that also checks the unit's row count against its manifest: rows are addressed by their
    index in the unit, so a file replaced after it was committed must stop the round, not shift rows."""
    table = read_source(storage, source, columns, schema)
    if table.num_rows != source.rows:
        manifest = "compacted version" if source.prior else "delta"
        raise FlashError(
            f"{source.key}: holds {table.num_rows} rows but its {manifest} manifest says {source.rows}; "
            "was the file replaced after it was committed?"
        )
    return table


def split_units(storage: Storage, f: DataFile, unit_rows: int = UNIT_ROWS) -> list[tuple[tuple[int, ...], int, int, int]]:
    """(row groups, rows, approx bytes, first row) per unit of a large Parquet file; one unit otherwise."""
    whole = [((), f.rows, f.bytes, 0)]
    if f.content_type is not ContentType.PARQUET or f.rows <= unit_rows:
        return whole
    meta = pq.ParquetFile(storage.arrow_source(f.key)).metadata
    if meta.num_row_groups <= 1:
        return whole
    units: list[tuple[tuple[int, ...], int, int, int]] = []
    groups: list[int] = []
    rows = size = start = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        groups.append(g)
        rows += rg.num_rows
        size += rg.total_byte_size
        if rows >= unit_rows:
            units.append((tuple(groups), rows, size, start))
            start += rows
            groups, rows, size = [], 0, 0
    if groups:
        units.append((tuple(groups), rows, size, start))
    scale = f.bytes / max(1, sum(u[2] for u in units))  # row group sizes are uncompressed: scale to bytes at rest
    return [(g, r, int(b * scale), s) for g, r, b, s in units]
