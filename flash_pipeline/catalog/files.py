"""Tabular file formats: the paper's content types, read and written with PyArrow."""

from __future__ import annotations

import enum
import itertools
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq

from flash_pipeline.catalog.csv_range import require_csv_readable
from flash_pipeline.catalog.physical_names import physical_view
from flash_pipeline.errors import FlashError, InternalError


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


# the lake's top folder for Delta roots whose natural key contains '%' (deltalake_table.deltalake_root)
RELOCATED_ROOTS = "delta"

def written_by_compactor(key: str) -> bool:
    """A file under a partition's ``compacted/`` folder, or under the lake's ``delta/`` folder (the Delta roots of
    partitions whose keys need ``%``: deltalake_table.deltalake_root), was written by :func:`write_table` (compaction or
    optimize), so a CSV one follows its null conventions; a delta file is the user's own CSV (always under
    ``tables/``). Encoded table and partition components escape ``/``, so only the catalog's own folder names
    can match."""

    return "/compacted/" in key or key.startswith(f"{RELOCATED_ROOTS}/")


def read_table(
    source: Any,
    content_type: ContentType,
    columns: Sequence[str] | None = None,
    schema: pa.Schema | None = None,
    compacted: bool = False,
    use_threads: bool = False,
) -> pa.Table:
    """Read ``columns`` (all when None) of one file; ``source`` is a path or a PyArrow buffer reader.

    ``schema`` is the Arrow schema recorded for the file (``Delta.arrow_schema``,
    ``CompactedVersion.arrow_schema``): its columns come back with exactly those types, whatever the format
    could store (CSV keeps no types, ORC has no unsigned, time or duration types, ...). ``compacted`` says the
    file was written by :func:`write_table`: a CSV one then tells null (unquoted empty) from "" (quoted) and
    reads NaN and +-inf as floats; a user's delta CSV keeps the reader's defaults it was appended with.
    ``use_threads`` decodes columns on Arrow's CPU pool: 3x faster for one large Parquet file on two cores, pure
    overhead for the small files thousands of deltas bring."""
    view = physical_view(schema)
    if view is not None:  # a file written under older column names (evolve --rename/--drop): read those
        physical, logical = view
        by_logical = {v: k for k, v in logical.items()}
        names = list(columns) if columns is not None else list(schema.names)  # type: ignore[union-attr]
        table = read_table(source, content_type, [by_logical.get(c, c) for c in names], physical, compacted,
                           use_threads)
        return table.rename_columns([logical.get(n, n) for n in table.column_names])
    cols = list(columns) if columns is not None else None
    if content_type is ContentType.PARQUET:
        # ParquetFile reads one file without the dataset layer: half the overhead per file, which is most of
        # the cost of the tiny files thousands of small deltas bring
        table = pq.ParquetFile(source).read(columns=cols, use_threads=use_threads)
    elif content_type is ContentType.FEATHER:
        table = feather.read_table(source, columns=cols, memory_map=isinstance(source, str), use_threads=use_threads)
    elif content_type is ContentType.ORC:
        import pyarrow.orc as paorc  # imported when an ORC file is met: it pulls in pyarrow.fs and S3 (25 ms a process)

        table = paorc.read_table(source, columns=cols)
    elif content_type is ContentType.CSV:
        table = _read_csv(source, cols, schema, compacted)
    else:
        raise InternalError(f"no reader/writer for content type {content_type!r}")
    return conform_to_schema(table, schema) if schema is not None else table


def _read_csv(source: Any, cols: list[str] | None, schema: pa.Schema | None, compacted: bool) -> pa.Table:
    types = {f.name: _csv_read_type(f.type) for f in schema} if schema is not None else {}
    if compacted:
        # write_table's CSV: nulls are unquoted empty fields, strings are always quoted, floats print as
        # nan/inf/-inf; a one-column row holding null is an empty line
        convert = pacsv.ConvertOptions(
            include_columns=cols, column_types=types, null_values=[""], true_values=["true"], false_values=["false"],
            strings_can_be_null=True, quoted_strings_can_be_null=False,
        )
        parse = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False)
    else:
        convert = pacsv.ConvertOptions(include_columns=cols, column_types=types)
        parse = pacsv.ParseOptions(newlines_in_values=True)
    return pacsv.read_csv(source, convert_options=convert, parse_options=parse,
                          read_options=pacsv.ReadOptions(use_threads=False))


