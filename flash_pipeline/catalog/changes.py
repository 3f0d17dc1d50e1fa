"""The change feed: an ordered, append-only log per table of every commit that creates work or changes what a
reader shows, read from a position in O(changes since that position).

Layout (docs/catalog-layout.md, "Change feed")::

    tables/<T>/changes/<segment>/<seq>.json     one record per commit: seq 1, 2, 3, ... (20 digits)
    tables/<T>/changes/head.json                a hint of a recent seq (writers start their listing there)

``<segment>`` is ``seq // SEGMENT_SIZE`` (10 digits), so a listing never grows with the table's history: a reader
lists the one segment its position is in, from its position on (``StartAfter`` on S3), and the next one only
when that one is full.

Sequence numbers are taken like delta positions: a writer creates ``<seq>.json`` with an exclusive create and,
on losing, takes the next number. A number is created only after the one before it exists, so the feed has no
gaps and a reader that has seen ``n`` misses nothing by listing after ``n``. A record is written *after* the
commit it describes (delta manifest, compacted version manifest, skip marker): a crash in between leaves a
commit without a record, never a record without a commit. Readers heal such a gap: the next record of the same
stream makes its compaction pick up every pending delta (compaction reads the lake, not the feed), and the
new-delta sensor reconciles every partition against the lake now and then (sensors/feed_state.py).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from flash_pipeline.catalog.encoding import PartitionKeys, partition_component
from flash_pipeline.catalog.model import FORMAT_VERSION, dumps
from flash_pipeline.catalog.storage import overlapped
from flash_pipeline.errors import FlashError, NotFound

if TYPE_CHECKING:
    from flash_pipeline.catalog.model import CompactedVersion, Delta
    from flash_pipeline.catalog.storage import Storage


class TableDocuments(Protocol):
    """What a change feed needs of its catalog (catalog/tables.py's LakeTables, which owns the feed): where a
    table's documents live, and the one reader of catalog documents."""

    storage: "Storage"

    def table_prefix(self, table_id: str) -> str: ...

    def _read_json(self, key: str, parse: Callable[[dict[str, Any]], Any] | None = None) -> Any: ...

SEGMENT_SIZE = 10_000
SEQ_DIGITS = 20
SEGMENT_DIGITS = 10
# a writer rewrites the head hint every HINT_EVERY records: its listing then covers at most that many records
HINT_EVERY = 64
KINDS = ("delta", "compacted", "skip", "unskip")

log = logging.getLogger("flash_pipeline.changes")


@dataclass(frozen=True)
class Change:
    """One record of the feed. ``partition`` is the partition of the table whose feed holds it (for a compacted
    version, the destination's); ``position`` is the delta's (or skipped delta's) stream position, or the last
    source position a compacted version covers."""

    seq: int
    kind: str
    table_id: str
    partition: PartitionKeys
    stream_version: int | None
    position: int | None
    created_at: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def component(self) -> str:
        """The partition's folder name: a stable key per partition stream for readers that keep state."""
        return partition_component(self.partition)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Change":
        core = {"format", "seq", "kind", "table_id", "partition", "stream_version", "position", "created_at"}
        return cls(
            int(doc["seq"]), str(doc["kind"]), str(doc["table_id"]), tuple((n, v) for n, v in doc["partition"]),
            doc.get("stream_version"), doc.get("position"), float(doc.get("created_at", 0.0)),
            {k: v for k, v in doc.items() if k not in core},
        )


def segment_of(seq: int) -> int:
    return seq // SEGMENT_SIZE


class ChangeFeed:
    """The change feeds of one catalog's tables: writing records after commits, reading them from a position."""

    def __init__(self, catalog: TableDocuments) -> None:
        self.catalog = catalog
        self.storage = catalog.storage

    # ----- keys ---------------------------------------------------------------------------------------------
    def prefix(self, table_id: str) -> str:
        return f"{self.catalog.table_prefix(table_id)}/changes"

    def _segment_prefix(self, table_id: str, segment: int) -> str:
        return f"{self.prefix(table_id)}/{segment:0{SEGMENT_DIGITS}d}"

    def record_key(self, table_id: str, seq: int) -> str:
        return f"{self._segment_prefix(table_id, segment_of(seq))}/{seq:0{SEQ_DIGITS}d}.json"

    # ----- reading ------------------------------------------------------------------------------------------
    def _seqs_after(self, table_id: str, after: int, limit: int) -> list[int]:
        """Up to ``limit`` record numbers after ``after``, ascending: one listing per segment read (one in all
        when nothing is new); on a local disk, a look at each next key instead (numbers have no gaps, so the first
        missing one ends the feed): a stat costs microseconds, a listing reads the whole segment folder."""
        out: list[int] = []
        if self.storage.probes_are_cheap:
            while len(out) < limit and self.storage.exists(self.record_key(table_id, after + len(out) + 1)):
                out.append(after + len(out) + 1)
            return out
        segment = segment_of(after + 1)
        while len(out) < limit:
            start = f"{after:0{SEQ_DIGITS}d}.json" if segment_of(after) == segment else ""
            names = self.storage.list_children(self._segment_prefix(table_id, segment), start_after=start)
            seqs = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
            out += [s for s in seqs if s > after]
            if not seqs or max(seqs) < (segment + 1) * SEGMENT_SIZE - 1:
                break  # the segment is not full: nothing can follow it yet
            segment += 1
        return sorted(out)[:limit]

    def read(self, table_id: str, after: int = 0, limit: int = 10_000) -> list[Change]:
        """The records after position ``after`` (at most ``limit``), in order. Records are read on threads on an
        object store (one GET each)."""
        seqs = self._seqs_after(table_id, after, limit)
        return overlapped(self.storage, lambda s: self._read(table_id, s), seqs, "flash-changes")

    def _read(self, table_id: str, seq: int) -> Change:
        return self.catalog._read_json(self.record_key(table_id, seq), Change.from_json)

    def head(self, table_id: str) -> int:
        """The newest record number of the table's feed (0 for none): where a reader that wants only what comes
        next starts."""
        return self._last_seq(table_id, self._hint(table_id))

    def next_position(self, table_id: str, after: int, records: list[Change]) -> int:
        """Where a reader that read ``records`` after ``after`` continues: the last record read, else ``after``.
        A position past the feed's head (another lake's, a typo) is refused: echoed back, it would skip every
        record written until the feed reached it."""
        if records:
            return records[-1].seq
        head = self.head(table_id) if after > 0 else 0
        if after > head:
            raise FlashError(f"change feed position {after} of table {table_id!r} is past its head {head}: pass a "
                             f"position this feed gave (at most {head}; 0 reads it from the start)")
        return max(after, 0)

    # ----- writing ------------------------------------------------------------------------------------------
    def _hint(self, table_id: str) -> int:
        try:
            return int(json.loads(self.storage.read(f"{self.prefix(table_id)}/head.json"))["seq"])
        except NotFound:
            return 0
        except (ValueError, KeyError, TypeError):
            return 0  # a damaged hint costs a longer listing, nothing else

    def _last_seq(self, table_id: str, floor: int) -> int:
        """The newest record number after ``floor`` (``floor`` when none follows it): one listing when the writer's
        hint is recent."""
        seqs = self._seqs_after(table_id, floor, 1 << 62)
        return seqs[-1] if seqs else floor

    def append(self, table_id: str, kind: str, partition: PartitionKeys, stream_version: int | None,
               position: int | None, **details: Any) -> int:
        """Write one record at the next number (exclusive create; the loser of a race takes the next one) and
        return its number. A create whose answer was lost is retried with the same bytes, which counts as its own
        success when the first attempt landed, so a record is never written twice at two numbers."""
        if kind not in KINDS:
            raise FlashError(f"unknown change kind {kind!r}")
        doc = {"format": FORMAT_VERSION, "kind": kind, "table_id": table_id,
               "partition": [[n, v] for n, v in partition],
               "stream_version": stream_version, "position": position, "created_at": time.time(),
               "record_id": uuid.uuid4().hex, **details}
        seq = self._last_seq(table_id, self._hint(table_id)) + 1
        for _ in range(10_000):
            body = dumps({**doc, "seq": seq})
            if self._create(self.record_key(table_id, seq), body):
                if seq % HINT_EVERY == 0:
                    self.storage.write(f"{self.prefix(table_id)}/head.json", dumps({"seq": seq}))
                return seq
            seq = self._last_seq(table_id, seq) + 1
        raise FlashError(f"could not append to the change feed of table {table_id!r}: too many concurrent writers")

    def _create(self, key: str, body: bytes) -> bool:
        """An exclusive create whose outcome is decided by reading back: a lost answer is retried (same bytes)."""
        last: Exception | None = None
        for _ in range(5):
            try:
                return self.storage.create(key, body)
            except Exception as exc:  # noqa: BLE001 - the request may have landed: retry with the same bytes
                last = exc
                try:
                    return self.storage.read(key) == body
                except NotFound:
                    continue
                except Exception as again:  # noqa: BLE001 - cannot tell yet: retry the create itself
                    last = again
        raise FlashError(f"could not write change record {key}: {last}")

    def after_commit(self, table_id: str, kind: str, partition: PartitionKeys, stream_version: int | None,
                     position: int | None, **details: Any) -> int | None:
        """:meth:`append` for a commit that already happened: the commit stands whatever happens here, so a failure
        is logged, not raised (readers heal a missing record, see the module docstring)."""
        from flash_pipeline.faults import maybe_crash

        maybe_crash("feed:before_record")
        try:
            return self.append(table_id, kind, partition, stream_version, position, **details)
        except Exception as exc:  # noqa: BLE001 - the commit is done; a missing record is healed by readers
            log.warning("%s: committed, but its change record could not be written (%s); the sensors' reconciliation "
                        "will find it", table_id, exc)
            return None

    # ----- the records of each kind of commit ----------------------------------------------------------------
    def deltalake_committed(self, delta: "Delta") -> int | None:
        return self.after_commit(delta.table_id, "delta", delta.partition, delta.stream_version, delta.position,
                                 operation=delta.operation, files=len(delta.files), bytes=delta.bytes, rows=delta.rows,
                                 commit_id=delta.commit_id, committed_at=delta.created_at)

    def compacted_committed(self, version: "CompactedVersion") -> int | None:
        index = version.index
        return self.after_commit(
            version.table_id, "compacted", version.partition, version.source_stream_version, version.last_position,
            version=version.version, source_table_id=version.source_table_id, data_change=bool(version.data_change),
            rows=version.rows, files=len(version.files), bytes=version.bytes, commit_id=version.commit_id,
            committed_at=version.created_at, index_version=index.version if index is not None else None,
            hash_buckets=index.hash_bucket_count if index is not None else None,
            index_rows=index.live_rows if index is not None else 0, index_bytes=index.bytes if index is not None else 0,
        )

    def skip_changed(self, table_id: str, partition: PartitionKeys, stream_version: int, position: int,
                     skipped: bool) -> int | None:
        return self.after_commit(table_id, "skip" if skipped else "unskip", partition, stream_version, position)


__all__ = ["Change", "ChangeFeed", "KINDS", "SEGMENT_SIZE", "segment_of"]
