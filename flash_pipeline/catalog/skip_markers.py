"""Skip markers: a delta marked skipped (``skip_delta``) is ignored by compaction, merge-on-read and the
triggers (DeltaLog.deltas leaves it out); ``unskip_delta`` takes the mark back. A layer of ``Catalog`` above
``DeltaLog`` (tables.py lists the layers)."""

from __future__ import annotations

import time
import uuid

from flash_pipeline.catalog.deltas import DeltaLog
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.model import FORMAT_VERSION, StreamVersion, dumps
from flash_pipeline.catalog.validation import POSITION_DIGITS
from flash_pipeline.errors import FlashError, NotFound


class SkipMarkers(DeltaLog):
    """Marking the deltas of an active stream skipped, and taking the mark back."""

    def _skip_key(self, stream: StreamVersion, position: int) -> str:
        return (f"{self.stream_prefix(stream.table_id, stream.partition, stream.version)}/skipped/"
                f"{position:0{POSITION_DIGITS}d}.json")

    def _require_active_stream(self, table_id: str, partition: object,
                               fix: str) -> tuple[PartitionKeys, str, StreamVersion]:
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
            raise NotFound(f"no delta at position {position!r} of stream v{stream.version} of {where} ({span}): check "
                           "`flash-compactor show`")
        for table in sorted({table_id, *self.possible_destinations(table_id)}):
            # a compaction that died between its manifest and its Delta commit covers its positions all the same:
            # the next writer completes that commit (every writer settles before it plans), so settle it first
            try:
                self.settle_compacted(table, partition)
            except NotFound:
                continue
        for compacted in self.compactions_of(table_id, partition):
            if compacted.source_stream_version == stream.version and compacted.last_position >= position:
                raise FlashError(
                    f"compacted version {compacted.version} of {compacted.table_id!r} already covers position "
                    f"{position} of {where} (up to {compacted.last_position}): it can no longer be {verb}; append a "
                    "delta that corrects its rows, or start a new stream version"
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
            "stream_version": stream.version, "position": position, "commit_id": uuid.uuid4().hex,
            "created_at": time.time(),
        }
        created = self.storage.create(key, dumps(body))
        if created:
            self.changes.skip_changed(table_id, stream.partition, stream.version, position, True)
        return created

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
        self.changes.skip_changed(table_id, stream.partition, stream.version, position, False)
