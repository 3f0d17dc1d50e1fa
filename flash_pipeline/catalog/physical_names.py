"""The names a file's columns have on disk, where they differ from the stream's (``evolve --rename/--drop``).

A mapped schema (catalog/schema_names.py) carries, on each field, the name its files were written with; the
readers read those and hand back the stream's names. A leaf module: the file readers import it.
"""

from __future__ import annotations

import pyarrow as pa

PHYSICAL = b"flash.physical_name"
NAME_CHANGES = b"flash.name_changes"  # on a mapped schema: its renames and drops in words (for the run's report)


def physical_view(schema: pa.Schema | None) -> tuple[pa.Schema, dict[str, str]] | None:
    """(the schema under the names its files have, without metadata; logical name by physical name) of a mapped
    schema, or None for one that is not mapped (the common case: read by name as it is)."""
    if schema is None or not any(f.metadata and PHYSICAL in f.metadata for f in schema):
        return None
    fields, logical = [], {}
    for f in schema:
        physical = f.metadata[PHYSICAL].decode() if f.metadata and PHYSICAL in f.metadata else f.name
        fields.append(f.with_name(physical).remove_metadata())
        logical[physical] = f.name
    return pa.schema(fields), logical


def plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the physical names (what a compacted version records and writes)."""
    if physical_view(schema) is None and not (schema.metadata and NAME_CHANGES in schema.metadata):
        return schema
    metadata = {k: v for k, v in (schema.metadata or {}).items() if k != NAME_CHANGES} or None
    return pa.schema([f.remove_metadata() if f.metadata and PHYSICAL in f.metadata else f for f in schema],
                     metadata=metadata)


def name_changes_of(schema: pa.Schema) -> list[str]:
    """The renames and drops a mapped schema went through, in words ("renamed 'a' to 'b'", "dropped 'c'")."""
    text = (schema.metadata or {}).get(NAME_CHANGES, b"").decode()
    return text.split("\n") if text else []
