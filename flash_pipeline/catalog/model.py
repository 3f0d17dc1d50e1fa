"""The lake's vocabulary (paper, "Compactor I/O") as small immutable records stored as JSON."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flash_pipeline.catalog.deletion_vectors import DeletionVector
from flash_pipeline.catalog.encoding import PartitionKeys
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.json_fields import items, one_of, text, texts
from flash_pipeline.catalog.key_ranges import KeyRange

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


@functools.lru_cache(maxsize=256)
def schema_from_b64(text: str) -> pa.Schema:
    """Cached: a stream's thousands of small deltas usually share one schema (pa.Schema is immutable), and
    planning decodes each delta's twice."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def dumps(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


# ----- content checksums ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataFile:
    """A tabular file of a delta or of a compacted stream version."""

    file_number: int
    key: str
    rows: int
    bytes: int
    content_type: ContentType
    checksum: str = ""  # "sha256:<hex>" of the file's bytes at commit; "" in documents written before it existed
    # the file's dead rows (a compacted file carried with a deletion vector): ``rows`` stays the file's own count
    deletion_vector: DeletionVector | None = None
    # Parquet files the compactor wrote: the rows of each row group but the last (0: not recorded). A round splits
    # a prior file into units at row groups with it, without reading the file's footer (steps/source_io.py)
    row_group_rows: int = 0
    # compacted files: the range of the first primary key column in the file's rows (integer keys without nulls;
    # None otherwise, and in documents written before). A round skips the index files of compacted files whose
    # range misses its deltas' keys (catalog/key_ranges.py)
    key_range: KeyRange | None = None
    # a compacted file carried into a version whose schema gained columns since it was written: the version's
    # columns it has (the others read as null, catalog/schema_evolution.py); empty: every column of the version
    columns: tuple[str, ...] = ()

    @property
    def live_rows(self) -> int:
        """Rows a reader gets: the file's rows less those its deletion vector marks dead."""
        return self.rows - (self.deletion_vector.cardinality if self.deletion_vector is not None else 0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file_number": self.file_number,
            "key": self.key,
            "rows": self.rows,
            "bytes": self.bytes,
            "content_type": self.content_type.value,
        }
        if self.checksum:
            out["checksum"] = self.checksum
        if self.deletion_vector is not None:
            out["deletion_vector"] = self.deletion_vector.to_json()
        if self.row_group_rows:
            out["row_group_rows"] = self.row_group_rows
        if self.key_range is not None:
            out["key_range"] = self.key_range.to_json()
        if self.columns:
            out["columns"] = list(self.columns)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DataFile":
        dv = d.get("deletion_vector")
        kr = d.get("key_range")
        return cls(
            int(d["file_number"]), text(d, "key"), int(d["rows"]), int(d["bytes"]), ContentType(d["content_type"]),
            d.get("checksum", ""), DeletionVector.from_json(dv) if dv else None, int(d.get("row_group_rows", 0)),
            KeyRange.from_json(kr) if kr else None, tuple(d.get("columns", ())),
        )


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
    # the stream's schema entry (catalog/schema_history.py) its files were checked against: columns renamed or
    # dropped by a later entry (``evolve --rename/--drop``) map by it (catalog/schema_names.py)
    schema_entry: int = 0

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
            **_commit_fields(self),
            "schema_entry": self.schema_entry,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Delta":
        return cls(
            d["table_id"],
            _partition_from_json(d["partition"]),
            int(d["stream_version"]),
            int(d["position"]),
            one_of(d, "operation", OPERATIONS),
            tuple(DataFile.from_json(f) for f in items(d, "files")),
            tuple(dict(c) for c in items(d, "schema")),
            d["commit_id"],
            float(d["created_at"]),
            text(d, "arrow_schema", ""),
            int(d.get("schema_entry", 0)),
        )


def _commit_fields(doc: "Delta | CompactedVersion") -> dict[str, Any]:
    """What every committed manifest records: its files, column list, commit id and commit time."""
    return {"files": [f.to_json() for f in doc.files], "schema": list(doc.schema), "commit_id": doc.commit_id,
            "created_at": doc.created_at}