def _csv_read_type(t: pa.DataType) -> pa.DataType:
    """The type the CSV reader can convert text to on the way to ``t`` (conform_to_schema casts the rest)."""
    if pa.types.is_dictionary(t):
        return _csv_read_type(t.value_type)
    if pa.types.is_decimal256(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_float16(t):
        return pa.float32()
    if _is_narrow_decimal(t):  # the CSV reader converts to decimal128 only (conform_to_schema casts it back)
        return pa.decimal128(t.precision, t.scale)
    return t


def _is_narrow_decimal(t: pa.DataType) -> bool:  # Arrow's newer decimals, which its CSV and ORC readers never give
    return pa.types.is_decimal32(t) or pa.types.is_decimal64(t)


def conform_to_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with each column that ``schema`` names cast back to its recorded type (vectorized casts; the
    table's own schema metadata is kept). Columns ``schema`` does not name stay as read.

    Called for every file read: the recorded fields are looked up by name in a dict (``schema.names`` and
    ``schema.field(name)`` walk every column, so a table of 2,000 columns spent 0.85 s a file here)."""
    recorded = {f.name: f for f in schema}
    if all(f.name not in recorded or recorded[f.name].type == f.type for f in table.schema):
        return table
    arrays, fields = [], []
    for i, f in enumerate(table.schema):
        column = table.column(i)
        if f.name in recorded and recorded[f.name].type != f.type:
            target = recorded[f.name]
            column = _restore(column, target.type)
            f = pa.field(f.name, target.type, target.nullable, target.metadata)
        arrays.append(column)
        fields.append(f)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))


def _restore(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """Cast a column as stored (see ``_storage_type``) back to its recorded type."""
    if pa.types.is_null(target):
        return pa.chunked_array([pa.nulls(len(column))], pa.null())
    if pa.types.is_dictionary(target):
        values = _restore(column, target.value_type) if column.type != target.value_type else column
        return pc.dictionary_encode(values).cast(target)
    if pa.types.is_uint64(target) and pa.types.is_int64(column.type):
        return pc.cast(column, target, safe=False)  # stored by bit pattern: ORC has no unsigned types
    if pa.types.is_time32(target) and not pa.types.is_int32(column.type) and pa.types.is_integer(column.type):
        column = pc.cast(column, pa.int32())
    return pc.cast(column, target)


DICTIONARY_SAMPLE_ROWS = 20_000
DICTIONARY_PROBE_ROWS = 2_000
DICTIONARY_MAX_DISTINCT_RATIO = 0.5


def _few_distinct(column: pa.ChunkedArray | pa.Array) -> bool | None:
    """Whether at most DICTIONARY_MAX_DISTINCT_RATIO of ``column``'s values are distinct (None: no kernel)."""
    try:
        distinct = pc.count_distinct(column, mode="all").as_py()
    except pa.ArrowNotImplementedError:  # null, string_view, ...: no kernel, and nothing a dictionary helps
        return None
    return distinct <= DICTIONARY_MAX_DISTINCT_RATIO * len(column)


def dictionary_columns(table: pa.Table) -> list[str]:
    """Columns worth dictionary encoding: few distinct values in a sample of the first rows.

    Parquet writers try a dictionary for every column and fall back to plain encoding once it grows too big;
    for high-cardinality columns (ids, timestamps, free text) that attempt is wasted work on every write.
    A column with many distinct values among its first DICTIONARY_PROBE_ROWS rows is decided on them alone:
    counting the whole sample's distinct values cost every materialize task ~25 ms (s3's 9 columns, most of
    it the ids and free text, which a probe a tenth the size rules out just as well)."""
    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    if sample.num_rows == 0:
        return list(table.column_names)
    probe = sample.slice(0, DICTIONARY_PROBE_ROWS) if sample.num_rows > DICTIONARY_PROBE_ROWS else None
    out = []
    for name in table.column_names:
        column = sample.column(name)
        if pa.types.is_nested(column.type) or pa.types.is_dictionary(column.type):
            out.append(name)
            continue
        if probe is not None and _few_distinct(probe.column(name)) is False:
            continue
        if _few_distinct(column):
            out.append(name)
    return out


_BINARY_TYPES = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary, pa.types.is_binary_view)
# ORC lacks these types: stored as the (wider or same-width) integer type, cast back on read (uint64: its bit pattern,
# an unsafe cast both ways: exact)
_ORC_ENCODED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.int64()}
# ORC stores timestamps in nanoseconds and PyArrow refuses to read one outside this range
_ORC_TS_RANGE = (np.datetime64("1677-09-22", "us"), np.datetime64("2262-04-11", "us"))


