"""Column statistics of a data file as its Iceberg manifest entry records them: sizes, value and null counts, and
lower and upper bounds, keyed by field id, so engines that plan from Iceberg metadata (Trino, Spark, DuckDB,
pyiceberg) skip files whose range misses a filter.

Read from the Parquet footer once, when a file first enters an Iceberg snapshot; a file carried into the next
snapshot keeps the entry of the previous manifest (iceberg_table.py), so a commit reads the footers of the files
it adds, not of every live file. Bounds are written for the types whose Parquet statistics order matches
Iceberg's and whose encoding is exact (spec, Appendix D "Single-value serialization"): boolean, signed integers,
date, microsecond timestamps, decimal and string (truncated to 16 characters, as Iceberg's default
``truncate(16)`` metrics mode). Floating-point columns get counts but no bounds: Parquet's min/max skip NaN, which
Iceberg's bounds require counting apart. A bound that cannot be written is left out, which readers take as
"unknown".
"""

from __future__ import annotations

import os
import struct
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from flash_pipeline.catalog import avro_files
from flash_pipeline.errors import NotFound

if TYPE_CHECKING:
    from flash_pipeline.catalog.model import DataFile
    from flash_pipeline.catalog.storage import Storage

TRUNCATE = 16  # characters of a string bound (Iceberg's default metrics mode, truncate(16))
STAT_FIELDS = ("column_sizes", "value_counts", "null_value_counts", "lower_bounds", "upper_bounds")


