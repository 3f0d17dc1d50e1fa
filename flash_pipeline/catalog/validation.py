"""Checks of appended files against their partition stream: column names, one schema per delta, the stream's
schema, a CSV parsed with the wrong delimiter; and the one-line hint that says how to unblock a stream."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import DELETE, UPSERT
from flash_pipeline.catalog.schema_evolution import Evolution, converts_text, type_text
from flash_pipeline.errors import FlashError, SchemaConflict

POSITION_DIGITS = 20
INTERNAL_COLUMNS = frozenset({"__stream_position__"})  # columns the compactor adds; never a user's


VERSION_DIGITS = 10


@dataclass(frozen=True)
class StagedFile:
    file_number: int
    source: str  # a local path, or "<table N>" for in-memory tables
    content_type: ContentType
    rows: int
    schema: pa.Schema
    payload: bytes | None  # in-memory tables are serialized up front
    local_path: Path | None
    csv_delimiter: str | None = None  # the delimiter a CSV source was parsed with
    nulls: frozenset[str] = frozenset()  # the columns that hold a null (a required column must not)


@dataclass
class SchemaReference:
    """The columns later appends are checked against: the stream's schema document, or for a stream without one
    its latest upsert (``deletes_only``: only delete deltas so far, which carry a subset of the columns)."""

    columns: dict[str, str]
    deletes_only: bool
    from_doc: bool
    schema: pa.Schema | None = None  # the stream's newest schema entry (from_doc), and its number
    entry: int = 0
    evolution: "Evolution | None" = None  # what the checked files change in it (schema evolution on)


def columns_text(schema: pa.Schema) -> dict[str, str]:
    return {f.name: type_text(f.type) for f in schema}


def require_same_columns(a: pa.Schema, b: pa.Schema, b_name: str, a_name: str, table_id: str) -> None:
    ca = columns_text(a)
    cb = columns_text(b)
    if ca != cb:
        raise SchemaConflict(
            f"{b_name} has columns {_describe(cb)} but {a_name} has {_describe(ca)} (table {table_id!r}): "
            "files of one delta must share one schema"
        )


def _describe(cols: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in cols.items()) + "}"


CSV_DELIMITERS = (",", ";", "\t", "|")


def check_columns(schema: pa.Schema, source: str) -> None:
    """Refuse duplicate column names and names of the compactor's internal columns (both would silently
    corrupt compaction: a column is addressed by its name), and column types no compaction can move."""
    names = schema.names
    counts = Counter(names)
    duplicates = sorted(n for n, c in counts.items() if c > 1)
    if duplicates:
        raise FlashError(f"{source} has duplicate column names {duplicates}: rename the columns so that each name is "
                         "unique; nothing was appended")
    internal = sorted(set(names) & INTERNAL_COLUMNS)
    if internal:
        raise FlashError(f"{source} has column(s) {internal} whose names are reserved for the compactor's internal "
                         "columns: rename them; nothing was appended")
    unmovable = [f"{f.name!r} ({f.type})" for f in schema if not _takeable(f.type)]
    if unmovable:
        raise FlashError(f"{source} has column(s) {', '.join(unmovable)} of a type Arrow cannot select rows of (no "
                         "'take' kernel), so no compaction or read could use them: cast them to a plain type "
                         "(string_view to string, binary_view to binary, run-end encoded to its values) before "
                         "appending; nothing was appended")


def _takeable(t: pa.DataType) -> bool:
    """Whether Arrow can take rows of a column of type ``t`` (what materialize and every read do). Accepted
    before, a string_view, binary_view or run-end encoded column blocked its stream: every compaction and read
    failed with Arrow's "no kernel matching input types". Only a take that Arrow refuses counts: a type it
    cannot even build an empty array of here (an extension type inside a list, say) is not refused, since
    take works on such columns. Not cached: a Python extension type need not be hashable."""
    try:
        empty = pa.nulls(0, t)
    except Exception:  # noqa: BLE001 - cannot ask: do not refuse what may well work
        return True
    try:
        empty.take(pa.array([], type=pa.int64()))
        return True
    except pa.ArrowNotImplementedError:
        return False


def check_csv_parse(staged: list[StagedFile], reference: SchemaReference | None) -> None:
    """A CSV parsed as one column whose name holds another known delimiter was almost surely split with the
    wrong delimiter: refuse it for a new stream or a table with several columns, naming the likely one."""
    for s in staged:
        if s.csv_delimiter is None or len(s.schema) != 1:
            continue
        if reference is not None and len(reference.columns) <= 1:
            continue  # a one-column table: a one-column CSV is what it takes
        header = s.schema.names[0]
        counts = {d: header.count(d) for d in CSV_DELIMITERS if d != s.csv_delimiter}
        likely = max(counts, key=lambda d: counts[d])
        if counts[likely]:
            raise FlashError(
                f"{s.source} parses as one column {header!r} with CSV delimiter {s.csv_delimiter!r}, but its header "
                f"looks {likely!r}-separated: pass --csv-delimiter {likely!r} (csv_delimiter= in Python); nothing was "
                "appended"
            )


def columns_match(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(x.type == y.type for x, y in zip(a, b))


def recovery_hint(catalog_uri: str | None, table_id: str, partition: PartitionKeys, position: int,
                  restartable: bool = True) -> str:
    """The commands that unblock a stream stuck on the delta at ``position`` (shell-quoted, copy-pasteable).
    ``restartable`` False: the stream has no compacted version to start a new stream version from, so
    ``new-stream`` (which would refuse) is not offered."""
    import shlex

    args = f"--catalog {shlex.quote(catalog_uri) if catalog_uri else '<lake URI>'} --table {shlex.quote(table_id)}"
    args += "".join(f" --partition {shlex.quote(n + '=' + ('<null>' if v is None else v))}" for n, v in partition)
    skip = f"skip it: flash-compactor skip-delta {args} --position {position}"
    return f"{skip}, or start a new stream version: flash-compactor new-stream {args}" if restartable else skip


def check_against_stream(
    schema: pa.Schema, ref: SchemaReference, operation: str, source: str, table_id: str, partition: PartitionKeys,
    evolution: bool = False,
) -> None:
    """The strict check (schema evolution off, or a stream of deletes only so far). With ``evolution`` the first
    upsert of a deletes-only stream decides its schema: its key may be of a type that holds the deletes' keys."""
    reference = ref.columns
    deletes_only = ref.deletes_only
    where = f"table {table_id!r} partition {format_partition(partition)}"
    cols = columns_text(schema)
    for name, typ in cols.items():
        if evolution and deletes_only and operation == UPSERT and name in reference and reference[name] != typ:
            if not converts_text(reference[name], typ):
                raise SchemaConflict(
                    f"column {name!r} of {source} is {typ} but earlier delete deltas of {where} have "
                    f"{reference[name]} keys it cannot hold: write it as {reference[name]} or a wider type")
        elif name in reference and reference[name] != typ:
            raise SchemaConflict(
                f"column {name!r} of {source} is {typ} but earlier deltas of {where} have {reference[name]}: "
                f"cast it to {reference[name]} or start a new stream version"
            )
    if operation == DELETE or deletes_only:
        if operation == UPSERT:
            return
        unknown = sorted(set(cols) - set(reference))
        if unknown and not deletes_only:
            raise SchemaConflict(
                f"delete file {source} has columns {unknown} that {where} does not have: keep only primary key columns"
            )
        return
    missing = sorted(set(reference) - set(cols))
    extra = sorted(set(cols) - set(reference))
    if missing or extra:
        raise SchemaConflict(
            f"{source} does not match the columns of earlier deltas of {where}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else "")
            + ": write the same columns or start a new stream version"
        )
