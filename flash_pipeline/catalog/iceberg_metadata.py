"""Iceberg format version 2 metadata of one compacted version: its manifests, manifest list and table metadata.

Pure functions of the compacted version and the previous Iceberg table metadata, so any writer (the compaction
that committed the version, or the next one completing its publication) derives the same bytes
(iceberg_table.py writes them). Layout per the Iceberg table spec (apache/iceberg format/spec.md): one data
manifest listing every live file of the version (new files ``ADDED`` by this snapshot, carried ones
``EXISTING``), and, when files carry deletion vectors, one position delete file with a delete manifest. The
snapshot id and sequence number of compacted version ``v`` are ``v``, so time travel by snapshot id is time
travel by compacted version.
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

from flash_pipeline.catalog import avro_files

METADATA_LOG_MAX = 100  # previous metadata files a table's metadata lists (Iceberg's default)
# the reserved field ids of a position delete file's columns (spec: "Position Delete Files")
POS_DELETE_PATH_ID = 2147483546
POS_DELETE_POS_ID = 2147483545


def _field(name: str, ftype: Any, fid: int, optional: bool = False) -> dict[str, Any]:
    return {"name": name, "type": ["null", ftype] if optional else ftype, "field-id": fid,
            **({"default": None} if optional else {})}


def _int_map(name: str, value: str, fid: int, kid: int, vid: int) -> dict[str, Any]:
    """Iceberg's map with non-string keys: an Avro array of key/value records (logicalType map)."""
    record = {"type": "record", "name": f"k{kid}_v{vid}",
              "fields": [_field("key", "int", kid), _field("value", value, vid)]}
    return _field(name, {"type": "array", "items": record, "logicalType": "map"}, fid, optional=True)


DATA_FILE_SCHEMA = {
    "type": "record", "name": "r2", "fields": [
        _field("content", "int", 134),
        _field("file_path", "string", 100),
        _field("file_format", "string", 101),
        _field("partition", {"type": "record", "name": "r102", "fields": []}, 102),
        _field("record_count", "long", 103),
        _field("file_size_in_bytes", "long", 104),
        _int_map("column_sizes", "long", 108, 117, 118),
        _int_map("value_counts", "long", 109, 119, 120),
        _int_map("null_value_counts", "long", 110, 121, 122),
        _int_map("nan_value_counts", "long", 137, 138, 139),
        _int_map("lower_bounds", "bytes", 125, 126, 127),
        _int_map("upper_bounds", "bytes", 128, 129, 130),
        _field("key_metadata", "bytes", 131, optional=True),
        _field("split_offsets", {"type": "array", "items": "long", "element-id": 133}, 132, optional=True),
        _field("equality_ids", {"type": "array", "items": "int", "element-id": 136}, 135, optional=True),
        _field("sort_order_id", "int", 140, optional=True),
    ],
}
MANIFEST_ENTRY_SCHEMA = {
    "type": "record", "name": "manifest_entry", "fields": [
        _field("status", "int", 0),
        _field("snapshot_id", "long", 1, optional=True),
        _field("sequence_number", "long", 3, optional=True),
        _field("file_sequence_number", "long", 4, optional=True),
        _field("data_file", DATA_FILE_SCHEMA, 2),
    ],
}
MANIFEST_FILE_SCHEMA = {
    "type": "record", "name": "manifest_file", "fields": [
        _field("manifest_path", "string", 500),
        _field("manifest_length", "long", 501),
        _field("partition_spec_id", "int", 502),
        _field("content", "int", 517),
        _field("sequence_number", "long", 515),
        _field("min_sequence_number", "long", 516),
        _field("added_snapshot_id", "long", 503),
        _field("added_files_count", "int", 504),
        _field("existing_files_count", "int", 505),
        _field("deleted_files_count", "int", 506),
        _field("added_rows_count", "long", 512),
        _field("existing_rows_count", "long", 513),
        _field("deleted_rows_count", "long", 514),
        _field("key_metadata", "bytes", 519, optional=True),
    ],
}