def unsupported_columns(schema: pa.Schema, content_type: ContentType) -> list[str]:
    """Columns (with their type) a ``content_type`` file cannot hold so that they read back as they were.

    CSV is text: binary values need not be text, nested values have no CSV form, intervals no CSV reader.
    ORC (even with the encodings of ``_orc_storable``) has no interval types and no encoding inside nested
    values. Arrow's Parquet writer has no intervals, unions or run-end encoding; Feather holds every Arrow type."""
    holds = {ContentType.CSV: _csv_holds, ContentType.ORC: lambda t: _orc_holds(t, top=True),
             ContentType.PARQUET: _parquet_holds}.get(content_type, lambda t: True)
    return [f"{f.name!r} ({f.type})" for f in schema if not holds(f.type)]


def _parquet_holds(t: pa.DataType) -> bool:
    if pa.types.is_interval(t) or pa.types.is_union(t) or pa.types.is_run_end_encoded(t) or _odd_scale(t):
        return False
    inner = [t.value_type] if pa.types.is_dictionary(t) else [t.field(i).type for i in range(t.num_fields)]
    return all(_parquet_holds(u) for u in inner)


def csv_unsupported_columns(schema: pa.Schema) -> list[str]:
    """``unsupported_columns`` for CSV output: compaction should refuse ``--format csv`` before any work."""
    return unsupported_columns(schema, ContentType.CSV)


def require_storable(schema: pa.Schema, content_type: ContentType, where: str = "the table") -> None:
    """Raise the one-line FlashError that names the columns a ``content_type`` file cannot round-trip."""
    bad = unsupported_columns(schema, content_type)
    if bad:
        others = [c.value for c in ContentType if c is not content_type and not unsupported_columns(schema, c)]
        others_text = ", ".join(others[:-1]) + " or " + others[-1] if len(others) > 1 else "".join(others)
        raise FlashError(
            f"column{'s' if len(bad) > 1 else ''} {', '.join(bad)} of {where} cannot be stored in {content_type.value} "
            f"files: compact with --format {others_text}"
        )


def _csv_holds(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _csv_holds(t.value_type)
    if any(is_(t) for is_ in _BINARY_TYPES) or pa.types.is_nested(t) or pa.types.is_interval(t):
        return False
    return not (pa.types.is_union(t) or isinstance(t, pa.ExtensionType))


def _odd_scale(t: pa.DataType, orc: bool = False) -> bool:  # Arrow's ORC writer aborts, its Parquet writer fails
    return pa.types.is_decimal(t) and (t.scale < 0 or (not orc and t.scale > t.precision))


def _orc_holds(t: pa.DataType, top: bool) -> bool:
    if pa.types.is_interval(t) or pa.types.is_union(t) or isinstance(t, pa.ExtensionType) or _odd_scale(t, True):
        return False
    if pa.types.is_nested(t):
        return all(_orc_holds(t.field(i).type, top=False) for i in range(t.num_fields))
    return top or _orc_native(t)


def _orc_native(t: pa.DataType) -> bool:
    return not (
        t in _ORC_ENCODED or pa.types.is_time(t) or pa.types.is_duration(t) or pa.types.is_dictionary(t)
        or pa.types.is_null(t) or pa.types.is_decimal256(t) or pa.types.is_string_view(t) or pa.types.is_float16(t)
        or pa.types.is_binary_view(t) or pa.types.is_date64(t) or _is_narrow_decimal(t)
    )


def _storage_type(t: pa.DataType) -> pa.DataType:
    """What an ORC file stores for a top-level column of type ``t`` (``_restore`` undoes it)."""
    if t in _ORC_ENCODED:
        return _ORC_ENCODED[t]
    if pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_time64(t) or pa.types.is_duration(t):
        return pa.int64()
    if pa.types.is_dictionary(t):
        return _storage_type(t.value_type)
    if pa.types.is_null(t):
        return pa.int8()
    if pa.types.is_decimal256(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_date64(t):  # ORC's writer makes it a nanosecond timestamp, unreadable outside 1677..2262
        return pa.date32()
    if _is_narrow_decimal(t):  # the ORC writer has no decimal32/64
        return pa.decimal128(t.precision, t.scale)
    return t


def _orc_storable(table: pa.Table) -> pa.Table:
    arrays, fields = [], []
    for i, f in enumerate(table.schema):
        column = table.column(i)
        if pa.types.is_timestamp(f.type) and f.type.unit != "ns" and column.null_count < len(column):
            lo, hi = pc.min_max(column.cast(pa.timestamp(f.type.unit))).values()
            if lo.as_py() is not None and (
                    lo.value < _ORC_TS_RANGE[0].astype(f"datetime64[{f.type.unit}]").astype(np.int64)
                    or hi.value > _ORC_TS_RANGE[1].astype(f"datetime64[{f.type.unit}]").astype(np.int64)):
                raise FlashError(
                    f"column {f.name!r} ({f.type}) holds timestamps outside 1677-09-22..2262-04-11, which ORC files "
                    "cannot give back: compact with --format parquet or feather"
                )
        if pa.types.is_nested(f.type):
            # PyArrow's ORC writer ignores the offset of a sliced struct array (it writes the wrong rows'
            # validity and values): hand it unsliced copies
            column = pc.take(column, pa.array(np.arange(len(column))))
        stored = _storage_type(f.type)
        if stored != f.type:
            if pa.types.is_null(f.type):
                column = pa.chunked_array([pa.nulls(len(column), stored)], stored)
            elif pa.types.is_dictionary(f.type) and stored != f.type.value_type:
                column = pc.cast(column.cast(f.type.value_type), stored, safe=False)
            else:
                column = pc.cast(column, stored, safe=False)  # safe=False only matters for uint64's bit pattern
            f = pa.field(f.name, stored, f.nullable, f.metadata)
        arrays.append(column)
        fields.append(f)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))


