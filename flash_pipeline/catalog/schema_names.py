"""Files written under a column's old name, or holding a dropped column, read under the stream's newest names.

``evolve --rename a=b`` and ``--drop c`` are schema entries (schema_history.py) that record the change; every
delta and compacted version records the entry its files' names are in (``schema_entry``). Before compaction or
merge-on-read folds them, :func:`map_names` gives each delta and the base version recorded under an earlier
entry a *mapped* schema: the newest names, each field keeping the name its files have in the field metadata
``flash.physical_name``, dropped columns left out. The readers (``files.read_table``, the compactor's
``source_io.read_unit``) read the physical names and hand back the logical ones (:func:`physical_view`).
Nothing is read when everything at hand was recorded under one entry, as nearly always.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import pyarrow as pa

from flash_pipeline.catalog.model import CompactedVersion, Delta, StreamVersion, schema_from_b64, schema_to_b64
from flash_pipeline.catalog.physical_names import NAME_CHANGES, PHYSICAL
from flash_pipeline.catalog.schema_history import name_changes

Changes = Sequence[tuple[int, dict[str, str], tuple[str, ...]]]


def _current_names(names: Sequence[str], changes: Changes) -> dict[str, str]:
    """Newest name by physical name after ``changes`` in order (dropped columns left out)."""
    current = {n: n for n in names}
    for _, renames, drops in changes:
        current = {p: renames.get(c, c) for p, c in current.items() if c not in drops}
    return current


def mapped_schema(schema: pa.Schema, changes: Changes) -> pa.Schema:
    """``schema`` (a file's names) under the names after ``changes``, every field marked with its physical name."""
    current = _current_names(schema.names, changes)
    words = ([f"renamed {p!r} to {c!r}" for p, c in current.items() if p != c]
             + [f"dropped {p!r}" for p in schema.names if p not in current])
    return pa.schema([f.with_name(current[f.name]).with_metadata({PHYSICAL: f.name.encode()}) for f in schema
                      if f.name in current],
                     metadata={**(schema.metadata or {}), NAME_CHANGES: "\n".join(words).encode()})


@functools.lru_cache(maxsize=256)
def _mapped_b64(schema_b64: str, changes: tuple[tuple[int, tuple[tuple[str, str], ...], tuple[str, ...]], ...]) -> str:
    return schema_to_b64(mapped_schema(schema_from_b64(schema_b64), [(n, dict(r), d) for n, r, d in changes]))


def _map_columns(columns: Sequence[dict[str, str]], current: dict[str, str]) -> tuple[dict[str, str], ...]:
    return tuple({**c, "name": current[c["name"]]} for c in columns if c["name"] in current)


def _frozen(changes: Changes) -> tuple[tuple[int, tuple[tuple[str, str], ...], tuple[str, ...]], ...]:
    return tuple((n, tuple(sorted(r.items())), tuple(d)) for n, r, d in changes)


def map_names(catalog: Any, stream: StreamVersion | None, deltas: list[Delta],
              base: CompactedVersion | None) -> tuple[list[Delta], CompactedVersion | None]:
    """``deltas`` and ``base`` (of ``stream``) with the names of the newest entry among them: unchanged when they
    share one entry or no entry between renamed or dropped a column."""
    entries = {d.schema_entry for d in deltas} | ({base.schema_entry} if base is not None else set())
    if stream is None or len(entries) <= 1:
        return deltas, base
    changes = name_changes(catalog, stream, min(entries), max(entries))
    if not changes:
        return deltas, base
    newest = max(entries)

    def later(entry: int) -> Changes:
        return [c for c in changes if c[0] > entry]

    out = []
    for d in deltas:
        after = later(d.schema_entry)
        if after and d.arrow_schema:
            current = _current_names(d.pa_schema().names, after)
            d = dataclasses.replace(d, arrow_schema=_mapped_b64(d.arrow_schema, _frozen(after)),
                                    schema=_map_columns(d.schema, current), schema_entry=newest)
        out.append(d)
    if base is not None and base.arrow_schema and later(base.schema_entry):
        after = later(base.schema_entry)
        current = _current_names(base.pa_schema().names, after)
        files = tuple(dataclasses.replace(f, columns=tuple(current[c] for c in f.columns if c in current))
                      if f.columns else f for f in base.files)
        base = base.replace(arrow_schema=_mapped_b64(base.arrow_schema, _frozen(after)),
                            schema=_map_columns(base.schema, current), files=files, schema_entry=newest)
    return out, base


def changes_since(catalog: Any, stream: StreamVersion, version: CompactedVersion) -> Changes:
    """The renames and drops the stream recorded after ``version``'s entry (``evolve`` since its compaction): what
    ``new-stream`` must apply to the rows it carries, or the new stream would undo them (a dropped column's
    values back, a renamed one split in two)."""
    from flash_pipeline.catalog.schema_history import latest_entry

    latest = latest_entry(catalog, stream)
    if latest is None or latest[0] <= version.schema_entry:
        return []
    return name_changes(catalog, stream, version.schema_entry, latest[0])


def renamed_columns(table: pa.Table, changes: Changes) -> pa.Table:
    """``table`` (columns under a version's names) under the names after ``changes``, dropped columns left out."""
    if not changes:
        return table
    current = _current_names(table.column_names, changes)
    kept = [n for n in table.column_names if n in current]
    return table.select(kept).rename_columns([current[n] for n in kept])
