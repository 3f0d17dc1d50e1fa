"""Which compacted version and which deltas a merge-on-read of one partition merges, with which keys: the
compacted version of the table or of its destination, the keys it recorded or those given, the deltas after it
(merge_on_read.py merges them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.model import UPSERT, CompactedVersion, Delta
from flash_pipeline.catalog.schema_names import map_names
from flash_pipeline.compactor.model.options import check_recorded_keys, parse_sort_keys
from flash_pipeline.compactor.planning.keys import (
    CompactedInto,
    inherited_sort_keys,
    keys_of_another_partition,
    upsert_columns,
)
from flash_pipeline.errors import FlashError, NotFound


@dataclass
class ReadPlan:
    """What one partition's read merges: a compacted version (or none) and the pending deltas after it."""

    partition: PartitionKeys
    compacted: CompactedVersion | None
    deltas: list[Delta]
    primary_keys: tuple[str, ...]
    sort_keys: tuple[tuple[str, str], ...]
    notes: list[str] = field(default_factory=list)
    source: str = ""  # the table whose stream is merged (a destination read names its source)

    def validate(self, where: str) -> None:
        """Every pending delta has the primary keys, and every upsert the sort keys: before a compaction, a sort key
        column a later upsert added (schema evolution) is null in the earlier ones, as compaction reads it."""
        added = {c["name"] for d in self.deltas if d.operation == UPSERT for c in d.schema} if not self.compacted \
            else ()
        for d in self.deltas:
            have = {c["name"] for c in d.schema}
            missing = [k for k in self.primary_keys if k not in have]
            if missing:
                raise FlashError(f"primary key column(s) {missing} missing from the {d.operation} delta at position "
                                 f"{d.position} of {where}")
            sk_missing = [n for n, _ in self.sort_keys if n not in have and n not in added]
            if d.operation == UPSERT and sk_missing:
                raise FlashError(f"sort key column(s) {sk_missing} missing from the upsert delta at position "
                                 f"{d.position} of {where}")


