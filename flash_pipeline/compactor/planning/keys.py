"""Which keys a partition stream compacts with: the ones its compactions recorded, another partition's (keys
are the table's), or those given; and which other table a source was compacted into (no writes)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.model import UPSERT, CompactedVersion, Delta
from flash_pipeline.compactor.model.options import (
    check_recorded_keys,
)
from flash_pipeline.errors import FlashError

SIBLING_RECHECK_SECONDS = 2.0  # how long a TableKeys trusts "no partition records keys"


class TableKeys:
    """The table's keys as its partitions record them, looked up once and shared: a job, a read, an optimize or an
    ``auto`` asks for every partition, and reading every partition's versions once per partition was
    O(partitions^2) requests (144 s for a read of 50 partitions on an S3 endpoint). The first keyed partition (in
    partition order) serves every other partition. With ``recheck`` (reads and optimize), "no partition is keyed" is
    looked at again after ``SIBLING_RECHECK_SECONDS``, or ten times the last lookup's duration if longer (a walk of
    the partitions on a slow store must not repeat back to back): a compaction keying one while a long optimize
    runs must stop it packing the rest raw (keys, once recorded, stay). A job and ``auto`` look once. True or false
    (``pending(keyed=...)``), it says whether any partition records keys, looking only when asked."""

    def __init__(self, catalog: Catalog, table_id: str, recheck: bool = False) -> None:
        self.catalog, self.table_id, self.recheck = catalog, table_id, recheck
        self._lock = threading.Lock()
        self._found: CompactedVersion | None = None
        self._when: float | None = None  # monotonic time of the last lookup; None: never looked
        self._took = 0.0  # seconds the last lookup took

    def _first(self) -> CompactedVersion | None:
        with self._lock:
            trusted = max(SIBLING_RECHECK_SECONDS, 10 * self._took)
            if self._when is None or (self.recheck and self._found is None
                                      and time.monotonic() - self._when > trusted):
                start = time.monotonic()
                self._found = _first_keyed_partition(self.catalog, self.table_id, None)
                self._when = time.monotonic()
                self._took = self._when - start
            return self._found

    def of(self, part: PartitionKeys) -> CompactedVersion | None:
        """The latest keyed version of a partition other than ``part``, or None."""
        found = self._first()
        if found is not None and tuple(found.partition) == tuple(part):  # this partition's own: ask again, without it
            return _first_keyed_partition(self.catalog, self.table_id, part)
        return found

    def __bool__(self) -> bool:
        return self._first() is not None


@contextmanager
def sibling_keys_once(catalog: Catalog) -> Iterator[None]:
    """Inside, :func:`keys_of_another_partition` asks one :class:`TableKeys` per table (reads and optimize reach it
    through the merge-on-read layers, which do not carry it). Nested scopes share the outer one's; it ends with the
    outermost (keys another writer records later are found by the next command)."""
    if catalog._sibling_memo is not None:
        yield
        return
    catalog._sibling_memo = {}
    try:
        yield
    finally:
        catalog._sibling_memo = None


def keys_of_another_partition(catalog: Catalog, table_id: str, part: PartitionKeys) -> CompactedVersion | None:
    """The latest compacted version of another partition of ``table_id`` that records primary keys (the first in
    partition order), or None. Keys are the table's: a partition compacted (or read) for the first time without
    keys given takes them from its siblings, as every later compaction takes them from its own versions, instead
    of failing the whole table's job (compact) or returning one row per delta row (merge-on-read)."""
    memo = catalog._sibling_memo
    if memo is None:
        return _first_keyed_partition(catalog, table_id, part)
    keys = memo.get(table_id)
    if keys is None:
        keys = memo[table_id] = TableKeys(catalog, table_id, recheck=True)
    return keys.of(part)


def _first_keyed_partition(catalog: Catalog, table_id: str, part: PartitionKeys | None) -> CompactedVersion | None:
    if not catalog.table_exists(table_id):
        return None
    for other in catalog.partitions(table_id):
        if other == part:
            continue
        try:
            latest = catalog.latest_compacted(table_id, other)
        except Exception:  # noqa: BLE001 - a partition without compacted versions
            continue
        if latest is not None and latest.primary_keys:
            return latest
    return None


class CompactedInto:
    """Where a source's partitions are compacted when not in place (``compact --destination``), for a read or an
    optimize of the source: per partition, the table holding a keyed compaction of it; for a partition compacted
    nowhere, the destination of another of the source's partitions (its keys are the table's, as a sibling's
    are). The candidates are the source's recorded destinations (one listing: a table compacted nowhere pays
    nothing more), or every other table for a table created before they were recorded. Not shared between
    threads: read and optimize ask one partition at a time."""

    def __init__(self, catalog: Catalog, source: str) -> None:
        self.catalog, self.source = catalog, source
        self._tables: list[str] | None = None
        self.found: list[str] = []  # destinations seen, in the order found
        self._searched = False  # every partition of the source asked (for a partition compacted nowhere)

    def of(self, part: PartitionKeys) -> str | None:
        for table in self.found:
            if self.catalog.latest_compacted(table, part) is not None:
                return table
        hit = self._holder(part)
        if hit is not None:
            self.found.append(hit)
            return hit
        if not self.found and not self._searched and self._candidates():  # is another partition of the source?
            self._searched = True
            for other in self.catalog.partitions(self.source):
                held = self._holder(other) if tuple(other) != tuple(part) else None
                if held is not None:
                    self.found.append(held)
                    break
        return self.found[0] if self.found else None

    def _candidates(self) -> list[str]:
        if self._tables is None:  # listed once (compacted_elsewhere would list them per partition)
            self._tables = self.catalog.possible_destinations(self.source)
        return self._tables

    def _holder(self, part: PartitionKeys) -> str | None:
        rest = [t for t in self._candidates() if t not in self.found]
        held = compacted_elsewhere(self.catalog, self.source, part, self.source, rest) if rest else []
        return held[0] if held else None


