"""The lake's vocabulary (paper, "Compactor I/O") as small immutable records stored as JSON."""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flash_pipeline.catalog.encoding import PartitionKeys
from flash_pipeline.catalog.files import ContentType

FORMAT_VERSION = 1

UPSERT = "upsert"
DELETE = "delete"
OPERATIONS = (UPSERT, DELETE)

ACTIVE = "active"
UNRELEASED = "unreleased"
DEPRECATED = "deprecated"
LIFECYCLE_STATES = (ACTIVE, UNRELEASED, DEPRECATED)


def _partition_to_json(partition: PartitionKeys) -> list[list[str | None]]:
    return [[name, value] for name, value in partition]


def _partition_from_json(data: list[list[str | None]]) -> PartitionKeys:
    return tuple((str(name), value) for name, value in data)


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def dumps(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class DataFile:
    """A tabular file of a delta or of a compacted stream version."""

    file_number: int
    key: str
    rows: int
    bytes: int
    content_type: ContentType

    def to_json(self) -> dict[str, Any]:
        return {
            "file_number": self.file_number,
            "key": self.key,
            "rows": self.rows,
            "bytes": self.bytes,
            "content_type": self.content_type.value,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DataFile":
        return cls(int(d["file_number"]), d["key"], int(d["rows"]), int(d["bytes"]), ContentType(d["content_type"]))


@dataclass(frozen=True)
class StreamVersion:
    table_id: str
    partition: PartitionKeys
    version: int
    state: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "table_id": self.table_id,
            "partition": _partition_to_json(self.partition),
            "version": self.version,
            "state": self.state,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "StreamVersion":
        return cls(d["table_id"], _partition_from_json(d["partition"]), int(d["version"]), d["state"])


@dataclass(frozen=True)
class Delta:
    """One committed delta: all its files at one stream position, one operation type."""

    table_id: str
    partition: PartitionKeys
    stream_version: int
    position: int
    operation: str
    files: tuple[DataFile, ...]
    schema: tuple[dict[str, str], ...]
    commit_id: str
    created_at: float
    arrow_schema: str = ""  # base64 of the Arrow IPC schema, exact types for readers and validation

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def pa_schema(self) -> "pa.Schema":
        return schema_from_b64(self.arrow_schema)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "arrow_schema": self.arrow_schema,
            "table_id": self.table_id,
            "partition": _partition_to_json(self.partition),
            "stream_version": self.stream_version,
            "position": self.position,
            "operation": self.operation,
            "files": [f.to_json() for f in self.files],
            "schema": list(self.schema),
            "commit_id": self.commit_id,
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Delta":
        return cls(
            d["table_id"],
            _partition_from_json(d["partition"]),
            int(d["stream_version"]),
            int(d["position"]),
            d["operation"],
            tuple(DataFile.from_json(f) for f in d["files"]),
            tuple(d["schema"]),
            d["commit_id"],
            float(d["created_at"]),
            d.get("arrow_schema", ""),
        )


@dataclass(frozen=True)
class IndexFile:
    key: str
    rows: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "rows": self.rows, "bytes": self.bytes}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "IndexFile":
        return cls(d["key"], int(d["rows"]), int(d["bytes"]))


@dataclass(frozen=True)
class IndexVersion:
    """A primary key index version: fixed-width rows split into hash buckets (see compactor/pk_index.py)."""

    version: int
    hash_bucket_count: int
    sort_key_width: int
    buckets: tuple[tuple[IndexFile, ...], ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for files in self.buckets for f in files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for files in self.buckets for f in files)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "hash_bucket_count": self.hash_bucket_count,
            "sort_key_width": self.sort_key_width,
            "buckets": [[f.to_json() for f in files] for files in self.buckets],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "IndexVersion":
        return cls(
            int(d["version"]),
            int(d["hash_bucket_count"]),
            int(d["sort_key_width"]),
            tuple(tuple(IndexFile.from_json(f) for f in files) for files in d["buckets"]),
        )


@dataclass(frozen=True)
class CompactedVersion:
    """A compacted partition stream version: the commit point of a compaction round.

    Its files hold, in file-number order, every surviving row of the source partition stream up to and
    including ``last_position``; ``index`` is the primary key index whose pointers address these files.
    """

    table_id: str
    partition: PartitionKeys
    version: int
    source_table_id: str
    source_stream_version: int
    last_position: int
    primary_keys: tuple[str, ...]
    sort_keys: tuple[tuple[str, str], ...]
    content_type: ContentType
    files: tuple[DataFile, ...]
    index: IndexVersion | None
    schema: tuple[dict[str, str], ...]
    commit_id: str
    created_at: float
    data_change: bool = True
    stats: dict[str, Any] = field(default_factory=dict)
    arrow_schema: str = ""

    def pa_schema(self) -> pa.Schema:
        return schema_from_b64(self.arrow_schema)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "table_id": self.table_id,
            "partition": _partition_to_json(self.partition),
            "version": self.version,
            "source_table_id": self.source_table_id,
            "source_stream_version": self.source_stream_version,
            "last_position": self.last_position,
            "primary_keys": list(self.primary_keys),
            "sort_keys": [list(s) for s in self.sort_keys],
            "content_type": self.content_type.value,
            "files": [f.to_json() for f in self.files],
            "index": self.index.to_json() if self.index else None,
            "schema": list(self.schema),
            "commit_id": self.commit_id,
            "created_at": self.created_at,
            "data_change": self.data_change,
            "rows": self.rows,
            "bytes": self.bytes,
            "stats": self.stats,
            "arrow_schema": self.arrow_schema,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CompactedVersion":
        return cls(
            d["table_id"],
            _partition_from_json(d["partition"]),
            int(d["version"]),
            d["source_table_id"],
            int(d["source_stream_version"]),
            int(d["last_position"]),
            tuple(d["primary_keys"]),
            tuple((s[0], s[1]) for s in d["sort_keys"]),
            ContentType(d["content_type"]),
            tuple(DataFile.from_json(f) for f in d["files"]),
            IndexVersion.from_json(d["index"]) if d.get("index") else None,
            tuple(d["schema"]),
            d["commit_id"],
            float(d["created_at"]),
            bool(d.get("data_change", True)),
            dict(d.get("stats", {})),
            d.get("arrow_schema", ""),
        )

    def replace(self, **changes: Any) -> "CompactedVersion":
        return dataclasses.replace(self, **changes)