def _csv_storable(table: pa.Table) -> pa.Table:
    require_storable(table.schema, ContentType.CSV)
    require_csv_readable(table)
    casts = {f.name: pa.string() for f in table.schema if pa.types.is_string_view(f.type)}
    casts.update({f.name: pa.float32() for f in table.schema if pa.types.is_float16(f.type)})
    if not casts:
        return table
    return table.cast(pa.schema([pa.field(f.name, casts.get(f.name, f.type), f.nullable) for f in table.schema],
                                metadata=table.schema.metadata))


def write_table(table: pa.Table, sink: Any, content_type: ContentType, row_group_size: int | None = None) -> None:
    """Write one file. ORC and CSV lack some Arrow types: ORC gets them as integers or text, CSV refuses the ones
    text cannot give back (``unsupported_columns``); readers pass the recorded schema to :func:`read_table` to
    get the exact types back."""
    if content_type is ContentType.PARQUET:
        pq.write_table(table, sink, compression="snappy", row_group_size=row_group_size,
                       use_dictionary=dictionary_columns(table))
    elif content_type is ContentType.FEATHER:
        feather.write_feather(table, sink, compression="lz4")
    elif content_type is ContentType.ORC:
        require_storable(table.schema, ContentType.ORC)
        import pyarrow.orc as paorc

        paorc.write_table(_orc_storable(table), sink)
    elif content_type is ContentType.CSV:
        pacsv.write_csv(_csv_storable(table), sink)
    else:
        raise InternalError(f"no reader/writer for content type {content_type!r}")


def write_chunks(first: pa.Table, rest: Iterable[pa.Table], sink: Any, content_type: ContentType,
                 metadata: dict[str, str] | None = None) -> None:
    """Write one file from its chunks in order, with ``metadata`` on its schema. Parquet gets a row group per
    chunk, written as it comes, so the writer never holds the file's rows (the chunks may be produced lazily);
    other formats write the file whole."""
    if content_type is not ContentType.PARQUET:
        table = pa.concat_tables([first, *rest])
        write_table(table.replace_schema_metadata(metadata) if metadata else table, sink, content_type)
        return
    schema = first.schema.with_metadata(metadata) if metadata else first.schema
    with pq.ParquetWriter(sink, schema, compression="snappy", use_dictionary=dictionary_columns(first)) as writer:
        for chunk in itertools.chain([first], rest):
            writer.write_table(chunk, row_group_size=max(1, chunk.num_rows))  # the writer's schema carries the metadata


def schema_to_json(schema: pa.Schema) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]