def plan_partition(
    cat: Catalog,
    table_id: str,
    part: PartitionKeys,
    primary_keys: Sequence[str] | None = None,
    sort_keys: Sequence[Any] | None = None,
    compacted_table_id: str | None = None,
    elsewhere: CompactedInto | None = None,
) -> ReadPlan:
    """Mirror of compact()'s choice of prior version and pending deltas for one partition stream. ``elsewhere``
    (no ``compacted_table_id``): where the source's partitions are compacted when not in place."""
    where = f"table {table_id!r} [{format_partition(part)}]"
    pk_given = tuple(sorted(set(primary_keys))) if primary_keys else None
    sk_given = tuple(parse_sort_keys(sort_keys)) if sort_keys is not None else None
    holder = compacted_table_id or table_id
    if compacted_table_id is not None:
        _require_destination(cat, compacted_table_id)
    compacted = cat.latest_compacted(holder, part) if cat.table_exists(holder) else None
    notes: list[str] = []
    own_unkeyed = compacted is None or not compacted.primary_keys  # an optimize-only version holds no keys either
    if own_unkeyed and compacted_table_id is None and elsewhere is not None and not (pk_given and sk_given is not None):
        through = _through_destination(cat, part, elsewhere, pk_given)
        if through is not None:
            holder, compacted = through
            notes.append(f"{table_id} is compacted into {holder}: merged through it "
                         "(--compacted-table names the table)")
    # the destination itself given as table_id reads through its source; a source read through a destination
    # whose latest version came from another source merges its own stream from the start (as compact rebuilds)
    source = compacted.source_table_id if compacted is not None and holder == table_id else table_id
    stream = cat.active_stream(source, part) if cat.table_exists(source) else None
    if compacted is not None and compacted.source_table_id != source:
        notes.append(f"compacted version {compacted.version} of {holder} came from {compacted.source_table_id}; "
                     f"merging {source}'s stream from its start")
        recorded = (compacted.primary_keys, compacted.sort_keys)
        compacted = None
    elif compacted is not None and stream is not None and stream.version != compacted.source_stream_version:
        notes.append(f"compacted version {compacted.version} is of stream v{compacted.source_stream_version}; reading "
                     f"stream v{stream.version}")
        recorded = (compacted.primary_keys, compacted.sort_keys)
        compacted = None
    else:
        recorded = (compacted.primary_keys, compacted.sort_keys) if compacted is not None else ((), ())
    # a partition without keys of its own (never compacted, or only packed by optimize) takes the table's keys,
    # as compact takes them
    unkeyed = compacted is None or not compacted.primary_keys
    wanted = not pk_given or sk_given is None  # sort keys not given follow the table's, as in compact
    sibling = keys_of_another_partition(cat, holder, part) if unkeyed and wanted and not recorded[0] else None
    sibling_keys = (sibling.primary_keys, sibling.sort_keys) if sibling is not None else None
    inherit: tuple[Any, Any] | None = None  # keys whose sort keys a read given primary keys alone takes (below)
    if compacted is not None and compacted.primary_keys:
        pks = pk_given or compacted.primary_keys
        sks = sk_given if sk_given is not None else compacted.sort_keys
        check_recorded_keys(compacted, pks, sks, where, "read with the recorded keys")
    elif compacted is not None and (pk_given or sibling is not None):
        # an unkeyed (optimize-only) version holds rows in no particular order: merge the stream from the start
        notes.append(f"compacted version {compacted.version} has no primary keys; merging the whole stream")
        compacted = None
        pks = pk_given if pk_given else sibling.primary_keys if sibling is not None else ()  # the branch: one of them
        if sk_given is not None:
            sks = sk_given
        elif pk_given:
            sks, inherit = None, sibling_keys  # decided below
        else:
            sks = sibling.sort_keys if sibling is not None else ()
    elif pk_given:
        pks, sks = pk_given, sk_given
        inherit = (recorded if recorded[0] else sibling_keys) if sk_given is None else None
    else:
        pks, recorded_sks = sibling_keys if sibling_keys is not None else recorded
        sks = sk_given if sk_given is not None else recorded_sks
    if sibling is not None and not pk_given:
        notes.append(f"no keys of its own: merged with the keys {holder} [{format_partition(sibling.partition)}] "
                     "records")
    after = compacted.last_position if compacted is not None else None
    deltas = cat.deltas(source, part, stream.version, after_position=after) if stream is not None else []
    deltas, compacted = map_names(cat, stream, deltas, compacted)  # columns renamed or dropped since (schema_names.py)
    if sks is None:  # primary keys given alone: the recorded sort keys where they apply, as compact decides
        sks = inherited_sort_keys(pks, inherit, upsert_columns(deltas))
    return ReadPlan(part, compacted, deltas, tuple(pks), tuple(sks), notes, source)


def _require_destination(cat: Catalog, compacted_table_id: str) -> None:
    """A misspelt destination would read every delta row, unmerged: refuse it, naming the tables there are."""
    if not cat.table_exists(compacted_table_id):
        raise NotFound(f"unknown compacted table {compacted_table_id!r} in catalog {cat.uri} (tables: "
                       f"{', '.join(cat.tables()) or 'none'}): name the table compact --destination wrote")


def _through_destination(cat: Catalog, part: PartitionKeys, elsewhere: CompactedInto,
                         pk_given: tuple[str, ...] | None) -> tuple[str, CompactedVersion | None] | None:
    """(destination, its latest version of ``part``) when a source compacted into another table (--destination)
    is read through it: its keys and compacted rows are there (read returned one row per delta row, duplicate
    keys and deletes ignored; so did a source optimize had packed before); primary keys given alone go through
    it only when it records the same ones. None: read the source itself."""
    dest = elsewhere.of(part)
    if dest is None:
        return None
    candidate = cat.latest_compacted(dest, part)
    recorded_there = candidate if candidate is not None else keys_of_another_partition(cat, dest, part)
    if recorded_there is not None and (not pk_given or set(pk_given) == set(recorded_there.primary_keys)):
        return dest, candidate
    return None