def file_stats(meta: Any, ids: dict[str, int], types: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The manifest entry's statistics maps of a Parquet file (``meta``: its ``pyarrow.parquet.FileMetaData``)
    for the columns ``ids`` names (file column name -> field id; ``types``: file column name -> Iceberg type)."""
    out: dict[str, dict[int, Any]] = {name: {} for name in STAT_FIELDS}
    for i in range(meta.num_columns):
        name = meta.schema.column(i).path
        fid = ids.get(name)
        if fid is None or "." in name:
            continue
        chunks = [meta.row_group(g).column(i) for g in range(meta.num_row_groups)]
        out["column_sizes"][fid] = sum(c.total_compressed_size for c in chunks)
        out["value_counts"][fid] = sum(c.num_values for c in chunks)
        stats = [c.statistics for c in chunks]
        if all(s is not None and s.has_null_count for s in stats):
            out["null_value_counts"][fid] = sum(s.null_count for s in stats)
        column = meta.schema.column(i)
        unsigned = '"isSigned":false' in column.logical_type.to_json().replace(" ", "")
        bounds = None if unsigned else _bounds(stats, types.get(name, ""), column.physical_type)
        if bounds is not None:
            lower, upper = bounds
            if lower is not None:
                out["lower_bounds"][fid] = lower
            if upper is not None:
                out["upper_bounds"][fid] = upper
    return {name: [{"key": k, "value": v} for k, v in sorted(m.items())] for name, m in out.items()}


def _bounds(stats: list[Any], kind: str, physical: str) -> tuple[bytes | None, bytes | None] | None:
    """(lower, upper) serialized for ``kind`` over the row groups' statistics; None when not exact or not
    comparable the way Iceberg compares (a row group of only nulls has no min/max and bounds nothing)."""
    if not stats or any(s is None for s in stats):
        return None
    ranged = [s for s in stats if s.has_min_max]
    if not ranged:
        return None
    if any(s.num_values > 0 and not s.has_min_max for s in stats):  # values, but no min/max written
        return None
    if kind == "boolean" and physical == "BOOLEAN":
        lo, hi = min(bool(s.min_raw) for s in ranged), max(bool(s.max_raw) for s in ranged)
        return bytes([lo]), bytes([hi])
    if (kind in ("int", "date") and physical == "INT32") or (kind in ("long", "timestamp", "timestamptz")
                                                            and physical in ("INT32", "INT64")):
        fmt = "<i" if kind in ("int", "date") else "<q"
        return (struct.pack(fmt, min(int(s.min_raw) for s in ranged)),
                struct.pack(fmt, max(int(s.max_raw) for s in ranged)))
    if kind.startswith("decimal("):
        scale = int(kind[:-1].split(",")[1])
        lows = [s.min for s in ranged]
        highs = [s.max for s in ranged]
        if not all(isinstance(v, Decimal) for v in lows + highs):
            return None
        return _decimal(min(lows), scale), _decimal(max(highs), scale)
    if kind == "string" and physical == "BYTE_ARRAY":
        lows = [s.min_raw for s in ranged]
        highs = [s.max_raw for s in ranged]
        if not all(isinstance(v, bytes) for v in lows + highs):
            return None
        return _truncated_lower(min(lows)), _truncated_upper(max(highs))
    return None


def _decimal(value: Decimal, scale: int) -> bytes:
    """Iceberg's decimal bound: the unscaled value, two's complement big-endian in the fewest bytes."""
    unscaled = int(value.scaleb(scale))
    return unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)


def _truncated_lower(raw: bytes) -> bytes:
    """The first TRUNCATE characters: a prefix is never greater than the value."""
    return raw.decode("utf-8", "replace")[:TRUNCATE].encode() if len(raw) > TRUNCATE else raw


def _truncated_upper(raw: bytes) -> bytes | None:
    """The first TRUNCATE characters with the last one incremented (no smaller than the value), None when every
    character is the largest code point."""
    text = raw.decode("utf-8", "surrogatepass")
    if len(text) <= TRUNCATE:
        return raw
    head = list(text[:TRUNCATE])
    while head:
        point = ord(head[-1]) + 1
        if point == 0xD800:  # surrogates are not characters
            point = 0xE000
        if point <= 0x10FFFF:
            head[-1] = chr(point)
            return "".join(head).encode()
        head.pop()
    return None


def widened(entry_stats: dict[str, Any], before: dict[int, str], after: dict[int, str]) -> dict[str, Any]:
    """A carried entry's statistics under the current schema: bounds of a column widened from int to long
    re-serialized as long, bounds of any other type change dropped (counts stay: they do not depend on type)."""
    changed = {fid for fid, kind in after.items() if fid in before and before[fid] != kind}
    if not changed:
        return entry_stats
    out = dict(entry_stats)
    for name in ("lower_bounds", "upper_bounds"):
        kept = []
        for pair in entry_stats.get(name) or []:
            fid = pair["key"]
            if fid not in changed:
                kept.append(pair)
            elif before[fid] == "int" and after[fid] == "long":
                kept.append({"key": fid, "value": struct.pack("<q", struct.unpack("<i", pair["value"])[0])})
        out[name] = kept
    return out


def carried_stats(storage: "Storage", previous: dict[str, Any] | None, schema: dict[str, Any],
                  manifests: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The column statistics of the previous snapshot's live data files by path, from its data manifests (those
    at ``manifests``, default all: a few small reads instead of a footer per file), under ``schema``'s types;
    empty when unreadable (the files' footers are read instead)."""
    if previous is None:
        return {}
    snapshot = next((s for s in previous["snapshots"] if s["snapshot-id"] == previous["current-snapshot-id"]), None)
    try:
        assert snapshot is not None
        if manifests is None:
            _, listed = avro_files.read_container(storage.read(lake_key(storage.uri, snapshot["manifest-list"])))
            manifests = [m["manifest_path"] for m in listed if m["content"] == 0]
        entries = [e for m in manifests for e in avro_files.read_container(storage.read(lake_key(storage.uri, m)))[1]]
    except (AssertionError, NotFound, ValueError, KeyError, IndexError):
        return {}
    before = {f["id"]: f["type"] for s in previous["schemas"] if s["schema-id"] == previous["current-schema-id"]
              for f in s["fields"]}
    after = {f["id"]: f["type"] for f in schema["fields"]}
    return {e["data_file"]["file_path"]: widened({k: e["data_file"].get(k) or [] for k in STAT_FIELDS}, before, after)
            for e in entries if e["status"] != 2}


def footer_stats(storage: "Storage", f: "DataFile", mapping: list[dict[str, Any]],
                 schema: dict[str, Any]) -> dict[str, Any]:
    """A file's column statistics from its Parquet footer (one ranged read), its columns found by the name mapping
    (a file may hold a column under an earlier name)."""
    from flash_pipeline.catalog.files import ContentType
    from flash_pipeline.catalog.parquet_footers import read_footer

    if f.content_type is not ContentType.PARQUET:
        return {}
    types = {fd["id"]: fd["type"] for fd in schema["fields"]}
    ids = {name: e["field-id"] for e in mapping for name in e["names"] if e["field-id"] in types}
    meta = read_footer(storage, f.key, f.bytes)
    return file_stats(meta, ids, {name: types[fid] for name, fid in ids.items()})


def lake_key(base: str, uri: str) -> str:
    """The lake key of a location in lake ``base``; NotFound for one outside it (metadata written where the lake
    was before it was copied or moved: Iceberg records absolute locations)."""
    base = base.rstrip("/")
    if uri.startswith("s3://"):
        if not uri.startswith(base + "/"):
            raise NotFound(f"{uri} is not in lake {base}")
        return uri[len(base) + 1:]
    relative = os.path.relpath(uri, base)
    if relative.startswith(".."):
        raise NotFound(f"{uri} is not in lake {base}")
    return "/".join(relative.split(os.sep))