def first_compacted_elsewhere(catalog: Catalog, source: str,
                              parts: Sequence[PartitionKeys]) -> tuple[PartitionKeys, str] | None:
    """The first of ``parts`` another table holds a keyed compaction of, with that table (for the notes of a
    command on a source compacted with --destination); one listing when the source records no destinations."""
    destinations = catalog.possible_destinations(source) if parts else []
    for part in parts if destinations else ():
        held = compacted_elsewhere(catalog, source, part, source, destinations)
        if held:
            return part, held[0]
    return None


def compacted_elsewhere(catalog: Catalog, source: str, part: PartitionKeys, destination: str,
                        tables: Sequence[str] | None = None) -> list[str]:
    """Other tables (of ``tables``, default every table) holding a keyed compacted version of ``source``'s
    partition (named in the error of a compaction into a table that records no keys: a user who forgot
    --destination; asked by reads and optimize through :class:`CompactedInto`)."""
    found = []
    # the source itself too when it is not the destination: a keyed compaction in place is the hint's "--destination S"
    for table in [source, *catalog.possible_destinations(source)] if tables is None else tables:
        if table == destination:
            continue
        try:
            latest = catalog.latest_compacted(table, part)
        except Exception:  # noqa: BLE001 - a table without this partition or without compacted versions
            continue
        if latest is not None and latest.source_table_id == source and latest.primary_keys:
            found.append(table)
    return found


def resolve_keys(
    destination: str,
    part: PartitionKeys,
    prior: CompactedVersion | None,
    pk_given: tuple[str, ...] | None,
    sk_given: tuple[tuple[str, str], ...] | None,
    latest: CompactedVersion | None = None,
    compacted_elsewhere: Sequence[str] = (),
    upsert_columns: Sequence[set[str]] = (),
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The session's keys: given ones, else those recorded with the compacted table.

    A session that builds on ``prior`` must use its keys (different ones need a rebuild). A session that starts
    from scratch (a rebuild, a new stream version) still inherits the keys recorded with ``latest`` when none
    are given, like every other setting; given the primary keys alone, the recorded sort keys (see
    :func:`inherited_sort_keys`; ``upsert_columns``: the columns of each pending upsert delta)."""
    where = f"compacted table {destination!r} [{format_partition(part)}]"
    others = (f", or compact into the table that already records them: --destination {compacted_elsewhere[0]}"
              if compacted_elsewhere else "")
    if prior is None:
        recorded = latest if latest is not None and latest.primary_keys else None
        if pk_given:  # sort keys not given again: the recorded ones (the same rule as every remembered setting)
            return pk_given, (sk_given if sk_given is not None
                              else inherited_sort_keys(pk_given, recorded, upsert_columns))
        if recorded is None:
            raise FlashError(f"no primary keys given and {where} has no compacted version that records them: "
                             f"pass --primary-key COL (and --sort-key COL if the latest row should not win){others}")
        return tuple(recorded.primary_keys), sk_given if sk_given is not None else tuple(recorded.sort_keys)
    pks = pk_given or prior.primary_keys
    sks = sk_given if sk_given is not None else prior.sort_keys
    check_recorded_keys(prior, pks, sks, where,
                        "use the recorded keys or pass --rebuild (rebuild=True) for a full rebuild")
    return tuple(pks), tuple(sks)


def upsert_columns(deltas: Sequence[Delta]) -> list[set[str]]:
    """The column names of each upsert delta (what :func:`inherited_sort_keys` checks sort keys against)."""
    return [{c["name"] for c in d.schema} for d in deltas if d.operation == UPSERT]


def inherited_sort_keys(pk_given: Sequence[str], recorded: CompactedVersion | tuple[Any, Any] | None,
                        upsert_columns: Sequence[set[str]] = ()) -> tuple[tuple[str, str], ...]:
    """The sort keys of a session (or read) given primary keys but no sort keys: the ones ``recorded`` (a version:
    the partition's own latest, or another partition's; or its (primary keys, sort keys)) when the given primary
    keys are the recorded ones and every upsert delta has the sort key columns; else none, the stream position.
    Other primary keys are another table's semantics, and data without the columns compacted without sort keys
    before they were inherited."""
    if isinstance(recorded, CompactedVersion):
        recorded = (recorded.primary_keys, recorded.sort_keys)
    if recorded is None or set(pk_given) != set(recorded[0]):
        return ()
    sks = tuple((str(n), str(d)) for n, d in recorded[1])
    if any(n not in columns for columns in upsert_columns for n, _ in sks):
        return ()
    return sks


def require_destination_partition_keys(catalog: Catalog, table: str, destination: str,
                                       partitions: Sequence[PartitionKeys]) -> None:
    """A compacted table holds one set of partition keys, in one order (catalog/tables.py records them): refuse,
    before any work, a source whose partitions have other keys than the destination it is compacted into (the
    commit would refuse only after every round had run). One read of the destination's record a job."""
    if destination == table or not partitions:
        return
    from flash_pipeline.errors import NotFound

    try:
        recorded = catalog.table_metadata(destination).get("partition_keys")
    except NotFound:
        return
    for part in partitions:
        names = [n for n, _ in part]
        if recorded is not None and names != recorded:
            raise FlashError(f"compacted table {destination!r} is partitioned by {recorded}, table {table!r} "
                             f"[{format_partition(part)}] by {names}: a compacted table has one set of partition "
                             f"keys in one order; compact {table!r} into another --destination (nothing was written)")
