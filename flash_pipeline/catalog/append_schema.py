"""How an append's files change its partition stream's schema: the evolution they bring (or the refusal), and
recording it as the stream's next schema entry, re-checked against another append that claimed it first. The
rules are catalog/schema_evolution.py's; the entries catalog/schema_history.py's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType, read_table
from flash_pipeline.catalog.model import DELETE, UPSERT, StreamVersion
from flash_pipeline.catalog.schema_evolution import Evolution, converts, evolve
from flash_pipeline.catalog.schema_history import claim_entry, latest_entry
from flash_pipeline.catalog.validation import SchemaReference, StagedFile, columns_text
from flash_pipeline.errors import FlashError, InternalError, SchemaConflict


def csv_in_stream_types(s: StagedFile, stream: pa.Schema) -> StagedFile:
    """A CSV file's columns read in the stream's types where the types guessed from its text do not fit them (a
    string column whose values are all digits, "02134", guessed int64): CSV text has no types, and the file is
    read later in the types recorded for it (files.read_table), so it is recorded in the stream's. Text that does
    not parse as the stream's type keeps the guess, which the schema checks then refuse, naming the column."""
    if s.content_type is not ContentType.CSV or s.local_path is None:
        return s
    types = {f.name: f.type for f in stream}
    misfits = {f.name for f in s.schema if f.name in types and not converts(f.type, types[f.name])}
    if not misfits:
        return s
    wanted = pa.schema([f.with_type(types[f.name]) if f.name in misfits else f for f in s.schema])
    try:
        table = read_table(str(s.local_path), ContentType.CSV, schema=wanted)
        rounded = _rounded_integers(s, table, misfits)
        if rounded:  # integers a float column cannot hold keep their type: the schema checks refuse them, as Parquet's
            table = read_table(str(s.local_path), ContentType.CSV, schema=pa.schema(
                [s.schema.field(f.name) if f.name in rounded else f for f in wanted]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return s
    nulls = frozenset(name for name, column in zip(table.column_names, table.columns) if column.null_count)
    return dataclasses.replace(s, schema=table.schema, nulls=nulls)


def csv_files_in_stream_types(staged: list[StagedFile], stream: pa.Schema) -> list[StagedFile]:
    """:func:`csv_in_stream_types` of every file of one append, agreeing: a float column one file keeps as double
    (a whole number its float type would round) is read as double in the others too, or the files of one delta
    would differ in type and the append be refused."""
    out = [csv_in_stream_types(s, stream) for s in staged]
    if len(out) < 2:
        return out
    kept = {f.name for s in out if s.content_type is ContentType.CSV for f in s.schema if f.name in stream.names
            and pa.types.is_floating(stream.field(f.name).type) and pa.types.is_float64(f.type)
            and not pa.types.is_float64(stream.field(f.name).type)}
    if not kept:
        return out
    wider = pa.schema([f.with_type(pa.float64()) if f.name in kept else f for f in stream])
    return [csv_in_stream_types(s, wider) for s in staged]


def _rounded_integers(s: StagedFile, table: pa.Table, misfits: set[str]) -> set[str]:
    """Columns of text read into a float column of the stream that rounds an integer they hold (16777217 as float32,
    2**53 + 1 as float64, also among decimals: ``0.5`` beside ``16777217`` into float32): text is read as the
    stream's type only when no whole number changes (a decimal fraction is the nearest float, as any reader gives)."""
    import pyarrow.compute as pc

    columns = [n for n in misfits if (pa.types.is_integer(s.schema.field(n).type)
                                      or pa.types.is_floating(s.schema.field(n).type))
               and pa.types.is_floating(table.schema.field(n).type)]
    if not columns:
        return set()
    assert s.local_path is not None
    guessed = read_table(str(s.local_path), ContentType.CSV, schema=s.schema)
    lost = set()
    for n in columns:
        text = guessed[n]
        if pa.types.is_integer(text.type):  # a float read from integer text is whole: back in its type, equal
            same = pc.equal(pc.cast(table[n], text.type, safe=False), text)
        else:  # the whole numbers among decimals (as float64) must come out of the narrower float unchanged
            whole = pc.and_(pc.is_finite(text), pc.equal(text, pc.floor(text)))
            same = pc.or_(pc.invert(whole), pc.equal(pc.cast(table[n], text.type), text))
        if pc.all(same).as_py() is False:
            lost.add(n)
    return lost


def append_evolution(catalog: Any, table_id: str, partition: PartitionKeys, operation: str, staged: list[StagedFile],
                     reference: SchemaReference) -> Evolution:
    """What the staged files (one schema: checked before) change in the stream's newest schema, or
    SchemaConflict. Widening a sort key is refused once a compaction recorded it (its index bytes keep the
    type's width)."""
    assert reference.schema is not None
    where = f"table {table_id!r} partition {format_partition(partition)}"
    first = staged[0]
    if operation == DELETE:
        unknown = sorted(set(first.schema.names) - set(reference.schema.names))
        if unknown:
            raise SchemaConflict(f"delete file {first.source} has columns {unknown} that {where} does not have: keep "
                                 "only primary key columns")
    nulls = frozenset().union(*(s.nulls for s in staged))
    evo = evolve(reference.schema, first.schema, upsert=operation == UPSERT, source=first.source, where=where,
                 nulls=nulls)
    omitted = [n for n in reference.schema.names if n not in first.schema.names] if operation == UPSERT else []
    if omitted:  # a key column left out would block the next compaction: refuse it now (keys are recorded there)
        keys = {n: "primary key" for c in catalog.compactions_of(table_id, partition) for n in c.primary_keys}
        keys.update({n: "sort key" for c in catalog.compactions_of(table_id, partition) for n, _ in c.sort_keys})
        missing = [f"{n!r} ({keys[n]})" for n in omitted if n in keys]
        if missing:
            raise SchemaConflict(f"{first.source} leaves out {', '.join(missing)} of {where}: an upsert carries every "
                                 "key column; include it, or start a new stream version with the new schema "
                                 "(flash-compactor new-stream --schema-from FILE); nothing was appended")
    if evo.widened:
        sort_keys = [n for c in catalog.compactions_of(table_id, partition) for n, _ in c.sort_keys]
        if sort_keys:
            evo = evolve(reference.schema, first.schema, upsert=True, source=first.source, where=where, nulls=nulls,
                         sort_keys=sort_keys)
    return evo


def claim_schema_change(catalog: Any, table_id: str, partition: PartitionKeys, operation: str, staged: list[StagedFile],
                        stream: StreamVersion, reference: SchemaReference) -> int:
    """Record the staged files' change as the stream's next schema entry, and return the entry the files are
    recorded under. Losing the entry to another append (which changed the schema its own way): check the files
    again against the winner and claim the next."""
    for _ in range(100):
        assert reference.evolution is not None
        if not reference.evolution.changed:
            return reference.entry
        if claim_entry(catalog, stream, reference.entry + 1, reference.evolution.schema,
                       reference.evolution.describe()):
            return reference.entry + 1
        latest = latest_entry(catalog, stream)
        if latest is None:
            raise InternalError(f"the schema history of table {table_id!r} [{format_partition(partition)}] lost its "
                                "entries")
        reference = SchemaReference(columns_text(latest[1]), deletes_only=False, from_doc=True, schema=latest[1],
                                    entry=latest[0])
        reference.evolution = append_evolution(catalog, table_id, partition, operation, staged, reference)
    raise FlashError(f"could not record the schema change of table {table_id!r} [{format_partition(partition)}]: "
                     "append again")
