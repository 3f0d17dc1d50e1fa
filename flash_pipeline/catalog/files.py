"""Tabular file formats: the paper's content types, read and written with PyArrow."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.orc as paorc
import pyarrow.parquet as pq

from flash_pipeline.errors import FlashError


class ContentType(str, enum.Enum):
    PARQUET = "parquet"
    FEATHER = "feather"
    ORC = "orc"
    CSV = "csv"

    @property
    def extension(self) -> str:
        return {"parquet": ".parquet", "feather": ".feather", "orc": ".orc", "csv": ".csv"}[self.value]

    @classmethod
    def parse(cls, text: str | "ContentType") -> "ContentType":
        if isinstance(text, ContentType):
            return text
        try:
            return cls(str(text).lower())
        except ValueError:
            raise FlashError(f"unknown format {text!r}: use one of parquet, feather, orc, csv") from None


_EXTENSIONS = {
    ".parquet": ContentType.PARQUET,
    ".pq": ContentType.PARQUET,
    ".feather": ContentType.FEATHER,
    ".arrow": ContentType.FEATHER,
    ".ipc": ContentType.FEATHER,
    ".orc": ContentType.ORC,
    ".csv": ContentType.CSV,
}


def content_type_of(path: str | Path) -> ContentType:
    suffix = Path(path).suffix.lower()
    if suffix not in _EXTENSIONS:
        raise FlashError(
            f"cannot tell the format of {path}: name it with one of {', '.join(sorted(_EXTENSIONS))}"
        )
    return _EXTENSIONS[suffix]


def read_table(source: Any, content_type: ContentType, columns: Sequence[str] | None = None) -> pa.Table:
    """Read ``columns`` (all when None) of one file; ``source`` is a path or a PyArrow buffer reader."""
    cols = list(columns) if columns is not None else None
    if content_type is ContentType.PARQUET:
        # ParquetFile reads one file without the dataset layer: half the overhead per file, which is most of
        # the cost of the tiny files thousands of small deltas bring
        return pq.ParquetFile(source).read(columns=cols, use_threads=False)
    if content_type is ContentType.FEATHER:
        return feather.read_table(source, columns=cols, memory_map=isinstance(source, str), use_threads=False)
    if content_type is ContentType.ORC:
        return paorc.read_table(source, columns=cols)
    if content_type is ContentType.CSV:
        opts = pacsv.ConvertOptions(include_columns=cols) if cols is not None else None
        return pacsv.read_csv(source, convert_options=opts, read_options=pacsv.ReadOptions(use_threads=False))
    raise AssertionError(content_type)


DICTIONARY_SAMPLE_ROWS = 20_000
DICTIONARY_MAX_DISTINCT_RATIO = 0.5


def dictionary_columns(table: pa.Table) -> list[str]:
    """Columns worth dictionary encoding: few distinct values in a sample of the first rows.

    Parquet writers try a dictionary for every column and fall back to plain encoding once it grows too big;
    for high-cardinality columns (ids, timestamps, free text) that attempt is wasted work on every write."""
    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    if sample.num_rows == 0:
        return list(table.column_names)
    out = []
    for name in table.column_names:
        column = sample.column(name)
        if pa.types.is_nested(column.type) or pa.types.is_dictionary(column.type):
            out.append(name)
            continue
        distinct = pc.count_distinct(column, mode="all").as_py()
        if distinct <= DICTIONARY_MAX_DISTINCT_RATIO * sample.num_rows:
            out.append(name)
    return out


def write_table(table: pa.Table, sink: Any, content_type: ContentType, row_group_size: int | None = None) -> None:
    if content_type is ContentType.PARQUET:
        pq.write_table(table, sink, compression="snappy", row_group_size=row_group_size, use_dictionary=dictionary_columns(table))
    elif content_type is ContentType.FEATHER:
        feather.write_feather(table, sink, compression="lz4")
    elif content_type is ContentType.ORC:
        paorc.write_table(table, sink)
    elif content_type is ContentType.CSV:
        pacsv.write_csv(table, sink)
    else:
        raise AssertionError(content_type)


def schema_to_json(schema: pa.Schema) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]
