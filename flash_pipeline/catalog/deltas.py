"""The delta side of the catalog: appending a delta (staged, checked, committed by exclusive create of its
manifest), listing a stream's deltas (leaving out those a skip marker names: skip_markers.py), and the
per-stream schema document. A layer of ``Catalog`` (tables.py lists the layers)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from flash_pipeline.catalog import encoding
from flash_pipeline.catalog.append_schema import append_evolution, claim_schema_change, csv_files_in_stream_types
from flash_pipeline.catalog.checksums import checksum_of, checksum_of_file
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.files import ContentType, content_type_of, read_table, schema_to_json, write_table
from flash_pipeline.catalog.model import (
    DELETE,
    FORMAT_VERSION,
    OPERATIONS,
    UPSERT,
    DataFile,
    Delta,
    StreamVersion,
    dumps,
    schema_from_b64,
    schema_to_b64,
)
from flash_pipeline.catalog.recorded_keys import RecordedKeys
from flash_pipeline.catalog.schema_history import latest_entry, schema_evolution_enabled
from flash_pipeline.catalog.storage import overlapped
from flash_pipeline.catalog.validation import (
    POSITION_DIGITS,
    SchemaReference,
    StagedFile,
    check_against_stream,
    check_columns,
    check_csv_parse,
    columns_text,
    require_same_columns,
)
from flash_pipeline.errors import FlashError, InternalError, NotFound


class DeltaLog(RecordedKeys):
    """Deltas of partition streams, on the layers below (tables.py)."""

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
        keys = []
        for name in self.storage.list_children(prefix):
            if not name.endswith(".json"):
                continue
            position = int(name[: -len(".json")])
            if (after_position is not None and position <= after_position) or position in skipped:
                continue
            keys.append(f"{prefix}/{name}")
        # an object store answers each GET after a round trip: thousands of small deltas would pay them in turn
        return overlapped(self.storage, lambda key: self._read_json(key, Delta.from_json), keys, "flash-deltas")

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
        schema_evolution: bool | None = None,
        _into: StreamVersion | None = None,
    ) -> Delta:
        """Register ``files`` as ONE new delta at the next position of the partition's active stream.

        Every file is read and checked before anything is written; files are copied into the lake, so the
        sources may go away afterwards. Raises FlashError (lake unchanged) on bad input. ``csv_delimiter``
        parses CSV files (default ``,``); CSV files with another delimiter are stored as Parquet, since
        every reader of the lake parses stored CSV files with commas. The first upsert of a stream claims
        the stream's schema with an exclusive create (``schema.json``), so of two concurrent first appends
        with different columns exactly one wins. ``schema_evolution`` (default on): a delta that adds a column,
        leaves out a nullable one or brings a narrower or wider type of the same kind evolves the stream's schema
        (catalog/schema_evolution.py; the change is the stream's next schema entry, catalog/schema_history.py);
        off, its columns and types must be the stream's; None (default): the table's option, on unless
        ``evolve --schema-evolution off`` set it. ``_into`` targets a given (e.g. unreleased) stream version.
        """
        encoding.table_component(table_id)
        partition, recorded = self.partition_and_recorded_keys(table_id, normalize_partition(partition))
        if operation not in OPERATIONS:
            raise FlashError(f"unknown operation {operation!r}: use upsert or delete")
        if not files:
            raise FlashError(f"no files given for table {table_id!r}: pass at least one file to append")
        if csv_delimiter is not None and (len(csv_delimiter) != 1 or csv_delimiter in '\r\n"'):
            raise FlashError(f"invalid CSV delimiter {csv_delimiter!r}: give one character such as ';' or a tab")
        staged = [self._stage(i + 1, f, csv_delimiter) for i, f in enumerate(files)]
        stream, entry = self._stream_and_schema_entry(table_id, partition, operation, staged, schema_evolution, _into,
                                                     recorded)
        commit_id = uuid.uuid4().hex
        sprefix = self.stream_prefix(table_id, partition, stream.version)
        uploaded: list[str] = []
        attempt: tuple[str, bytes, Delta] | None = None  # the manifest create in flight
        try:
            data_files = self._upload_staged(staged, f"{sprefix}/files/{commit_id}", uploaded)
            schema = tuple(schema_to_json(staged[0].schema))
            while True:
                positions = self.delta_positions(table_id, partition, stream.version)
                position = (max(positions) + 1) if positions else 1
                delta = Delta(
                    table_id, partition, stream.version, position, operation, tuple(data_files), schema, commit_id,
                    time.time(), schema_to_b64(staged[0].schema), entry,
                )
                key = f"{sprefix}/deltas/{position:0{POSITION_DIGITS}d}.json"
                body = dumps(delta.to_json())
                attempt = (key, body, delta)
                if self.storage.create(key, body):
                    attempt = None
                    self.changes.deltalake_committed(delta)
                    return delta
                attempt = None
        except BaseException as exc:
            if attempt is not None:
                # The create failed without an answer (e.g. retries exhausted after the request reached the
                # store): the manifest may be committed. Never delete the files of a visible delta.
                if self._holds(attempt[0], attempt[1]):
                    if isinstance(exc, Exception):
                        self.changes.deltalake_committed(attempt[2])
                        return attempt[2]
                    raise
                # not there yet, or cannot tell: the request may still land (a delayed create, as commits guard
                # against), and a delta whose files were deleted would block the stream. Keep them: an orphan
                # file is invisible, a committed delta without its files is not.
                raise
            for key in uploaded:
                try:
                    self.storage.delete(key)
                except Exception:  # noqa: BLE001 - best effort; an orphan file is invisible anyway
                    pass
            raise

    def _stream_and_schema_entry(self, table_id: str, partition: PartitionKeys, operation: str,
                                 staged: list[StagedFile], schema_evolution: bool | None,
                                 into: StreamVersion | None, recorded: Any) -> tuple[StreamVersion, int]:
        """The stream the staged files go into (created if need be) and the schema entry their column names are
        in, once they passed its checks: a first upsert claims the stream's schema, a change claims the next
        entry (SchemaConflict, with nothing written, when they do not fit)."""
        checked = into if into is not None else self.active_stream(table_id, partition)
        reference = self._check_schemas(table_id, partition, operation, staged, checked, schema_evolution)
        stream = into if into is not None else self._ensure_active_stream(table_id, partition, recorded)
        if checked is None or checked.version != stream.version:  # the stream was created or replaced meanwhile
            reference = self._check_schemas(table_id, partition, operation, staged, stream, schema_evolution)
        entry = reference.entry if reference is not None else 0
        if operation == UPSERT and (reference is None or not reference.from_doc):
            entry = self._claim_stream_schema(stream, staged, schema_evolution) or 0
        elif reference is not None and reference.evolution is not None and reference.evolution.changed:
            entry = claim_schema_change(self, table_id, partition, operation, staged, stream, reference)
        return stream, entry

    def _upload_staged(self, staged: list[StagedFile], folder: str, uploaded: list[str]) -> list[DataFile]:
        """Copy the staged files into ``folder`` of the lake (each key joins ``uploaded`` once written, so that a
        failure removes exactly those); their DataFile entries with sizes and checksums."""
        data_files = []
        for s in staged:
            key = f"{folder}/{s.file_number}{s.content_type.extension}"
            if s.payload is not None:
                self.storage.write(key, s.payload)
                size = len(s.payload)
            else:
                if s.local_path is None:
                    raise InternalError(f"staged file {s.source} has neither bytes nor a path")
                size = self.storage.upload(s.local_path, key)
            uploaded.append(key)
            checksum = checksum_of(s.payload) if s.payload is not None else checksum_of_file(s.local_path or "")
            data_files.append(DataFile(s.file_number, key, s.rows, size, s.content_type, checksum))
        return data_files

    def _holds(self, key: str, body: bytes) -> bool | None:
        """Whether ``key`` holds exactly ``body`` (a create whose answer was lost landed), None if the store cannot
        tell: then the caller keeps its files (an orphan is invisible)."""
        try:
            return self.storage.read(key) == body
        except NotFound:
            return False
        except Exception:  # noqa: BLE001 - cannot tell
            return None

    def _stage(self, file_number: int, source: str | Path | pa.Table, csv_delimiter: str | None = None) -> StagedFile:
        if isinstance(source, pa.Table):
            check_columns(source.schema, f"<table {file_number}>")
            sink = pa.BufferOutputStream()
            write_table(source, sink, ContentType.PARQUET)
            return StagedFile(file_number, f"<table {file_number}>", ContentType.PARQUET, source.num_rows,
                              source.schema, sink.getvalue().to_pybytes(), None, nulls=_null_columns(source))
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
            raise FlashError(f"cannot read {path} as {content_type.value}: {reason}; fix or replace the file, nothing "
                             "was appended") from None
        check_columns(table.schema, str(path))
        delimiter = (csv_delimiter or ",") if content_type is ContentType.CSV else None
        if other_delimiter:  # stored CSV files are read with commas: keep the parsed table as Parquet instead
            sink = pa.BufferOutputStream()
            write_table(table, sink, ContentType.PARQUET)
            return StagedFile(file_number, str(path), ContentType.PARQUET, table.num_rows, table.schema,
                              sink.getvalue().to_pybytes(), None, delimiter, _null_columns(table))
        return StagedFile(file_number, str(path), content_type, table.num_rows, table.schema, None, path, delimiter,
                          _null_columns(table))

    def _check_schemas(
        self, table_id: str, partition: PartitionKeys, operation: str, staged: list[StagedFile],
        stream: StreamVersion | None, evolution: bool | None = None,
    ) -> "SchemaReference | None":
        """Check ``staged`` against each other, the stream's schema and the recorded primary keys (no writes);
        with ``evolution``, the reference says what the files change in the stream's schema."""
        reference = self._stream_upsert_schema(table_id, partition, stream) if stream is not None else None
        check_csv_parse(staged, reference)
        if reference is not None and reference.schema is not None:
            staged[:] = csv_files_in_stream_types(staged, reference.schema)
        first = staged[0]
        for s in staged[1:]:
            require_same_columns(first.schema, s.schema, f"file {s.source}", f"file {first.source}", table_id)
        if operation == DELETE:
            self._check_delete_keys(table_id, partition, staged)
        self._check_key_types(table_id, partition, staged)
        if reference is not None and reference.schema is not None and evolution is None:
            evolution = columns_text(staged[0].schema) == reference.columns or schema_evolution_enabled(self, table_id)
        if reference is not None and evolution and reference.schema is not None:
            reference.evolution = append_evolution(self, table_id, partition, operation, staged, reference)
        elif reference is not None:
            # a deletes-only stream's first upsert decides its schema (evolution on: keys that hold the deletes')
            evolving = reference.deletes_only and operation == UPSERT and schema_evolution_enabled(self, table_id) \
                if evolution is None else evolution
            for s in staged:
                check_against_stream(s.schema, reference, operation, s.source, table_id, partition, evolving)
        return reference

    def _stream_upsert_schema(self, table_id: str, partition: PartitionKeys,
                              stream: StreamVersion) -> "SchemaReference | None":
        """The stream's schema document; for streams without one (deletes only so far, or written before
        schema documents existed), the columns of its latest non-skipped upsert (or, failing that, delete)."""
        latest = latest_entry(self, stream)
        if latest is not None:
            return SchemaReference(columns_text(latest[1]), deletes_only=False, from_doc=True, schema=latest[1],
                                   entry=latest[0])
        prefix = f"{self.stream_prefix(table_id, partition, stream.version)}/deltas"
        skipped = self.skipped_positions(table_id, partition, stream.version)
        fallback = None
        for name in sorted(self.storage.list_children(prefix), reverse=True):
            if not name.endswith(".json") or int(name[:-5]) in skipped:
                continue
            delta = self._read_json(f"{prefix}/{name}", Delta.from_json)
            cols = (columns_text(delta.pa_schema()) if delta.arrow_schema
                    else {c["name"]: c["type"] for c in delta.schema})
            if delta.operation == UPSERT:
                return SchemaReference(cols, deletes_only=False, from_doc=False)
            fallback = fallback or SchemaReference(cols, deletes_only=True, from_doc=False)
        return fallback

    # ----- stream schema documents ------------------------------------------------------------------------
    def _schema_key(self, table_id: str, partition: PartitionKeys, stream_version: int) -> str:
        return f"{self.stream_prefix(table_id, partition, stream_version)}/schema.json"

    def stream_schema(self, table_id: str, partition: PartitionKeys, stream_version: int) -> pa.Schema | None:
        """The schema the stream's first upsert claimed (None before any upsert, or for an older stream)."""
        try:
            return self._read_json(self._schema_key(table_id, partition, stream_version),
                                   lambda d: schema_from_b64(d["arrow_schema"]))
        except NotFound:
            return None

    def _claim_stream_schema(self, stream: StreamVersion, staged: list[StagedFile],
                             evolution: bool | None = None) -> int:
        """Exclusive-create the stream's schema document. Losing to another first upsert: the files evolve the
        winner's schema (``evolution``), or must match it (a SchemaConflict). Returns the schema entry the
        files were recorded under."""
        schema = staged[0].schema
        doc = {
            "format": FORMAT_VERSION, "table_id": stream.table_id, "partition": [[n, v] for n, v in stream.partition],
            "stream_version": stream.version, "schema": schema_to_json(schema), "arrow_schema": schema_to_b64(schema),
            "commit_id": uuid.uuid4().hex, "created_at": time.time(),
        }
        if self.storage.create(self._schema_key(stream.table_id, stream.partition, stream.version), dumps(doc)):
            return 0
        winner = self.stream_schema(stream.table_id, stream.partition, stream.version)
        if winner is None:  # cannot happen: create only fails on an existing key
            raise FlashError(f"could not claim the schema of table {stream.table_id!r} "
                             f"[{format_partition(stream.partition)}]: append again")
        reference = SchemaReference(columns_text(winner), deletes_only=False, from_doc=True, schema=winner, entry=0)
        if evolution is None:
            evolution = schema_evolution_enabled(self, stream.table_id)
        if evolution:
            latest = latest_entry(self, stream)
            if latest is not None:
                reference.schema, reference.entry = latest[1], latest[0]
                reference.columns = columns_text(latest[1])
            reference.evolution = append_evolution(self, stream.table_id, stream.partition, UPSERT, staged, reference)
            return claim_schema_change(self, stream.table_id, stream.partition, UPSERT, staged, stream, reference)
        for s in staged:
            check_against_stream(s.schema, reference, UPSERT, s.source, stream.table_id, stream.partition)
        return 0





    # ----- skipped deltas ---------------------------------------------------------------------------------
    def skipped_positions(self, table_id: str, partition: PartitionKeys, stream_version: int) -> set[int]:
        """Positions of the stream marked skipped (one listing)."""
        prefix = f"{self.stream_prefix(table_id, partition, stream_version)}/skipped"
        return {int(n[:-5]) for n in self.storage.list_children(prefix) if n.endswith(".json") and n[:-5].isdigit()}


def _null_columns(table: pa.Table) -> frozenset[str]:
    """The columns of ``table`` that hold a null (Arrow keeps the count: no scan)."""
    return frozenset(name for name, column in zip(table.column_names, table.columns) if column.null_count)
