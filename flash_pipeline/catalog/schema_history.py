"""A partition stream's schema history: entry 0 is ``schema.json``, claimed by the stream's first upsert; every
change a later append brings (catalog/schema_evolution.py) is the next entry, ``schemas/<n:06d>.json``, claimed
by an exclusive create, so of two appends that evolve the stream differently at once exactly one wins and the
other is checked again against the winner. An entry is written before its delta commits and never removed:
an append that dies in between leaves an entry no delta needed, whose added column every reader sees as null.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Sequence

import pyarrow as pa

from flash_pipeline.catalog.files import schema_to_json
from flash_pipeline.catalog.model import FORMAT_VERSION, StreamVersion, dumps, schema_from_b64, schema_to_b64
from flash_pipeline.errors import NotFound

ENTRY_DIGITS = 6


def entry_key(stream_prefix: str, number: int) -> str:
    return f"{stream_prefix}/schema.json" if number == 0 else f"{stream_prefix}/schemas/{number:0{ENTRY_DIGITS}d}.json"


def latest_entry(catalog: Any, stream: StreamVersion) -> tuple[int, pa.Schema] | None:
    """(number, schema) of the stream's newest schema entry (one listing and one read), None before any upsert
    (or for a stream older than schema documents)."""
    prefix = catalog.stream_prefix(stream.table_id, stream.partition, stream.version)
    numbers = [int(n[:-5]) for n in catalog.storage.list_children(f"{prefix}/schemas")
               if n.endswith(".json") and n[:-5].isdigit()]
    for number in sorted(numbers, reverse=True) + [0]:
        try:
            return number, catalog._read_json(entry_key(prefix, number), lambda d: schema_from_b64(d["arrow_schema"]))
        except NotFound:
            continue
    return None


def history(catalog: Any, stream: StreamVersion) -> list[dict[str, Any]]:
    """Every entry's document, oldest first (``show`` and the docs' audit trail)."""
    prefix = catalog.stream_prefix(stream.table_id, stream.partition, stream.version)
    numbers = sorted(int(n[:-5]) for n in catalog.storage.list_children(f"{prefix}/schemas")
                     if n.endswith(".json") and n[:-5].isdigit())
    out = []
    for number in [0, *numbers]:
        try:
            doc = catalog._read_json(entry_key(prefix, number))
        except NotFound:
            continue
        out.append({"entry": number, "columns": doc.get("schema"), "changes": doc.get("changes", ""),
                    "created_at": doc.get("created_at")})
    return out


def name_changes(catalog: Any, stream: StreamVersion, after: int,
                 through: int) -> list[tuple[int, dict[str, str], tuple[str, ...]]]:
    """(entry, renames, drops) of entries ``after+1 .. through`` that renamed or dropped columns, oldest first: one
    read per entry, done only when the deltas or versions at hand were recorded under different entries."""
    prefix = catalog.stream_prefix(stream.table_id, stream.partition, stream.version)
    out = []
    for number in range(max(after, 0) + 1, through + 1):
        try:
            doc = catalog._read_json(entry_key(prefix, number))
        except NotFound:
            continue
        if doc.get("renames") or doc.get("drops"):
            out.append((number, dict(doc.get("renames", {})), tuple(doc.get("drops", ()))))
    return out


def schema_changes(catalog: Any, stream: StreamVersion) -> list[dict[str, Any]]:
    """The entries after the first (each a change an append brought), oldest first: one listing when there are
    none, as for nearly every stream."""
    prefix = catalog.stream_prefix(stream.table_id, stream.partition, stream.version)
    if not any(n.endswith(".json") for n in catalog.storage.list_children(f"{prefix}/schemas")):
        return []
    return [e for e in history(catalog, stream) if e["entry"] > 0]


def claim_entry(catalog: Any, stream: StreamVersion, number: int, schema: pa.Schema, changes: str,
                renames: dict[str, str] | None = None, drops: Sequence[str] = ()) -> bool:
    """Exclusive-create entry ``number`` (>= 1); False when another writer claimed it first. ``renames`` (old
    name -> new) and ``drops`` record an ``evolve --rename/--drop``: files checked against an earlier entry map
    their columns by them (catalog/schema_names.py)."""
    doc = {
        "format": FORMAT_VERSION, "table_id": stream.table_id, "partition": [[n, v] for n, v in stream.partition],
        "stream_version": stream.version, "entry": number, "schema": schema_to_json(schema),
        "arrow_schema": schema_to_b64(schema), "changes": changes, "commit_id": uuid.uuid4().hex,
        "created_at": time.time(), **({"renames": dict(renames)} if renames else {}),
        **({"drops": list(drops)} if drops else {}),
    }
    prefix = catalog.stream_prefix(stream.table_id, stream.partition, stream.version)
    return bool(catalog.storage.create(entry_key(prefix, number), dumps(doc)))


# ----- the table option: schema evolution on (the default) or off (every delta must match the stream's schema) --
def _setting_key(catalog: Any, table_id: str) -> str:
    return f"{catalog.table_prefix(table_id)}/settings/schema_evolution.json"


def schema_evolution_enabled(catalog: Any, table_id: str) -> bool:
    """The table's option (``flash-compactor evolve --schema-evolution on|off``); on when never set. Read only by
    an append whose columns differ from the stream's, so matching appends pay nothing for it."""
    try:
        return bool(catalog._read_json(_setting_key(catalog, table_id)).get("schema_evolution", True))
    except NotFound:
        return True


def set_schema_evolution(catalog: Any, table_id: str, enabled: bool) -> None:
    """Set the table's option (a setting, not a commit: the last writer's value holds)."""
    catalog.require_table(table_id)
    catalog.storage.write(_setting_key(catalog, table_id),
                          dumps({"table_id": table_id, "schema_evolution": enabled, "set_at": time.time()}))