@dataclass(frozen=True)
class IndexFile:
    """One file of a primary key index bucket.

    ``first_file``/``last_file``: the compacted file numbers (in this version) its rows point to, first and
    last (0: not recorded, as in indexes written before). An index file whose compacted files were all carried
    into the next version is carried by reference too; if carrying renumbered those files, ``file_shift`` says
    by how much: a reader adds it to every row's stored file number (the file's bytes never change).

    ``dead_rows``: its rows that point at rows the version's deletion vectors mark dead, which every reader
    drops (compactor/index/dead_entries.py)."""

    key: str
    rows: int
    bytes: int
    checksum: str = ""  # as DataFile.checksum
    first_file: int = 0
    last_file: int = 0
    file_shift: int = 0
    dead_rows: int = 0

    @property
    def live_rows(self) -> int:
        return self.rows - self.dead_rows

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "rows": self.rows, "bytes": self.bytes}
        if self.checksum:
            out["checksum"] = self.checksum
        if self.first_file:
            out["first_file"], out["last_file"] = self.first_file, self.last_file
        out.update({k: v for k, v in (("file_shift", self.file_shift), ("dead_rows", self.dead_rows)) if v})
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "IndexFile":
        return cls(d["key"], int(d["rows"]), int(d["bytes"]), d.get("checksum", ""), int(d.get("first_file", 0)),
                   int(d.get("last_file", 0)), int(d.get("file_shift", 0)), int(d.get("dead_rows", 0)))


@dataclass(frozen=True)
class IndexVersion:
    """A primary key index version: fixed-width rows split into hash buckets (see compactor/pk_index.py)."""

    version: int
    hash_bucket_count: int
    sort_key_width: int
    buckets: tuple[tuple[IndexFile, ...], ...]

    @property
    def rows(self) -> int:  # dead entries included: what reading it costs (``live_rows``: one per live key)
        return sum(f.rows for files in self.buckets for f in files)

    @property
    def dead_rows(self) -> int:
        return sum(f.dead_rows for files in self.buckets for f in files)

    @property
    def live_rows(self) -> int:
        return self.rows - self.dead_rows

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
    # settings given at the first compaction that later runs inherit when not given again (like the keys):
    # rows_per_compacted_file, rows_per_primary_key_index_file
    options: dict[str, Any] = field(default_factory=dict)
    # published as a Delta table version too (catalog/deltalake_table.py): visible once its Delta commit exists
    delta_log: bool = False
    # the source stream's schema entry whose column names the files have (as Delta.schema_entry)
    schema_entry: int = 0

    def pa_schema(self) -> pa.Schema:
        return schema_from_b64(self.arrow_schema)

    @property
    def rows(self) -> int:
        """Rows a reader gets (deletion vectors applied): one per primary key, the index's size."""
        return sum(f.live_rows for f in self.files)

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
            "index": self.index.to_json() if self.index else None,
            **_commit_fields(self),
            "data_change": self.data_change,
            "rows": self.rows,
            "bytes": self.bytes,
            "stats": self.stats,
            "arrow_schema": self.arrow_schema,
            "options": self.options,
            "delta_log": self.delta_log,
            "schema_entry": self.schema_entry,
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
            texts(d, "primary_keys"),
            tuple((s[0], s[1]) for s in items(d, "sort_keys")),
            ContentType(d["content_type"]),
            tuple(DataFile.from_json(f) for f in items(d, "files")),
            IndexVersion.from_json(d["index"]) if d.get("index") else None,
            tuple(dict(c) for c in items(d, "schema")),
            d["commit_id"],
            float(d["created_at"]),
            bool(d.get("data_change", True)),
            dict(d.get("stats", {})),
            text(d, "arrow_schema", ""),
            dict(d.get("options", {})),
            bool(d.get("delta_log", False)),
            int(d.get("schema_entry", 0)),
        )

    def replace(self, **changes: Any) -> "CompactedVersion":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Pending:
    """The deltas of a partition's active stream that wait for compaction (:meth:`Catalog.pending`).

    ``base`` is the compacted version a compaction builds on: the latest one when it covers the active stream
    (same source table, same stream version), else None (the stream is compacted from its start; ``notes``
    say why). ``deltas`` are the active stream's unskipped deltas after ``base.last_position``."""

    stream: StreamVersion | None
    latest: CompactedVersion | None
    base: CompactedVersion | None
    deltas: list[Delta]
    notes: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(d.rows for d in self.deltas)
