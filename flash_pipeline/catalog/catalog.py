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

import errno
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

from flash_pipeline.catalog import encoding
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.files import (
    ContentType,
    content_type_of,
    read_table,
    schema_to_json,
    write_table,
    written_by_compactor,
)
from flash_pipeline.catalog.model import (
    ACTIVE,
    DELETE,
    DEPRECATED,
    FORMAT_VERSION,
    OPERATIONS,
    UNRELEASED,
    Pending,
    UPSERT,
    CompactedVersion,
    DataFile,
    Delta,
    StreamVersion,
    checksum_of,
    checksum_of_file,
    dumps,
    schema_from_b64,
    schema_to_b64,
)
from flash_pipeline.catalog.storage import Storage, open_storage
from flash_pipeline.errors import CommitOutcomeUnknown, FlashError, NotFound, SchemaConflict

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
    csv_delimiter: str | None = None  # the delimiter a CSV source was parsed with


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

    def _read_json(self, key: str, parse: Callable[[dict[str, Any]], Any] | None = None) -> Any:
        """The catalog document at ``key``, through ``parse`` (a manifest's ``from_json``) when given.

        Every command reads the catalog through here, so a document that is not a JSON object of the expected
        shape (truncated, overwritten, hand-edited) is one FlashError naming its key, not a traceback."""
        raw = self.storage.read(key)
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError(f"it holds a JSON {type(doc).__name__}, not an object")
            return parse(doc) if parse is not None else doc
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            if isinstance(exc, KeyError):
                reason = f"field {exc.args[0]!r} is missing"
            elif isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
                reason = f"not valid JSON: {exc}"
            else:
                reason = str(exc) or type(exc).__name__
            raise FlashError(
                f"catalog document {key} in {self.uri} is corrupt ({reason}): restore it from a backup or copy "
                "of the lake; nothing was changed"
            ) from None

    # ----- tables, partitions, streams --------------------------------------------------------------------
    def tables(self) -> list[str]:
        out = []
        for child in self.storage.list_children("tables"):
            try:
                out.append(self._read_json(f"tables/{child}/table.json", lambda d: str(d["table_id"])))
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
                part = self._read_json(f"{prefix}/{child}/partition.json", lambda d: tuple((n, v) for n, v in d["partition"]))
            except NotFound:
                continue
            out.append(part)
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
                out.append(self._read_json(f"{prefix}/{child}/stream.json", StreamVersion.from_json))
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
        include_skipped: bool = False,
    ) -> list[Delta]:
        """Committed deltas of a stream version (the active one by default) in position order.

        Deltas marked skipped (``skip_delta``) are left out unless ``include_skipped``: compaction,
        merge-on-read and the triggers all read through here, so a skipped delta is ignored everywhere at once.
        """
        if stream_version is None:
            stream = self.active_stream(table_id, partition)
            if stream is None:
                return []
            stream_version = stream.version
        prefix = f"{self.stream_prefix(table_id, partition, stream_version)}/deltas"
        skipped = set() if include_skipped else self.skipped_positions(table_id, partition, stream_version)
        out = []
        for name in self.storage.list_children(prefix):
            if not name.endswith(".json"):
                continue
            position = int(name[: -len(".json")])
            if (after_position is not None and position <= after_position) or position in skipped:
                continue
            out.append(self._read_json(f"{prefix}/{name}", Delta.from_json))
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
        csv_delimiter: str | None = None,
        *,
        _into: StreamVersion | None = None,
    ) -> Delta:
        """Register ``files`` as ONE new delta at the next position of the partition's active stream.

        Every file is read and checked before anything is written; files are copied into the lake, so the
        sources may go away afterwards. Raises FlashError (lake unchanged) on bad input. ``csv_delimiter``
        parses CSV files (default ``,``); CSV files with another delimiter are stored as Parquet, since
        every reader of the lake parses stored CSV files with commas. The first upsert of a stream claims
        the stream's schema with an exclusive create (``schema.json``), so of two concurrent first appends
        with different columns exactly one wins. ``_into`` targets a given (e.g. unreleased) stream version.
        """
        encoding.table_component(table_id)
        partition = normalize_partition(partition)
        if operation not in OPERATIONS:
            raise FlashError(f"unknown operation {operation!r}: use upsert or delete")
        if not files:
            raise FlashError(f"no files given for table {table_id!r}: pass at least one file to append")
        if csv_delimiter is not None and (len(csv_delimiter) != 1 or csv_delimiter in '\r\n"'):
            raise FlashError(f"invalid CSV delimiter {csv_delimiter!r}: give one character such as ';' or a tab")
        staged = [self._stage(i + 1, f, csv_delimiter) for i, f in enumerate(files)]
        checked = _into if _into is not None else self.active_stream(table_id, partition)
        reference = self._check_schemas(table_id, partition, operation, staged, checked)

        stream = _into if _into is not None else self._ensure_active_stream(table_id, partition)
        if checked is None or checked.version != stream.version:  # the stream was created or replaced meanwhile
            reference = self._check_schemas(table_id, partition, operation, staged, stream)
        if operation == UPSERT and (reference is None or not reference.from_doc):
            self._claim_stream_schema(stream, staged)
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
                data_files.append(DataFile(s.file_number, key, s.rows, size, s.content_type, checksum_of(s.payload) if s.payload is not None else checksum_of_file(s.local_path)))  # type: ignore[arg-type]
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

    def _stage(self, file_number: int, source: str | Path | pa.Table, csv_delimiter: str | None = None) -> _StagedFile:
        if isinstance(source, pa.Table):
            _check_column_names(source.schema, f"<table {file_number}>")
            sink = pa.BufferOutputStream()
            write_table(source, sink, ContentType.PARQUET)
            return _StagedFile(file_number, f"<table {file_number}>", ContentType.PARQUET, source.num_rows, source.schema, sink.getvalue().to_pybytes(), None)
        path = Path(source)
        if not path.is_file():
            raise FlashError(f"file {path} does not exist or is not a file: check the path; nothing was appended")
        content_type = content_type_of(path)
        other_delimiter = content_type is ContentType.CSV and csv_delimiter not in (None, ",")
        try:
            if other_delimiter:
                import pyarrow.csv as pacsv

                table = pacsv.read_csv(
                    str(path), parse_options=pacsv.ParseOptions(delimiter=csv_delimiter),
                    read_options=pacsv.ReadOptions(use_threads=False),
                )
            else:
                table = read_table(str(path), content_type)
        except Exception as exc:  # noqa: BLE001 - any reader error means the file is unusable
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FlashError(f"cannot read {path} as {content_type.value}: {reason}; fix or replace the file, nothing was appended") from None
        _check_column_names(table.schema, str(path))
        delimiter = (csv_delimiter or ",") if content_type is ContentType.CSV else None
        if other_delimiter:  # stored CSV files are read with commas: keep the parsed table as Parquet instead
            sink = pa.BufferOutputStream()
            write_table(table, sink, ContentType.PARQUET)
            return _StagedFile(file_number, str(path), ContentType.PARQUET, table.num_rows, table.schema, sink.getvalue().to_pybytes(), None, delimiter)
        return _StagedFile(file_number, str(path), content_type, table.num_rows, table.schema, None, path, delimiter)

    def _check_schemas(
        self, table_id: str, partition: PartitionKeys, operation: str, staged: list[_StagedFile], stream: StreamVersion | None
    ) -> "_Reference | None":
        """Check ``staged`` against each other, the stream's schema and the recorded primary keys (no writes)."""
        reference = self._stream_upsert_schema(table_id, partition, stream) if stream is not None else None
        _check_csv_parse(staged, reference)
        first = staged[0]
        for s in staged[1:]:
            _require_same_columns(first.schema, s.schema, f"file {s.source}", f"file {first.source}", table_id)
        if operation == DELETE:
            self._check_delete_keys(table_id, partition, staged)
        self._check_key_types(table_id, partition, staged)
        if reference is not None:
            for s in staged:
                _check_against_stream(s.schema, reference, operation, s.source, table_id, partition)
        return reference

    def _stream_upsert_schema(self, table_id: str, partition: PartitionKeys, stream: StreamVersion) -> "_Reference | None":
        """The stream's schema document; for streams without one (deletes only so far, or written before
        schema documents existed), the columns of its latest non-skipped upsert (or, failing that, delete)."""
        doc = self.stream_schema(table_id, partition, stream.version)
        if doc is not None:
            return _Reference({f.name: str(f.type) for f in doc}, deletes_only=False, from_doc=True)
        prefix = f"{self.stream_prefix(table_id, partition, stream.version)}/deltas"
        skipped = self.skipped_positions(table_id, partition, stream.version)
        fallback = None
        for name in sorted(self.storage.list_children(prefix), reverse=True):
            if not name.endswith(".json") or int(name[:-5]) in skipped:
                continue
            delta = self._read_json(f"{prefix}/{name}", Delta.from_json)
            cols = {c["name"]: c["type"] for c in delta.schema}
            if delta.operation == UPSERT:
                return _Reference(cols, deletes_only=False, from_doc=False)
            fallback = fallback or _Reference(cols, deletes_only=True, from_doc=False)
        return fallback

    # ----- stream schema documents ------------------------------------------------------------------------
    def _schema_key(self, table_id: str, partition: PartitionKeys, stream_version: int) -> str:
        return f"{self.stream_prefix(table_id, partition, stream_version)}/schema.json"

    def stream_schema(self, table_id: str, partition: PartitionKeys, stream_version: int) -> pa.Schema | None:
        """The schema the stream's first upsert claimed (None before any upsert, or for an older stream)."""
        try:
            return self._read_json(self._schema_key(table_id, partition, stream_version), lambda d: schema_from_b64(d["arrow_schema"]))
        except NotFound:
            return None

    def _claim_stream_schema(self, stream: StreamVersion, staged: list[_StagedFile]) -> None:
        """Exclusive-create the stream's schema document; losing to a different schema is a SchemaConflict."""
        schema = staged[0].schema
        doc = {
            "format": FORMAT_VERSION, "table_id": stream.table_id, "partition": [[n, v] for n, v in stream.partition],
            "stream_version": stream.version, "schema": schema_to_json(schema), "arrow_schema": schema_to_b64(schema),
            "commit_id": uuid.uuid4().hex, "created_at": time.time(),
        }
        if self.storage.create(self._schema_key(stream.table_id, stream.partition, stream.version), dumps(doc)):
            return
        winner = self.stream_schema(stream.table_id, stream.partition, stream.version)
        if winner is None:  # cannot happen: create only fails on an existing key
            raise FlashError(f"could not claim the schema of table {stream.table_id!r} [{format_partition(stream.partition)}]: append again")
        reference = _Reference({f.name: str(f.type) for f in winner}, deletes_only=False, from_doc=True)
        for s in staged:
            _check_against_stream(s.schema, reference, UPSERT, s.source, stream.table_id, stream.partition)

    # ----- keys recorded by compaction --------------------------------------------------------------------
    def compactions_of(self, table_id: str, partition: PartitionKeys) -> list[CompactedVersion]:
        """The latest compacted version of every table (this one included) compacted from this partition."""
        out = []
        for dest in self.tables():
            try:
                latest = self.latest_compacted(dest, partition)
            except NotFound:
                continue
            if latest is not None and latest.source_table_id == table_id:
                out.append(latest)
        return out

    def _check_delete_keys(self, table_id: str, partition: PartitionKeys, staged: list[_StagedFile]) -> None:
        """A delete names rows by primary key: once a compaction recorded the keys, every key column is required."""
        if not self.table_exists(table_id):
            return
        for compacted in self.compactions_of(table_id, partition):
            for s in staged:
                missing = [k for k in compacted.primary_keys if k not in s.schema.names]
                if missing:
                    raise FlashError(
                        f"delete file {s.source} lacks primary key column(s) {missing} of table {table_id!r} "
                        f"[{format_partition(partition)}] (recorded by its compaction into {compacted.table_id!r}): "
                        "a delete names the rows to delete by their primary key, add the key column(s); nothing was appended"
                    )

    def _check_key_types(self, table_id: str, partition: PartitionKeys, staged: list[_StagedFile]) -> None:
        """Once a compaction recorded the primary keys, a key column of a nested type is refused at append
        rather than failing the next compaction. Files without nested columns (nearly all) cost no catalog read."""
        nested = any(pa.types.is_nested(f.type) or pa.types.is_interval(f.type) for s in staged for f in s.schema)
        if not nested or not self.table_exists(table_id):
            return
        compactions = self.compactions_of(table_id, partition)
        if compactions:
            from flash_pipeline.compactor.kernels.digest import require_key_types  # loads the compiled kernels: only here

            for compacted in compactions:
                for s in staged:
                    require_key_types(s.schema, compacted.primary_keys, f"file {s.source} of table {table_id!r} [{format_partition(partition)}]")

    # ----- skipped deltas ---------------------------------------------------------------------------------
    def _skip_key(self, stream: StreamVersion, position: int) -> str:
        return f"{self.stream_prefix(stream.table_id, stream.partition, stream.version)}/skipped/{position:0{POSITION_DIGITS}d}.json"

    def skipped_positions(self, table_id: str, partition: PartitionKeys, stream_version: int) -> set[int]:
        """Positions of the stream marked skipped (one listing)."""
        prefix = f"{self.stream_prefix(table_id, partition, stream_version)}/skipped"
        return {int(n[:-5]) for n in self.storage.list_children(prefix) if n.endswith(".json") and n[:-5].isdigit()}

    def _require_active_stream(self, table_id: str, partition: object, fix: str) -> tuple[PartitionKeys, str, StreamVersion]:
        """(normalized partition, its one-line name, its active stream), or NotFound that says ``fix``."""
        partition = normalize_partition(partition)
        self.require_partition(table_id, partition)
        where = f"table {table_id!r} [{format_partition(partition)}]"
        stream = self.active_stream(table_id, partition)
        if stream is None:
            raise NotFound(f"{where} has no active stream version: {fix}")
        return partition, where, stream

    def _skip_target(self, table_id: str, partition: object, position: int, verb: str) -> StreamVersion:
        """The active stream holding ``position``, refusing positions a compacted version already covers."""
        partition, where, stream = self._require_active_stream(table_id, partition, f"nothing to {verb}")
        positions = self.delta_positions(table_id, partition, stream.version)
        if isinstance(position, bool) or not isinstance(position, int) or position not in positions:
            span = f"positions {min(positions)}..{max(positions)}" if positions else "no deltas"
            raise NotFound(f"no delta at position {position!r} of stream v{stream.version} of {where} ({span}): check `flash-compactor show`")
        for compacted in self.compactions_of(table_id, partition):
            if compacted.source_stream_version == stream.version and compacted.last_position >= position:
                raise FlashError(
                    f"compacted version {compacted.version} of {compacted.table_id!r} already covers position {position} "
                    f"of {where} (up to {compacted.last_position}): it can no longer be {verb}; append a delta that "
                    "corrects its rows, or start a new stream version"
                )
        return stream

    def skip_delta(self, table_id: str, partition: object, position: int) -> bool:
        """Mark the delta at ``position`` of the active stream skipped: compaction, merge-on-read and the
        triggers ignore it from now on. An exclusive-create marker ``skipped/<position>.json`` under the stream
        records it, so nothing is edited. Refused once a compacted version covers the position. Returns False
        if it was already skipped."""
        stream = self._skip_target(table_id, partition, position, "skipped")
        key = self._skip_key(stream, position)
        if self.storage.exists(key):
            return False
        body = {
            "format": FORMAT_VERSION, "table_id": table_id, "partition": [[n, v] for n, v in stream.partition],
            "stream_version": stream.version, "position": position, "commit_id": uuid.uuid4().hex, "created_at": time.time(),
        }
        return self.storage.create(key, dumps(body))

    def unskip_delta(self, table_id: str, partition: object, position: int) -> None:
        """Undo :meth:`skip_delta` (delete the marker) while no compacted version covers the position."""
        stream = self._skip_target(table_id, partition, position, "unskipped")
        key = self._skip_key(stream, position)
        if not self.storage.exists(key):
            raise FlashError(
                f"the delta at position {position} of table {table_id!r} [{format_partition(stream.partition)}] "
                "is not skipped: nothing to undo"
            )
        self.storage.delete(key)

    # ----- new stream version from the compacted rows ----------------------------------------------------
    def new_stream_from_compacted(
        self,
        table_id: str,
        partition: object,
        schema: pa.Schema | None = None,
        compacted_table_id: str | None = None,
    ) -> "NewStream":
        """Start a new partition stream version whose first delta (an upsert) is the latest compacted rows, and
        deprecate the old stream, so that a stream blocked by bad deltas, or moving to a new schema, restarts
        from what compaction made of it. The compacted files' bytes are copied into the new stream (never
        referenced), so retention of compacted versions cannot delete them. With ``schema`` the carried rows
        are conformed to it (missing columns null, changed types cast safely, dropped columns left out) and
        written as Parquet. Deltas after the compacted version's last position are not carried (reported).
        Everything is read and checked before the first write; the new stream is created unreleased and
        activated once its first delta is committed."""
        import tempfile

        partition, where, active = self._require_active_stream(table_id, partition, "append a delta instead")
        every = self.compactions_of(table_id, partition)
        if compacted_table_id is not None:
            every = [c for c in every if c.table_id == compacted_table_id]
        candidates = [c for c in every if c.source_stream_version == active.version]
        if not candidates:
            older = f" (compacted versions exist only of stream v{every[0].source_stream_version})" if every else ""
            raise FlashError(
                f"{where} has no compacted version of its active stream v{active.version}{older}"
                + (f" in {compacted_table_id!r}" if compacted_table_id else "")
                + ": compact it first (skip a delta that blocks compaction with flash-compactor skip-delta)"
            )
        if len(candidates) > 1:
            names = ", ".join(sorted(c.table_id for c in candidates))
            raise FlashError(f"{where} is compacted into several tables ({names}): name one with --compacted-table")
        compacted = candidates[0]
        keys = list(compacted.primary_keys) + [n for n, _ in compacted.sort_keys]
        if schema is not None:
            _check_column_names(schema, "the new schema")
            missing = [k for k in keys if k not in schema.names]
            if missing:
                raise FlashError(
                    f"the new schema of {where} lacks the primary/sort key column(s) {missing} recorded by compacted "
                    f"version {compacted.version} of {compacted.table_id!r}: keep them"
                )
        pending = [d.position for d in self.deltas(table_id, partition, active.version, after_position=compacted.last_position)]
        with tempfile.TemporaryDirectory(prefix="flash-new-stream-") as tmp:
            paths: list[str] = []
            rewritten = False
            for f in sorted(compacted.files, key=lambda f: f.file_number):
                if f.rows == 0:
                    continue
                data = self.storage.read(f.key)
                table = _read_compacted_bytes(data, f.content_type, compacted)
                users = user_columns(table, compacted)
                target = schema if schema is not None else users.schema
                if f.content_type is not ContentType.CSV and users.num_columns == table.num_columns and _same_columns(users.schema, target):
                    path = Path(tmp) / f"{f.file_number}{f.content_type.extension}"
                    path.write_bytes(data)  # the very bytes of the compacted file
                else:
                    rewritten = True
                    path = Path(tmp) / f"{f.file_number}.parquet"
                    pq_write(_conform(users, target, f.key), path)
                paths.append(str(path))
            stream = self.new_stream_version(table_id, partition, state=UNRELEASED)
            delta = self.append(table_id, partition, UPSERT, paths, _into=stream) if paths else None
        stream = self.set_stream_state(stream, ACTIVE)
        for old in self.streams(table_id, partition):
            if old.state == ACTIVE and old.version != stream.version:
                self.set_stream_state(old, DEPRECATED)
        return NewStream(stream, active, compacted, delta, pending, rewritten)

    def read_file(self, data_file: DataFile, columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> pa.Table:
        """One file of a delta or compacted version; pass the version's or delta's recorded ``schema``
        (``pa_schema()``) so that columns come back with their exact types in every format (CSV keeps none)."""
        return read_table(
            self.storage.arrow_source(data_file.key), data_file.content_type, columns, schema, written_by_compactor(data_file.key)
        )

    # ----- compacted versions -----------------------------------------------------------------------------
    # A version number, once taken, is never free again: retention marks an old version expired
    # (``versions/<n>.expired``) and keeps its small manifest, so a writer that read an old base can never
    # commit into the gap (every commit is an exclusive create of exactly base + 1).
    def _versions_prefix(self, table_id: str, partition: PartitionKeys) -> str:
        return f"{self.compacted_prefix(table_id, partition)}/versions"

    def version_key(self, table_id: str, partition: PartitionKeys, version: int) -> str:
        return f"{self._versions_prefix(table_id, partition)}/{version:0{VERSION_DIGITS}d}.json"

    def _version_names(self, table_id: str, partition: PartitionKeys) -> tuple[set[int], set[int]]:
        """(taken version numbers, expired version numbers) from one listing."""
        taken: set[int] = set()
        expired: set[int] = set()
        for name in self.storage.list_children(self._versions_prefix(table_id, partition)):
            stem, _, ext = name.partition(".")
            if not stem.isdigit():
                continue
            if ext == "json":
                taken.add(int(stem))
            elif ext == "expired":
                expired.add(int(stem))
        return taken, expired

    def compacted_versions(self, table_id: str, partition: PartitionKeys) -> list[int]:
        """Live (not expired by retention) compacted version numbers, ascending."""
        taken, expired = self._version_names(table_id, partition)
        return sorted(taken - expired)

    def taken_versions(self, table_id: str, partition: PartitionKeys) -> list[int]:
        """Every version number ever committed, expired ones included (they can never be committed again)."""
        return sorted(self._version_names(table_id, partition)[0])

    def compacted_version(self, table_id: str, partition: PartitionKeys, version: int) -> CompactedVersion:
        return self._read_json(self.version_key(table_id, partition, version), CompactedVersion.from_json)

    def latest_compacted(self, table_id: str, partition: PartitionKeys) -> CompactedVersion | None:
        versions = self.compacted_versions(table_id, partition)
        if not versions:
            return None
        return self.compacted_version(table_id, partition, max(versions))

    def pending(
        self, table_id: str, partition: PartitionKeys, compacted_table_id: str | None = None, *,
        rebuild: bool = False, keyed: bool = True,
    ) -> Pending:
        """Which deltas of ``table_id``'s partition stream wait for compaction into ``compacted_table_id``.

        The one answer compaction, triggers, sensors and ``show`` share. A compacted version covers the stream
        when it came from the same source table and stream version; with ``keyed`` (compaction's view) a
        version packed without primary keys (optimize) does not, since compaction needs its index; ``rebuild``
        ignores every compacted version."""
        holder = compacted_table_id or table_id
        stream = self.active_stream(table_id, partition)
        latest = self.latest_compacted(holder, partition) if self.table_exists(holder) else None
        base, notes = (None if rebuild else latest), []
        if base is not None and stream is not None and (
            base.source_table_id != table_id or base.source_stream_version != stream.version
        ):
            notes.append(
                f"compacted version {base.version} came from {base.source_table_id} stream v{base.source_stream_version}; "
                f"rebuilding from stream v{stream.version}"
            )
            base = None
        if base is not None and keyed and not base.primary_keys:
            notes.append(f"compacted version {base.version} was packed without primary keys (optimize); compacting from the stream's start")
            base = None
        after = base.last_position if base is not None else None
        deltas = self.deltas(table_id, partition, stream.version, after_position=after) if stream is not None else []
        return Pending(stream, latest, base if stream is not None else None, deltas, tuple(notes))

    def latest_version_number(self, table_id: str, partition: PartitionKeys) -> int:
        """The highest version number ever taken (0 for none): the base a from-scratch writer commits after."""
        return max(self.taken_versions(table_id, partition), default=0)

    def expire_compacted(self, table_id: str, partition: PartitionKeys, version: int) -> None:
        """Retention's mark: the version stays taken (its manifest stays) but is no longer listed as live."""
        key = f"{self._versions_prefix(table_id, partition)}/{version:0{VERSION_DIGITS}d}.expired"
        self.storage.write(key, dumps({"version": version, "expired_at": time.time()}))

    def commit_compacted(self, version: CompactedVersion) -> bool:
        """Publish ``version`` at exactly ``version.version`` if that number is free; True if it is ours.

        The caller builds ``version.version`` as its base version + 1, so a writer whose base moved loses
        instead of committing over (or after) a version it never saw. The outcome is decided by reading the
        manifest back and comparing commit ids, never by an exception alone: a create whose response was lost
        may well have been applied. Raises :class:`CommitOutcomeUnknown` when even the read-back fails; the
        caller must then keep the attempt's files (they may be committed).
        """
        self._ensure_table(version.table_id, version.partition)
        key = self.version_key(version.table_id, version.partition, version.version)
        failure: Exception | None = None
        try:
            if self.storage.create(key, dumps(version.to_json())):
                return True  # created now, or found holding exactly our bytes (a retried create)
        except Exception as exc:  # noqa: BLE001 - the request may have reached the store: read back below
            failure = exc
        outcome = self.commit_outcome(version)
        if outcome is False and failure is not None and not self.storage.exists(key):
            # nobody holds the number and our create failed without an answer: it may still land (a delayed
            # request), so this attempt must not be treated as lost and its files must not be deleted
            outcome = None
        if outcome is None:
            raise CommitOutcomeUnknown(
                f"could not tell whether compacted version {version.version} of {version.table_id!r} "
                f"[{format_partition(version.partition)}] was committed ({type(failure or Exception()).__name__}); "
                "its files are kept: run `flash-compactor show` and `verify`, then compact again"
            ) from failure
        return outcome

    def commit_outcome(self, version: CompactedVersion) -> bool | None:
        """True if ``version``'s commit id is the one at its version number, False if another's (or none) is,
        None if the store cannot be read."""
        key = self.version_key(version.table_id, version.partition, version.version)
        try:
            held = json.loads(self.storage.read(key))
        except NotFound:
            return False
        except Exception:  # noqa: BLE001 - cannot tell
            return None
        return held.get("commit_id") == version.commit_id

    def compacted_partitions(self, table_id: str) -> list[PartitionKeys]:
        return [p for p in self.partitions(table_id) if self.compacted_versions(table_id, p)]

    def export(self, table_id: str, out_dir: str | Path, partition: object | None = None, *, overwrite: bool = False) -> list[Path]:
        """Write the latest compacted rows (user columns only) as Parquet files into ``out_dir``.

        ``out_dir`` must be new or empty unless ``overwrite``, which replaces its whole contents: a stale file
        left beside the new ones would bring deleted rows back for a reader of the directory. The export is
        written into a temporary directory beside ``out_dir`` and renamed into place, so a failure or crash
        never leaves a half export there (at worst a hidden ``.<name>.export-*`` directory beside it)."""
        import pyarrow.parquet as pq

        out = Path(out_dir).expanduser()
        _check_export_dir(out, overwrite)
        self.require_table(table_id)
        parts = self.partitions(table_id)
        if partition is not None:
            wanted = normalize_partition(partition)
            self.require_partition(table_id, wanted)
            parts = [wanted]
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.export-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        written = []
        try:
            for part in parts:
                compacted = self.latest_compacted(table_id, part)
                if compacted is None:
                    continue
                component = encoding.partition_component(part)
                for f in compacted.files:
                    table = user_columns(self.read_file(f, schema=compacted.pa_schema() if compacted.arrow_schema else None), compacted)
                    if table.num_rows == 0:
                        continue
                    (tmp / component).mkdir(exist_ok=True)
                    name = f"part-{f.file_number:05d}.parquet"
                    pq.write_table(table, tmp / component / name)
                    written.append(out / component / name)
            _swap_into_place(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
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


@dataclass(frozen=True)
class _Reference:
    """The columns later appends are checked against: the stream's schema document, or for a stream without one
    its latest upsert (``deletes_only``: only delete deltas so far, which carry a subset of the columns)."""

    columns: dict[str, str]
    deletes_only: bool
    from_doc: bool


@dataclass(frozen=True)
class NewStream:
    """What :meth:`Catalog.new_stream_from_compacted` did."""

    stream: StreamVersion  # the new, active stream version
    previous: StreamVersion  # the stream version it replaced (now deprecated)
    compacted: CompactedVersion  # whose rows the new stream starts from
    delta: Delta | None  # the carried rows at position 1 (None when the compacted version was empty)
    not_carried: list[int]  # positions of the old stream after the compacted version's last position
    rewritten: bool  # True when the rows were rewritten (new schema, CSV, internal columns) instead of copied


CSV_DELIMITERS = (",", ";", "\t", "|")


def _check_column_names(schema: pa.Schema, source: str) -> None:
    """Refuse duplicate column names and names of the compactor's internal columns: both would silently
    corrupt compaction (a column is addressed by its name)."""
    names = schema.names
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise FlashError(f"{source} has duplicate column names {duplicates}: rename the columns so that each name is unique; nothing was appended")
    internal = sorted(set(names) & INTERNAL_COLUMNS)
    if internal:
        raise FlashError(f"{source} has column(s) {internal} whose names are reserved for the compactor's internal columns: rename them; nothing was appended")


def _check_csv_parse(staged: list[_StagedFile], reference: _Reference | None) -> None:
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
                f"{s.source} parses as one column {header!r} with CSV delimiter {s.csv_delimiter!r}, but its header looks "
                f"{likely!r}-separated: pass --csv-delimiter {likely!r} (csv_delimiter= in Python); nothing was appended"
            )


def _same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(x.type == y.type for x, y in zip(a, b))


def _read_compacted_bytes(data: bytes, content_type: ContentType, compacted: CompactedVersion) -> pa.Table:
    """One compacted file from its bytes; CSV with the version's recorded types (CSV has none of its own)."""
    if content_type is ContentType.CSV and compacted.arrow_schema:
        import pyarrow.csv as pacsv

        schema = compacted.pa_schema()
        opts = pacsv.ConvertOptions(column_types={f.name: f.type for f in schema})
        return pacsv.read_csv(pa.BufferReader(data), convert_options=opts, read_options=pacsv.ReadOptions(use_threads=False))
    return read_table(pa.BufferReader(data), content_type)


def _conform(table: pa.Table, schema: pa.Schema, source: str) -> pa.Table:
    """``table`` in ``schema``'s columns: missing ones null, changed types cast safely (refused if lossy)."""
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            if not field.nullable:
                raise FlashError(f"the new schema's column {field.name!r} is not nullable and the compacted rows lack it: make it nullable")
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise FlashError(
                    f"cannot cast column {field.name!r} of {source} from {column.type} to {field.type} ({reason}): "
                    "choose a new type the compacted values fit"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _check_export_dir(out: Path, overwrite: bool) -> None:
    """Refuse an export destination that is a file, or a non-empty directory without ``overwrite``."""
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise FlashError(f"export destination {out} cannot be a directory: {blocker} is a file; give --out a new or empty directory")
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise FlashError(
            f"export destination {out} is not empty: give --out a new or empty directory, or pass --overwrite "
            "(overwrite=True) to replace its contents"
        )


def _swap_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished export ``tmp`` to ``out``; with ``overwrite`` the old contents go as a whole."""
    target = out.resolve() if out.is_symlink() else out
    try:
        os.rename(tmp, target)  # atomic when ``out`` is missing or an empty directory
        return
    except OSError as exc:
        if not (overwrite and target.is_dir()) or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            if target.is_dir() and exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # filled by someone meanwhile
                raise FlashError(f"export destination {out} is not empty: pass --overwrite (overwrite=True) to replace it") from None
            raise
    old = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:12]}"
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)  # put the previous export back
        raise
    shutil.rmtree(old, ignore_errors=True)


def pq_write(table: pa.Table, path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink:
        write_table(table, sink, ContentType.PARQUET)


def recovery_hint(catalog_uri: str | None, table_id: str, partition: PartitionKeys, position: int) -> str:
    """The commands that unblock a stream stuck on the delta at ``position`` (shell-quoted, copy-pasteable)."""
    import shlex

    args = f"--catalog {shlex.quote(catalog_uri) if catalog_uri else '<lake URI>'} --table {shlex.quote(table_id)}"
    args += "".join(f" --partition {shlex.quote(n + '=' + ('<null>' if v is None else v))}" for n, v in partition)
    return (
        f"skip it: flash-compactor skip-delta {args} --position {position}, "
        f"or start a new stream version: flash-compactor new-stream {args}"
    )


def _check_against_stream(
    schema: pa.Schema, ref: _Reference, operation: str, source: str, table_id: str, partition: PartitionKeys
) -> None:
    reference = ref.columns
    deletes_only = ref.deletes_only
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