def file_entry(path: str, rows: int, size: int, added: bool, snapshot: int, sequence: int,
               content: int = 0, stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """A manifest entry: status 1 (added by ``snapshot``) or 0 (existing since ``snapshot``/``sequence``);
    ``stats``: its column statistics maps (iceberg_stats.py)."""
    return {
        "status": 1 if added else 0, "snapshot_id": snapshot, "sequence_number": sequence,
        "file_sequence_number": sequence,
        "data_file": {"content": content, "file_path": path, "file_format": "PARQUET", "partition": {},
                      "record_count": rows, "file_size_in_bytes": size, **(stats or {})},
    }


def manifest(entries: list[dict[str, Any]], schema: dict[str, Any], content: str) -> bytes:
    """A manifest file (``content``: "data" or "deletes") of an unpartitioned table."""
    meta = {"schema": json.dumps(schema, separators=(",", ":")), "schema-id": str(schema["schema-id"]),
            "partition-spec": "[]", "partition-spec-id": "0", "format-version": "2", "content": content}
    return avro_files.container(MANIFEST_ENTRY_SCHEMA, entries, meta)


def manifest_list_entry(path: str, length: int, entries: list[dict[str, Any]], snapshot: int,
                        content: int) -> dict[str, Any]:
    """The manifest list's record of one manifest written by ``snapshot`` (counts from its entries)."""
    def count(status: int) -> int:
        return sum(1 for e in entries if e["status"] == status)

    def rows(status: int) -> int:
        return sum(e["data_file"]["record_count"] for e in entries if e["status"] == status)

    return {
        "manifest_path": path, "manifest_length": length, "partition_spec_id": 0, "content": content,
        "sequence_number": snapshot, "min_sequence_number": min((e["sequence_number"] for e in entries),
                                                                default=snapshot),
        "added_snapshot_id": snapshot, "added_files_count": count(1), "existing_files_count": count(0),
        "deleted_files_count": count(2), "added_rows_count": rows(1), "existing_rows_count": rows(0),
        "deleted_rows_count": rows(2),
    }


def manifest_list(records: list[dict[str, Any]], snapshot: int, parent: int | None) -> bytes:
    meta = {"snapshot-id": str(snapshot), "parent-snapshot-id": str(parent) if parent is not None else "null",
            "sequence-number": str(snapshot), "format-version": "2"}
    return avro_files.container(MANIFEST_FILE_SCHEMA, records, meta)


def table_uuid(table_id: str, partition: Any) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"flash-compactor-iceberg:{table_id}:{json.dumps(partition)}"))


def table_metadata(previous: dict[str, Any] | None, table: dict[str, Any], schema: dict[str, Any],
                   last_column_id: int, mapping: list[dict[str, Any]], snapshot: dict[str, Any],
                   metadata_location_of_previous: str | None) -> dict[str, Any]:
    """Table metadata after adding ``snapshot`` (its id = the compacted version) to ``previous``; ``table`` holds
    what does not change: ``table-uuid``, ``location`` and ``properties``."""
    schemas = list(previous["schemas"]) if previous else []
    same = next((s for s in schemas if s["fields"] == schema["fields"]), None)
    if same is None:
        schema = {**schema, "schema-id": max((s["schema-id"] for s in schemas), default=-1) + 1}
        schemas.append(schema)
    else:
        schema = same
    snapshot = {**snapshot, "schema-id": schema["schema-id"]}
    snapshots = [*(previous["snapshots"] if previous else []), snapshot]
    metadata_log = list(previous["metadata-log"]) if previous else []
    if previous and metadata_location_of_previous:
        metadata_log.append({"timestamp-ms": previous["last-updated-ms"],
                             "metadata-file": metadata_location_of_previous})
    return {
        "format-version": 2,
        "table-uuid": table["table-uuid"],
        "location": table["location"],
        "last-sequence-number": snapshot["sequence-number"],
        "last-updated-ms": snapshot["timestamp-ms"],
        "last-column-id": max(last_column_id, previous["last-column-id"] if previous else 0),
        "current-schema-id": schema["schema-id"],
        "schemas": schemas,
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {**table["properties"],
                       "schema.name-mapping.default": json.dumps(mapping, separators=(",", ":"))},
        "current-snapshot-id": snapshot["snapshot-id"],
        "refs": {"main": {"snapshot-id": snapshot["snapshot-id"], "type": "branch"}},
        "snapshots": snapshots,
        "snapshot-log": [*(previous["snapshot-log"] if previous else []),
                         {"timestamp-ms": snapshot["timestamp-ms"], "snapshot-id": snapshot["snapshot-id"]}],
        "metadata-log": metadata_log,
    }


def expire(meta: dict[str, Any], live: set[int]) -> dict[str, Any]:
    """Keep the snapshots of ``live`` compacted versions (the others were expired by retention: their files may
    be gone) and the current one, and at most METADATA_LOG_MAX metadata-log entries."""
    current = meta["current-snapshot-id"]
    keep = [s for s in meta["snapshots"] if s["snapshot-id"] in live or s["snapshot-id"] == current]
    kept = {s["snapshot-id"] for s in keep}
    return {**meta, "snapshots": keep, "snapshot-log": [e for e in meta["snapshot-log"] if e["snapshot-id"] in kept],
            "metadata-log": meta["metadata-log"][-METADATA_LOG_MAX:]}


def metadata_bytes(meta: dict[str, Any]) -> bytes:
    """Table metadata as compact JSON: json's C encoder (indented output takes its pure-Python path, 20x slower on
    a history of hundreds of snapshots; the metadata lists every retained one)."""
    return json.dumps(meta, separators=(",", ":")).encode()


def position_delete_file(path: str, dead: Any) -> bytes:
    """A position delete file (spec "Position Delete Files"): ``file_path`` and ``pos`` with their reserved
    field ids, sorted by position; deterministic bytes for equal input."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flash_pipeline.catalog.arrow_arrays import indices_array

    schema = pa.schema([
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(POS_DELETE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_DELETE_POS_ID)}),
    ])
    positions = indices_array(np.asarray(dead, dtype=np.int64))
    table = pa.table([pa.array([path] * len(dead), pa.string()), positions], schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", store_schema=False)
    return sink.getvalue()
