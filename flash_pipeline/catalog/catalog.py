"""The delta catalog: tables, partition streams, deltas and compacted stream versions on one Storage.

Layout (docs/catalog-layout.md has the full description):

    tables/<T>/table.json
    tables/<T>/partitions/<P>/partition.json
    tables/<T>/partitions/<P>/streams/<V>/stream.json
    tables/<T>/partitions/<P>/streams/<V>/deltas/<position>.json      commit point of a delta
    tables/<T>/partitions/<P>/streams/<V>/files/<commit id>/<n>.<ext> its files
    tables/<T>/partitions/<P>/streams/<V>/rounds/<round id>.json      round-completion files
    tables/<T>/partitions/<P>/compacted/versions/<version>.json       commit point of a compaction round
    tables/<T>/partitions/<P>/compacted/data/<attempt>/...             compacted files
    tables/<T>/partitions/<P>/compacted/index/<attempt>/...            primary key index files

A delta becomes visible the instant its manifest is created (exclusive create); its files are written first,
so a reader never sees part of a delta. Positions are allocated by racing for the next manifest name.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pyarrow as pa

from flash_pipeline.catalog import encoding
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.files import ContentType, content_type_of, read_table, schema_to_json, write_table
from flash_pipeline.catalog.model import (
    ACTIVE,
    DELETE,
    OPERATIONS,
    UPSERT,
    CompactedVersion,
    DataFile,
    Delta,
    StreamVersion,
    dumps,
    schema_to_b64,
)
from flash_pipeline.catalog.storage import Storage, open_storage
from flash_pipeline.errors import FlashError, NotFound, SchemaConflict

POSITION_DIGITS = 20
VERSION_DIGITS = 10


@dataclass(frozen=True)
class _StagedFile:
    file_number: int
    source: str  # a local path, or "<table N>" for in-memory tables
    content_type: ContentType
    rows: int
    schema: pa.Schema
    payload: bytes | None  # in-memory tables are serialized up front
    local_path: Path | None


class Catalog:
    """Reads and commits deltas and compacted versions of the tables under one lake root."""

    def __init__(self, storage: Storage | str | Path, **storage_options: Any) -> None:
        self.storage = storage if isinstance(storage, Storage) else open_storage(storage, **storage_options)

    @property
    def uri(self) -> str:
        return self.storage.uri

    # ----- keys -------------------------------------------------------------------------------------------
    @staticmethod
    def table_prefix(table_id: str) -> str:
        return f"tables/{encoding.table_component(table_id)}"

    def partition_prefix(self, table_id: str, partition: PartitionKeys) -> str:
        return f"{self.table_prefix(table_id)}/partitions/{encoding.partition_component(partition)}"

    def stream_prefix(self, table_id: str, partition: PartitionKeys, version: int) -> str:
        return f"{self.partition_prefix(table_id, partition)}/streams/{version:0{VERSION_DIGITS}d}"

    def compacted_prefix(self, table_id: str, partition: PartitionKeys) -> str:
        return f"{self.partition_prefix(table_id, partition)}/compacted"

    def _read_json(self, key: str) -> dict[str, Any]:
        return json.loads(self.storage.read(key))

    # ----- tables, partitions, streams --------------------------------------------------------------------
    def tables(self) -> list[str]:
        out = []
        for child in self.storage.list_children("tables"):
            try:
                out.append(self._read_json(f"tables/{child}/table.json")["table_id"])
            except NotFound:
                continue
        return sorted(out)

    def table_exists(self, table_id: str) -> bool:
        return self.storage.exists(f"{self.table_prefix(table_id)}/table.json")

    def require_table(self, table_id: str) -> None:
        if not self.table_exists(table_id):
            known = ", ".join(self.tables()) or "none"
            raise NotFound(f"unknown table {table_id!r} in catalog {self.uri} (tables: {known}); append a delta first")

    def table_metadata(self, table_id: str) -> dict[str, Any]:
        return self._read_json(f"{self.table_prefix(table_id)}/table.json")

    def partitions(self, table_id: str) -> list[PartitionKeys]:
        prefix = f"{self.table_prefix(table_id)}/partitions"
        out = []
        for child in self.storage.list_children(prefix):
            try:
                data = self._read_json(f"{prefix}/{child}/partition.json")
            except NotFound:
                continue
            out.append(tuple((n, v) for n, v in data["partition"]))
        return sorted(out, key=lambda p: [(n, "" if v is None else "\x01" + v) for n, v in p])

    def require_partition(self, table_id: str, partition: PartitionKeys) -> None:
        self.require_table(table_id)
        if not self.storage.exists(f"{self.partition_prefix(table_id, partition)}/partition.json"):
            known = "; ".join(format_partition(p) for p in self.partitions(table_id)) or "none"
            raise NotFound(
                f"unknown partition {format_partition(partition)} of table {table_id!r} (partitions: {known})"
            )

    def streams(self, table_id: str, partition: PartitionKeys) -> list[StreamVersion]:
        prefix = f"{self.partition_prefix(table_id, partition)}/streams"
        out = []
        for child in self.storage.list_children(prefix):
            try:
                out.append(StreamVersion.from_json(self._read_json(f"{prefix}/{child}/stream.json")))
            except NotFound:
                continue
        return sorted(out, key=lambda s: s.version)

    def active_stream(self, table_id: str, partition: PartitionKeys) -> StreamVersion | None:
        """The latest active partition stream version (the paper's default compaction input)."""
        active = [s for s in self.streams(table_id, partition) if s.state == ACTIVE]
        return active[-1] if active else None

    def set_stream_state(self, stream: StreamVersion, state: str) -> StreamVersion:
        from flash_pipeline.catalog.model import LIFECYCLE_STATES

        if state not in LIFECYCLE_STATES:
            raise FlashError(f"unknown lifecycle state {state!r}: use one of {', '.join(LIFECYCLE_STATES)}")
        new = StreamVersion(stream.table_id, stream.partition, stream.version, state)
        self.storage.write(f"{self.stream_prefix(stream.table_id, stream.partition, stream.version)}/stream.json", dumps(new.to_json()))
        return new

    def new_stream_version(self, table_id: str, partition: PartitionKeys, state: str = ACTIVE) -> StreamVersion:
        """Start a new partition stream version (e.g. after a restatement); earlier active ones are deprecated."""
        partition = normalize_partition(partition)
        self._ensure_table(table_id, partition)
        while True:
            existing = self.streams(table_id, partition)
            version = (existing[-1].version + 1) if existing else 1
            stream = StreamVersion(table_id, partition, version, state)
            key = f"{self.stream_prefix(table_id, partition, version)}/stream.json"
            if self.storage.create(key, dumps(stream.to_json())):
                break
        if state == ACTIVE:
            for old in existing:
                if old.state == ACTIVE:
                    self.set_stream_state(old, "deprecated")
        return stream

    def _ensure_table(self, table_id: str, partition: PartitionKeys) -> None:
        table_key = f"{self.table_prefix(table_id)}/table.json"
        if not self.storage.exists(table_key):
            self.storage.create(table_key, dumps({"table_id": table_id, "created_at": time.time()}))
        part_key = f"{self.partition_prefix(table_id, partition)}/partition.json"
        if not self.storage.exists(part_key):
            self.storage.create(part_key, dumps({"table_id": table_id, "partition": [[n, v] for n, v in partition]}))

    def _ensure_active_stream(self, table_id: str, partition: PartitionKeys) -> StreamVersion:
        self._ensure_table(table_id, partition)
        stream = self.active_stream(table_id, partition)
        if stream is not None:
            return stream
        stream = StreamVersion(table_id, partition, 1, ACTIVE)
        self.storage.create(f"{self.stream_prefix(table_id, partition, 1)}/stream.json", dumps(stream.to_json()))
        found = self.active_stream(table_id, partition)
        if found is None:
            raise FlashError(f"table {table_id!r} partition {format_partition(partition)} has no active stream version")
        return found

    # ----- deltas -----------------------------------------------------------------------------------------
    def deltas(
        self,
        table_id: str,
        partition: PartitionKeys,
        stream_version: int | None = None,
        after_position: int | None = None,
    ) -> list[Delta]:
        """Committed deltas of a stream version (the active one by default) in position order."""
        if stream_version is None:
            stream = self.active_stream(table_id, partition)
            if stream is None:
                return []
            stream_version = stream.version
        prefix = f"{self.stream_prefix(table_id, partition, stream_version)}/deltas"
        out = []
        for name in self.storage.list_children(prefix):
            if not name.endswith(".json"):
                continue
            position = int(name[: -len(".json")])
            if after_position is not None and position <= after_position:
                continue
            out.append(Delta.from_json(self._read_json(f"{prefix}/{name}")))
        return out

    def delta_positions(self, table_id: str, partition: PartitionKeys, stream_version: int) -> list[int]:
        prefix = f"{self.stream_prefix(table_id, partition, stream_version)}/deltas"
        return [int(n[:-5]) for n in self.storage.list_children(prefix) if n.endswith(".json")]

    def append(
        self,
        table_id: str,
        partition: object,
        operation: str,
        files: Sequence[str | Path | pa.Table],
    ) -> Delta:
        """Register ``files`` as ONE new delta at the next position of the partition's active stream.

        Every file is read and checked before anything is written; files are copied into the lake, so the
        sources may go away afterwards. Raises FlashError (lake unchanged) on bad input.
        """
        encoding.table_component(table_id)
        partition = normalize_partition(partition)
        if operation not in OPERATIONS:
            raise FlashError(f"unknown operation {operation!r}: use upsert or delete")
        if not files:
            raise FlashError(f"no files given for table {table_id!r}: pass at least one file to append")
        staged = [self._stage(i + 1, f) for i, f in enumerate(files)]
        self._check_schemas(table_id, partition, operation, staged)

        stream = self._ensure_active_stream(table_id, partition)
        commit_id = uuid.uuid4().hex
        sprefix = self.stream_prefix(table_id, partition, stream.version)
        data_files = []
        uploaded: list[str] = []
        attempt: tuple[str, bytes, Delta] | None = None  # the manifest create in flight
        try:
            for s in staged:
                key = f"{sprefix}/files/{commit_id}/{s.file_number}{s.content_type.extension}"
                if s.payload is not None:
                    self.storage.write(key, s.payload)
                    size = len(s.payload)
                else:
                    assert s.local_path is not None
                    size = self.storage.upload(s.local_path, key)
                uploaded.append(key)
                data_files.append(DataFile(s.file_number, key, s.rows, size, s.content_type))
            schema = tuple(schema_to_json(staged[0].schema))
            while True:
                positions = self.delta_positions(table_id, partition, stream.version)
                position = (max(positions) + 1) if positions else 1
                delta = Delta(
                    table_id, partition, stream.version, position, operation, tuple(data_files), schema, commit_id,
                    time.time(), schema_to_b64(staged[0].schema),
                )
                key = f"{sprefix}/deltas/{position:0{POSITION_DIGITS}d}.json"
                body = dumps(delta.to_json())
                attempt = (key, body, delta)
                if self.storage.create(key, body):
                    return delta
                attempt = None
        except BaseException as exc:
            if attempt is not None:
                # The create failed without an answer (e.g. retries exhausted after the request reached the
                # store): the manifest may be committed. Never delete the files of a visible delta.
                committed: bool | None
                try:
                    committed = self.storage.read(attempt[0]) == attempt[1]
                except NotFound:
                    committed = False
                except Exception:  # noqa: BLE001 - cannot tell: keep the files (an orphan is invisible)
                    committed = None
                if committed is None:
                    raise
                if committed:
                    if isinstance(exc, Exception):
                        return attempt[2]
                    raise
            for key in uploaded:
                try:
                    self.storage.delete(key)
                except Exception:  # noqa: BLE001 - best effort; an orphan file is invisible anyway
                    pass
            raise

    def _stage(self, file_number: int, source: str | Path | pa.Table) -> _StagedFile:
        if isinstance(source, pa.Table):
            sink = pa.BufferOutputStream()
            write_table(source, sink, ContentType.PARQUET)
            return _StagedFile(file_number, f"<table {file_number}>", ContentType.PARQUET, source.num_rows, source.schema, sink.getvalue().to_pybytes(), None)
        path = Path(source)
        if not path.is_file():
            raise FlashError(f"file {path} does not exist or is not a file: check the path; nothing was appended")
        content_type = content_type_of(path)
        try:
            table = read_table(str(path), content_type)
        except Exception as exc:  # noqa: BLE001 - any reader error means the file is unusable
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FlashError(f"cannot read {path} as {content_type.value}: {reason}; fix or replace the file, nothing was appended") from None
        return _StagedFile(file_number, str(path), content_type, table.num_rows, table.schema, None, path)

    def _check_schemas(self, table_id: str, partition: PartitionKeys, operation: str, staged: list[_StagedFile]) -> None:
        first = staged[0]
        for s in staged[1:]:
            _require_same_columns(first.schema, s.schema, f"file {s.source}", f"file {first.source}", table_id)
        reference = self._stream_upsert_schema(table_id, partition)
        if reference is None:
            return
        for s in staged:
            _check_against_stream(s.schema, reference, operation, s.source, table_id, partition)

    def _stream_upsert_schema(self, table_id: str, partition: PartitionKeys) -> dict[str, str] | None:
        """Column -> type of the stream's latest upsert (or, failing that, delete) delta."""
        stream = self.active_stream(table_id, partition)
        if stream is None:
            return None
        prefix = f"{self.stream_prefix(table_id, partition, stream.version)}/deltas"
        names = sorted(self.storage.list_children(prefix), reverse=True)
        fallback = None
        for name in names:
            delta = Delta.from_json(self._read_json(f"{prefix}/{name}"))
            cols = {c["name"]: c["type"] for c in delta.schema}
            if delta.operation == UPSERT:
                return cols
            fallback = fallback or {"__deletes_only__": "", **cols}
        return fallback

    def read_file(self, data_file: DataFile, columns: Sequence[str] | None = None) -> pa.Table:
        return read_table(self.storage.arrow_source(data_file.key), data_file.content_type, columns)

    # ----- compacted versions -----------------------------------------------------------------------------
    def compacted_versions(self, table_id: str, partition: PartitionKeys) -> list[int]:
        prefix = f"{self.compacted_prefix(table_id, partition)}/versions"
        return [int(n[:-5]) for n in self.storage.list_children(prefix) if n.endswith(".json")]

    def compacted_version(self, table_id: str, partition: PartitionKeys, version: int) -> CompactedVersion:
        key = f"{self.compacted_prefix(table_id, partition)}/versions/{version:0{VERSION_DIGITS}d}.json"
        return CompactedVersion.from_json(self._read_json(key))

    def latest_compacted(self, table_id: str, partition: PartitionKeys) -> CompactedVersion | None:
        versions = self.compacted_versions(table_id, partition)
        if not versions:
            return None
        return self.compacted_version(table_id, partition, max(versions))

    def commit_compacted(self, version: CompactedVersion) -> bool:
        """Atomically publish a compacted stream version; False if another writer took that version number."""
        self._ensure_table(version.table_id, version.partition)
        key = f"{self.compacted_prefix(version.table_id, version.partition)}/versions/{version.version:0{VERSION_DIGITS}d}.json"
        return self.storage.create(key, dumps(version.to_json()))

    def compacted_partitions(self, table_id: str) -> list[PartitionKeys]:
        return [p for p in self.partitions(table_id) if self.compacted_versions(table_id, p)]

    def export(self, table_id: str, out_dir: str | Path, partition: object | None = None) -> list[Path]:
        """Write the latest compacted rows (user columns only) as Parquet files into ``out_dir``."""
        import pyarrow.parquet as pq

        self.require_table(table_id)
        parts = self.partitions(table_id)
        if partition is not None:
            wanted = normalize_partition(partition)
            self.require_partition(table_id, wanted)
            parts = [wanted]
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for part in parts:
            compacted = self.latest_compacted(table_id, part)
            if compacted is None:
                continue
            pdir = out / encoding.partition_component(part)
            for f in compacted.files:
                table = user_columns(self.read_file(f), compacted)
                if table.num_rows == 0:
                    continue
                pdir.mkdir(parents=True, exist_ok=True)
                path = pdir / f"part-{f.file_number:05d}.parquet"
                pq.write_table(table, path)
                written.append(path)
        return written

    def listing(self) -> list[str]:
        """Every key in the lake (tests compare it before and after a failed command)."""
        return self.storage.list("")


INTERNAL_COLUMNS = frozenset({"__stream_position__"})


def user_columns(table: pa.Table, compacted: CompactedVersion) -> pa.Table:
    """``table`` without the compactor's internal columns (kept: the version's user schema, when recorded)."""
    names: list[str] = []
    if compacted.arrow_schema:
        names = compacted.pa_schema().names
    elif compacted.schema:
        names = [c["name"] for c in compacted.schema]
    keep = [n for n in table.column_names if n not in INTERNAL_COLUMNS and (not names or n in names)]
    return table if keep == table.column_names else table.select(keep)


def _require_same_columns(a: pa.Schema, b: pa.Schema, b_name: str, a_name: str, table_id: str) -> None:
    ca = {f.name: str(f.type) for f in a}
    cb = {f.name: str(f.type) for f in b}
    if ca != cb:
        raise SchemaConflict(
            f"{b_name} has columns {_describe(cb)} but {a_name} has {_describe(ca)} (table {table_id!r}): "
            "files of one delta must share one schema"
        )


def _describe(cols: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in cols.items()) + "}"


def _check_against_stream(
    schema: pa.Schema, reference: dict[str, str], operation: str, source: str, table_id: str, partition: PartitionKeys
) -> None:
    reference = dict(reference)  # the caller checks several files against the same reference
    deletes_only = reference.pop("__deletes_only__", None) is not None
    where = f"table {table_id!r} partition {format_partition(partition)}"
    cols = {f.name: str(f.type) for f in schema}
    for name, typ in cols.items():
        if name in reference and reference[name] != typ:
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


def iter_partition_deltas(catalog: Catalog, table_id: str) -> Iterable[tuple[PartitionKeys, list[Delta]]]:
    for part in catalog.partitions(table_id):
        yield part, catalog.deltas(table_id, part)
