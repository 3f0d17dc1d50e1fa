"""A lake's tables, partitions and partition streams on one Storage: the keys, the records and the files.

The lowest layer of ``Catalog`` (catalog.py), which builds up one layer per concern, each using only those
below it: ``LakeTables`` (here) -> ``CompactedVersions`` (compacted_versions.py: version numbers and
manifests) -> ``DeltaLakePublication`` (deltalake_table.py: the Delta Lake log of the compacted versions) ->
``IcebergPublication`` (iceberg_table.py: the same versions as Iceberg snapshots) ->
``RecordedKeys`` (recorded_keys.py: the keys compactions recorded, which appends are checked against) ->
``DeltaLog`` (deltas.py: appending and listing the paper's deltas) -> ``SkipMarkers`` (skip_markers.py: deltas
marked skipped) -> ``CompactedLog`` (compacted.py: committing, reading and exporting compacted versions, new
stream versions).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog import encoding
from flash_pipeline.catalog.changes import ChangeFeed
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.files import read_table, written_by_compactor
from flash_pipeline.catalog.model import ACTIVE, DataFile, StreamVersion, dumps
from flash_pipeline.catalog.schema_evolution import conform
from flash_pipeline.catalog.storage import Storage, overlapped
from flash_pipeline.catalog.uri import open_storage
from flash_pipeline.catalog.validation import VERSION_DIGITS
from flash_pipeline.errors import FlashError, NotFound

# what partition_and_recorded_keys returns for a table without a record (None is a record without partition keys)
NO_TABLE: Any = object()


class LakeTables:
    """Tables, partitions and partition streams of the lake under one storage root."""

    def __init__(self, storage: Storage | str | Path, **storage_options: Any) -> None:
        self.storage = storage if isinstance(storage, Storage) else open_storage(storage, **storage_options)
        self.changes = ChangeFeed(self)  # the per-table change feed every commit appends to (changes.py)

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
        return self._present(f"{self.table_prefix(table_id)}/table.json")

    def require_table(self, table_id: str) -> None:
        if not self.table_exists(table_id):
            known = ", ".join(self.tables()) or "none"
            raise NotFound(f"unknown table {table_id!r} in catalog {self.uri} (tables: {known}); append a delta first")

    def table_metadata(self, table_id: str) -> dict[str, Any]:
        """``table.json``; one without its ``table_id`` (every writer records it) is corrupt, as ``show`` says."""
        return self._read_json(f"{self.table_prefix(table_id)}/table.json", lambda d: d if str(d["table_id"]) else d)

    # ----- where a table is compacted into another (compact --destination) -----------------------------------
    @staticmethod
    def _destinations_prefix(source: str) -> str:
        """Beside ``tables/``, not under the source's folder: compacting into another table writes nothing there."""
        return f"destinations/{encoding.table_component(source)}"

    def _destination_key(self, source: str, destination: str) -> str:
        return f"{self._destinations_prefix(source)}/{encoding.table_component(destination)}.json"

    def record_destination(self, source: str, destination: str) -> None:
        """Record, before a compacted version of ``source`` is committed into ``destination``, that it may be:
        a reader of the source then asks its recorded destinations (one listing) instead of every table of the
        lake about every partition. Written before the commit and never deleted, so every committed version
        into another table has its record (a record whose commit lost points at a table holding nothing of the
        source, which readers check anyway)."""
        key = self._destination_key(source, destination)
        if not self._present(key):
            self.storage.create(key, dumps({"source_table_id": source, "destination_table_id": destination}))

    def destinations_of(self, source: str) -> list[str] | None:
        """The tables compactions of ``source`` were committed into (besides itself), from its destination
        records; None for a table created before they were kept (``destinations_recorded`` missing from its
        table.json), whose destinations only asking every table finds."""
        try:
            meta = self.table_metadata(source)
        except NotFound:
            return []  # no such table: nothing was compacted from it
        if not meta.get("destinations_recorded"):
            return None
        prefix = self._destinations_prefix(source)
        out = []
        for name in self.storage.list_children(prefix):
            stem = name[:-5] if name.endswith(".json") else None
            if stem is None:
                continue
            if stem.startswith("v"):  # an encoded ID decodes without a read; a hashed long one is read
                out.append(encoding.decode_string(stem))
            else:
                try:
                    out.append(self._read_json(f"{prefix}/{name}", lambda d: str(d["destination_table_id"])))
                except NotFound:
                    continue
        return sorted(t for t in out if t != source)

    def possible_destinations(self, source: str) -> list[str]:
        """The other tables that may hold a compaction of ``source``: its recorded destinations, or every other
        table of the lake for a table created before the records were kept."""
        recorded = self.destinations_of(source)
        return recorded if recorded is not None else [t for t in self.tables() if t != source]

    def partitions(self, table_id: str) -> list[PartitionKeys]:
        prefix = f"{self.table_prefix(table_id)}/partitions"

        def record(child: str) -> PartitionKeys | None:
            try:
                return self._read_json(f"{prefix}/{child}/partition.json",
                                       lambda d: tuple((n, v) for n, v in d["partition"]))
            except NotFound:
                return None

        # a GET a partition: overlapped on an object store (a table of 2,000 partitions, 2,000 round trips)
        out = [p for p in overlapped(self.storage, record, self.storage.list_children(prefix), "flash-partitions")
               if p is not None]
        return sorted(out, key=lambda p: [(n, "" if v is None else "\x01" + v) for n, v in p])

    def any_partition(self, table_id: str) -> PartitionKeys | None:
        """One partition of ``table_id`` (the first listed; None without any): one listing and one read, where
        ``partitions`` reads every partition's record."""
        prefix = f"{self.table_prefix(table_id)}/partitions"
        for child in self.storage.list_children(prefix):
            try:
                return self._read_json(f"{prefix}/{child}/partition.json",
                                       lambda d: tuple((n, v) for n, v in d["partition"]))
            except NotFound:
                continue
        return None

    def has_partition(self, table_id: str, partition: PartitionKeys) -> bool:
        return self._present(f"{self.partition_prefix(table_id, partition)}/partition.json")


    def require_partition(self, table_id: str, partition: PartitionKeys) -> None:
        self.require_table(table_id)
        if not self._present(f"{self.partition_prefix(table_id, partition)}/partition.json"):
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
        self.storage.write(f"{self.stream_prefix(stream.table_id, stream.partition, stream.version)}/stream.json",
                           dumps(new.to_json()))
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

    def partition_in_table_order(self, table_id: str, partition: PartitionKeys) -> PartitionKeys:
        """``partition`` with its keys in the order the table records (``d=1,r=eu`` is ``r=eu,d=1`` of a table
        partitioned by r, d); keys other than the table's are refused before anything is written: a second
        set of keys would split one logical partition into separate streams, each key its own row. Tables
        created before the record take any keys."""
        return self.partition_and_recorded_keys(table_id, partition)[0]

    def partition_and_recorded_keys(self, table_id: str, partition: PartitionKeys) -> tuple[PartitionKeys, Any]:
        """:meth:`partition_in_table_order`, and what the table's record holds: its partition keys (None for a
        table created before the record), or NO_TABLE. An append passes it on to :meth:`_ensure_table`, which then
        reads the record only if there was none: a table's partition keys never change once recorded."""
        try:
            recorded = self.table_metadata(table_id).get("partition_keys")
        except NotFound:
            return partition, NO_TABLE
        names = [n for n, _ in partition]
        if recorded is None or names == recorded:
            return partition, recorded
        if sorted(names) != sorted(recorded):
            shown = " ".join(f"--partition {n}=VALUE" for n in recorded) or "no --partition"
            raise FlashError(f"table {table_id!r} is partitioned by {recorded}, not {names}: give {shown} "
                             "(partition= in Python); nothing was written")
        values = dict(partition)
        return tuple((n, values[n]) for n in recorded), recorded

    def _ensure_table(self, table_id: str, partition: PartitionKeys, recorded: Any = NO_TABLE) -> None:
        """Create the table's record (its partition keys: this partition's) unless it exists, and check the
        partition's keys against the recorded ones, before the partition is created: of two first appends with
        other keys racing, the one whose record lost writes nothing. One read once the table exists, none when
        the caller passes the ``recorded`` keys it read (:meth:`partition_and_recorded_keys`)."""
        table_key = f"{self.table_prefix(table_id)}/table.json"
        names = [n for n, _ in partition]
        try:
            if recorded is NO_TABLE:
                recorded = self.table_metadata(table_id).get("partition_keys")
        except NotFound:
            self.storage.create(table_key, dumps({"table_id": table_id, "created_at": time.time(),
                                                  "destinations_recorded": True, "changes_recorded": True,
                                                  "partition_keys": names}))
            recorded = self.table_metadata(table_id).get("partition_keys")  # ours, or a racing writer's
        if recorded is not None and names != recorded:
            self.partition_in_table_order(table_id, partition)  # another set of keys: refused in its words
            raise FlashError(f"table {table_id!r} is partitioned by {recorded}, recorded by a concurrent first append "
                             "in another order: append again; nothing was written")
        part_key = f"{self.partition_prefix(table_id, partition)}/partition.json"
        if not self._present(part_key):
            self.storage.create(part_key, dumps({"table_id": table_id, "partition": [[n, v] for n, v in partition]}))

    def _ensure_active_stream(self, table_id: str, partition: PartitionKeys,
                              recorded: Any = NO_TABLE) -> StreamVersion:
        self._ensure_table(table_id, partition, recorded)
        stream = self.active_stream(table_id, partition)
        if stream is not None:
            return stream
        stream = StreamVersion(table_id, partition, 1, ACTIVE)
        self.storage.create(f"{self.stream_prefix(table_id, partition, 1)}/stream.json", dumps(stream.to_json()))
        found = self.active_stream(table_id, partition)
        if found is None:
            raise FlashError(f"table {table_id!r} partition {format_partition(partition)} has no active stream version")
        return found

    def read_file(self, data_file: DataFile, columns: Sequence[str] | None = None,
                  schema: pa.Schema | None = None) -> pa.Table:
        """One file of a delta or compacted version; pass the version's or delta's recorded ``schema``
        (``pa_schema()``) so that columns come back with their exact types in every format (CSV keeps none). A
        compacted file carried across a schema change that added columns (``DataFile.columns``) reads them as null."""
        if data_file.columns and schema is not None:
            wanted = list(columns) if columns is not None else schema.names
            has = set(data_file.columns)
            own = pa.schema([schema.field(c) for c in data_file.columns if c in schema.names])
            table = read_table(self.storage.arrow_source(data_file.key), data_file.content_type,
                               [c for c in wanted if c in has], own, written_by_compactor(data_file.key))
            return conform(table, schema, wanted)
        return read_table(
            self.storage.arrow_source(data_file.key), data_file.content_type, columns, schema,
            written_by_compactor(data_file.key)
        )

    def dead_rows(self, data_file: DataFile) -> np.ndarray:
        """Sorted rows of ``data_file`` its deletion vector marks dead (none without one)."""
        if data_file.deletion_vector is None:
            return np.zeros(0, dtype=np.int64)
        from flash_pipeline.catalog.deletion_vectors import read_dead_rows

        return read_dead_rows(self.storage, data_file.deletion_vector)

    def read_live(self, data_file: DataFile, columns: Sequence[str] | None = None,
                  schema: pa.Schema | None = None) -> pa.Table:
        """:meth:`read_file` with the file's deletion vector applied: the rows a reader of the version gets.
        (``read_file`` returns every row of the file: index pointers address those.)"""
        from flash_pipeline.catalog.deletion_vectors import drop_dead_rows

        return drop_dead_rows(self.read_file(data_file, columns, schema), self.dead_rows(data_file))

    def listing(self) -> list[str]:
        """Every key in the lake (tests compare it before and after a failed command)."""
        return self.storage.list("")

    # facts that cannot change once true, remembered inside `immutable_facts_read_once` (None: not inside)
    _immutable_memo: dict[tuple[Any, ...], Any] | None = None
    _sibling_memo: dict[str, Any] | None = None  # compactor/planning/keys.py's sibling_keys_once

    def _present(self, key: str) -> bool:
        """``storage.exists(key)`` for a key that is never deleted once created (a table's or a partition's record,
        a Delta log entry): a present one is remembered inside :meth:`immutable_facts_read_once`."""
        memo = self._immutable_memo
        if memo is not None and ("present", key) in memo:
            return True
        found = self.storage.exists(key)
        if found and memo is not None:
            memo[("present", key)] = True
        return found

    @contextmanager
    def immutable_facts_read_once(self) -> Iterator[None]:
        """Within the block, each version manifest is fetched at most once, and a Delta commit or a table's or
        partition's record found present is not asked for again: one compaction otherwise reads its base's
        manifest four times, asks for its Delta commit three times and for its table's record three times
        (requests on S3). These facts are immutable once true: a manifest is created exclusively and never
        rewritten or deleted (retention marks a version expired and keeps the manifest), and no Delta log entry
        or table or partition record is ever deleted. Absence is never remembered (a version not there yet is asked
        for again), and the scope is one job, not the catalog's life: a lake deleted and recreated at the same
        address under a long-lived catalog must not be answered from memory."""
        previous = self._immutable_memo
        self._immutable_memo = {} if previous is None else previous
        try:
            yield
        finally:
            self._immutable_memo = previous
