"""``evolve --rename a=b`` / ``--drop c``: the schema changes no append brings on its own.

Each partition stream of the table gets a schema entry recording the change (schema_history.py, exclusive
create: an append racing it is checked against the winner), then an empty upsert delta under the new names.
The delta is the change's trace in the stream: sensors and triggers see it, merge-on-read reads the new names
at once, and the next compaction rewrites every file under them (schema_names.py maps the older deltas and
files; carried files would keep their old names, which Delta readers do not map). Key and sort key columns
are refused: the primary key index and the sort keys are recorded by name; ``new-stream --schema-from``
starts a stream with other keys. Every stream is checked before any is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.model import UPSERT, StreamVersion
from flash_pipeline.catalog.schema_history import claim_entry, latest_entry, name_changes
from flash_pipeline.catalog.validation import INTERNAL_COLUMNS
from flash_pipeline.errors import FlashError, SchemaConflict

FIX = ("to rename or drop a key, start a new stream version with the new schema "
       "(flash-compactor new-stream --schema-from FILE)")


@dataclass(frozen=True)
class SchemaEdit:
    """What one partition stream's schema became."""

    partition: PartitionKeys
    entry: int
    changes: str
    delta_position: int


def describe(renames: dict[str, str], drops: Sequence[str]) -> str:
    return ", ".join([f"renamed {a!r} to {b!r}" for a, b in renames.items()] + [f"dropped {c!r}" for c in drops])


def edited_schema(catalog: Any, table_id: str, partition: PartitionKeys, schema: pa.Schema, renames: dict[str, str],
                  drops: Sequence[str]) -> pa.Schema:
    """``schema`` with ``renames`` and ``drops`` applied, or a one-line SchemaConflict naming the column."""
    where = f"table {table_id!r} partition {format_partition(partition)}"
    keys = {n: "primary key" for c in catalog.compactions_of(table_id, partition) for n in c.primary_keys}
    keys.update({n: "sort key" for c in catalog.compactions_of(table_id, partition) for n, _ in c.sort_keys})
    for name in [*renames, *drops]:
        if name not in schema.names:
            raise SchemaConflict(f"{where} has no column {name!r} (its columns: {schema.names}); nothing was changed")
        if name in keys:
            raise SchemaConflict(f"column {name!r} of {where} is a {keys[name]}: {FIX}; nothing was changed")
    both = sorted(set(renames) & set(drops))
    if both:
        raise FlashError(f"column {both[0]!r} is both renamed and dropped: choose one; nothing was changed")
    after = [renames.get(n, n) for n in schema.names if n not in drops]
    clash = sorted({n for n in after if after.count(n) > 1} | (set(after) & INTERNAL_COLUMNS))
    if clash:
        raise SchemaConflict(f"renaming would give {where} two columns named {clash[0]!r} (or a reserved name): choose "
                             "another name; nothing was changed")
    if not after:
        raise SchemaConflict(f"dropping {list(drops)} would leave {where} without columns; nothing was changed")
    return pa.schema([schema.field(n).with_name(renames.get(n, n)) for n in schema.names if n not in drops],
                     metadata=schema.metadata)


def _stream_of(catalog: Any, table_id: str, partition: PartitionKeys) -> tuple[StreamVersion, tuple[int, pa.Schema]]:
    stream = catalog.active_stream(table_id, partition)
    latest = latest_entry(catalog, stream) if stream is not None else None
    if stream is None or latest is None:
        raise FlashError(f"table {table_id!r} partition {format_partition(partition)} has no upsert yet, so no columns "
                         "to rename or drop; nothing was changed")
    return stream, latest


def rename_and_drop(catalog: Any, table_id: str, renames: dict[str, str] | None = None, drops: Sequence[str] = (),
                    partitions: Sequence[Any] | None = None) -> list[SchemaEdit]:
    """Rename (``{old: new}``) and drop columns of every partition stream of ``table_id`` (or of ``partitions``).
    Refusals (an unknown column, a key, a clash) change nothing anywhere; each stream's change is then an entry
    in its schema history and an empty upsert delta under the new names."""
    renames, drops = dict(renames or {}), list(dict.fromkeys(drops))
    if not renames and not drops:
        raise FlashError("nothing to change: pass --rename OLD=NEW or --drop COLUMN")
    chosen = catalog.chosen_partitions(table_id, partitions)
    finished = {part: _finish_unfinished_edit(catalog, table_id, part) for part in chosen}
    # streams whose newest entry is this very change: the same command run again after it died part way
    change = describe(renames, drops)
    done = {part: edit for part, edit in finished.items() if edit is not None and edit.changes == change}
    for part in chosen:  # every stream checked before any changes
        if part not in done:
            edited_schema(catalog, table_id, part, _stream_of(catalog, table_id, part)[1][1], renames, drops)
    return [done[part] if part in done else _edit_stream(catalog, table_id, part, renames, drops) for part in chosen]


def _finish_unfinished_edit(catalog: Any, table_id: str, part: PartitionKeys) -> SchemaEdit | None:
    """The stream's newest schema entry when it renamed or dropped columns, its empty delta appended now if an
    ``evolve`` died before appending it (readers take names from the deltas: until then they kept the old
    ones). Forward recovery, as a compaction completes a Delta commit whose writer died."""
    stream = catalog.active_stream(table_id, part)
    latest = latest_entry(catalog, stream) if stream is not None else None
    if stream is None or latest is None:
        return None
    number, schema = latest
    edits = name_changes(catalog, stream, number - 1, number)
    if not edits:
        return None
    _, renames, drops = edits[0]
    positions = catalog.delta_positions(table_id, part, stream.version)  # one listing, then the newest manifest
    newest = (catalog.deltas(table_id, part, stream.version, after_position=positions[-1] - 1, include_skipped=True)
              if positions else [])
    if newest and newest[0].schema_entry >= number:
        return SchemaEdit(part, number, describe(renames, drops), newest[0].position)
    delta = catalog.append(table_id, part, UPSERT, [schema.empty_table()], schema_evolution=True)
    return SchemaEdit(part, number, describe(renames, drops), delta.position)


def _edit_stream(catalog: Any, table_id: str, part: PartitionKeys, renames: dict[str, str],
                 drops: list[str]) -> SchemaEdit:
    for _ in range(100):
        stream, (number, schema) = _stream_of(catalog, table_id, part)
        new = edited_schema(catalog, table_id, part, schema, renames, drops)
        if claim_entry(catalog, stream, number + 1, new, describe(renames, drops), renames, drops):
            delta = catalog.append(table_id, part, UPSERT, [new.empty_table()], schema_evolution=True)
            return SchemaEdit(part, number + 1, describe(renames, drops), delta.position)
    raise FlashError(f"could not record the schema change of table {table_id!r} [{format_partition(part)}]: run evolve "
                     "again")
