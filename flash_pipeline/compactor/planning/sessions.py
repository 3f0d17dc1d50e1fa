"""Planning a session: which deltas of one partition stream wait, with which keys and settings (no writes).

Everything a session needs is decided and validated here before any work starts: the compacted version it
builds on, the primary and sort keys (given, or recorded with the compacted table), each pending delta's
columns, the compacted schema and format. The result is a frozen ``SessionSpec``; the job then sizes it
(hash buckets, round budget) and runs it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import pyarrow as pa

from flash_pipeline.catalog.catalog import Catalog, recovery_hint
from flash_pipeline.catalog.commits import remove_finished_round_progress, remove_lost_attempts
from flash_pipeline.catalog.deletion_vectors import max_dead_fraction
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType, require_storable
from flash_pipeline.catalog.model import UPSERT, CompactedVersion, Delta, schema_to_b64
from flash_pipeline.catalog.physical_names import physical_view, plain
from flash_pipeline.catalog.schema_evolution import evolve, only_added
from flash_pipeline.compactor.kernels.digest import require_key_types, sort_key_width
from flash_pipeline.compactor.model.options import (
    DEFAULT_ROWS_PER_FILE,
    DEFAULT_ROWS_PER_INDEX_FILE,
    CompactOptions,
)
from flash_pipeline.compactor.model.plans import SessionSpec
from flash_pipeline.compactor.model.results import PartitionResult
from flash_pipeline.compactor.planning.keys import (
    TableKeys,
    compacted_elsewhere,
    resolve_keys,
    upsert_columns,
)
from flash_pipeline.errors import FlashError, SchemaConflict, StreamBlocked, UnreadableInput


@dataclass(frozen=True)
class PlannedSession:
    """A session ready to size and run: its spec, its pending deltas and the version it builds on."""

    spec: SessionSpec
    deltas: list[Delta]
    prior: CompactedVersion | None
    base_version: int  # the latest version number when planned: the session commits base_version + 1 first
    restartable: bool = True  # a compacted version of the active stream exists: new-stream can restart a blocked stream
    previous: CompactedVersion | None = None  # what the result's schema changes are told against (prior, or latest)


def plan_session(
    catalog: Catalog, table: str, options: CompactOptions, part: PartitionKeys, say: Callable[[str], None],
    siblings: "TableKeys | None" = None,
) -> PartitionResult | PlannedSession:
    """The session for ``part`` on the latest committed version, or its result if nothing is pending. ``siblings``
    (one per job) looks up the keys another partition records at most once for all the job's partitions."""
    destination = options.destination_compacted_table_id or table
    # a Delta commit whose writer died is completed before planning; the number to commit after and the version to
    # plan on come from one listing of the versions (one request fewer on S3): a commit landing after it makes
    # ours fail and re-plan
    with catalog.versions_listed_once():
        base_version = catalog.settle_compacted(destination, part)
        pending = catalog.pending(table, part, destination, rebuild=options.rebuild)
    if pending.stream is None:
        return PartitionResult(partition=part, status="no-stream")
    prior, latest = pending.base, pending.latest
    if latest is not None and latest.source_table_id and latest.source_table_id != table and not options.rebuild:
        raise _foreign_source(table, destination, part, latest)
    unkeyed = prior is None and not options.primary_keys and (latest is None or not latest.primary_keys)
    # a first compaction (or a rebuild) that is not given every key takes the rest from what the table records:
    # the sort keys too when only the primary keys are given (they once fell back to the stream position, so a
    # stale row could win in the new partition or the rebuilt version)
    needs_recorded = prior is None and (latest is None or not latest.primary_keys) and (
        not options.primary_keys or options.sort_keys is None)
    sibling = (siblings or TableKeys(catalog, destination)).of(part) if needs_recorded else None
    elsewhere = compacted_elsewhere(catalog, table, part, destination) if unkeyed and sibling is None else ()
    pks, sks = resolve_keys(destination, part, prior, options.primary_keys, options.sort_keys, sibling or latest,
                            elsewhere, upsert_columns(pending.deltas))
    if sibling is not None and (sks or not options.primary_keys):  # keys it took (given primary keys may take none)
        what = "sort key" if options.primary_keys else f"primary key {list(pks)} and sort key"
        say(f"{table} [{format_partition(part)}]: {what} {[n for n, _ in sks]} as recorded "
            f"by {destination} [{format_partition(sibling.partition)}] (a new partition of a keyed table)")
    if sibling is not None and sks and pending.deltas:
        _refuse_sibling_sort_keys(table, part, destination, sibling, sks, pending.deltas)
    if not pending.deltas:
        _tidy_up_to_date(catalog, table, destination, part, latest, base_version, pending.stream.version)
        return PartitionResult(partition=part, status="up-to-date", notes=list(pending.notes))
    deltas = pending.deltas
    # new-stream restarts from a compacted version of the active stream (any, keyed or packed by optimize): only
    # then do the lines of a blocked stream offer it
    restartable = (latest is not None and latest.source_table_id == table
                   and latest.source_stream_version == pending.stream.version)
    schema = validate_deltas(table, part, deltas, pks, sks, prior, catalog_uri=catalog.uri, restartable=restartable)
    content_type = (options.compacted_file_content_type
                    or (latest.content_type if latest is not None else ContentType.PARQUET))
    require_storable(schema, content_type, f"table {destination!r} [{format_partition(part)}]")
    has_upserts = any(d.operation == UPSERT for d in deltas) or (prior is not None and prior.rows > 0)
    if sks and (has_upserts or all(n in schema.names for n, _ in sks)):
        width = sort_key_width({f.name: f.type for f in schema}, list(sks), f"table {table!r}")
    else:  # no sort keys, or deletes only with nothing to keep: the first upsert fixes the width
        width = 0
    recorded = latest.options if latest is not None else {}
    spec = SessionSpec(
        source_table_id=table,
        destination_table_id=destination,
        partition=part,
        stream_version=pending.stream.version,
        primary_keys=pks,
        sort_keys=sks,
        sort_key_width=width,
        columns=tuple(schema.names),
        schema_b64=schema_to_b64(schema),
        rows_per_file=options.rows_per_compacted_file
        or int(recorded.get("rows_per_compacted_file", DEFAULT_ROWS_PER_FILE)),
        rows_per_index_file=options.rows_per_primary_key_index_file
        or int(recorded.get("rows_per_primary_key_index_file", DEFAULT_ROWS_PER_INDEX_FILE)),
        content_type=content_type,
        rebuild=options.rebuild,
        deletion_vectors=vectors_wanted(options.deletion_vectors, recorded, content_type),
        max_dead_fraction=max_dead_fraction(),
        # a file carries into the new version when every reader reads it right under the new schema by name:
        # not after a rename or drop (its columns have other names), nor a widening (catalog/schema_evolution.py)
        carry_prior=prior is None or not prior.arrow_schema
        or (only_added(prior.pa_schema(), schema) and physical_view(prior.pa_schema()) is None),
        schema_entry=max([d.schema_entry for d in deltas] + ([prior.schema_entry] if prior is not None else [])),
    )
    for n in pending.notes:
        say(f"{table} [{format_partition(part)}]: {n}")
    return PlannedSession(spec, deltas, prior, base_version, restartable, prior or latest)


def _foreign_source(table: str, destination: str, part: PartitionKeys, latest: CompactedVersion) -> FlashError:
    """Another source's compaction holds the destination: a session from scratch would commit this source's rows
    alone over it."""
    return FlashError(f"compacted table {destination!r} [{format_partition(part)}] holds the compaction of "
                      f"{latest.source_table_id!r} (version {latest.version}), not of {table!r}: compacting "
                      f"{table!r} into it would replace those rows; choose another --destination, or pass --rebuild "
                      "to replace them")


def _tidy_up_to_date(catalog: Catalog, table: str, destination: str, part: PartitionKeys,
                     latest: CompactedVersion | None, base_version: int, stream_version: int) -> None:
    """Housekeeping a killed session may have left on a stream with nothing to compact (its commit landed, its
    clean-up did not): the attempt folders of lost commits and the finished round progress."""
    newest = latest if latest is not None and latest.version == base_version else (
        catalog.compacted_version(destination, part, base_version) if base_version else None)
    if newest is not None:
        remove_lost_attempts(catalog, newest)
    remove_finished_round_progress(catalog, table, part, stream_version, destination, taken_through=base_version)


def vectors_wanted(asked: bool | None, recorded: dict, content_type: ContentType) -> bool:
    """Deletion vectors: as asked, else as recorded by the last version, else on for a new table: every reader the
    docs send users to applies them (docs/readers.md, measured); a table read by one that does not (deltalake's
    to_pyarrow_table, plain Spark on the file list) is compacted once with ``--deletion-vectors off``, which it then
    keeps. Tables compacted before this default recorded "off" and keep it. Parquet files only."""
    wanted = asked if asked is not None else bool(recorded.get("deletion_vectors", True))
    return wanted and content_type is ContentType.PARQUET


















def _columns(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


def _blocked(problem: str, *, catalog_uri: str | None, table_id: str, partition: PartitionKeys, position: int,
             restartable: bool = True) -> StreamBlocked:
    """The refusal of a delta that blocks its stream, ending with the commands that unblock it (new-stream only
    when a compacted version of the stream exists to start from)."""
    return StreamBlocked(f"{problem}; {recovery_hint(catalog_uri, table_id, partition, position, restartable)}",
                         table_id=table_id, partition=partition, position=position)


def unreadable_input_error(cause: UnreadableInput, *, catalog_uri: str, table_id: str, destination: str,
                           partition: PartitionKeys, restartable: bool = True) -> FlashError:
    """The job's one line for a file a round could not read: a delta's file blocks its stream until the delta is
    skipped or the stream restarts (StreamBlocked, with both commands); a compacted version's file is damage that
    ``verify`` names (IntegrityError)."""
    from flash_pipeline.catalog.compacted import damaged_compacted_file

    detail = str(cause)
    if cause.prior:
        return damaged_compacted_file(catalog_uri, destination, partition, "a file of the latest compacted version",
                                      detail)
    return _blocked(f"{table_id} [{format_partition(partition)}]: the delta at position {cause.position} cannot be "
                    f"read ({detail})",
                    catalog_uri=catalog_uri, table_id=table_id, partition=partition, position=cause.position,
                    restartable=restartable)


def _refuse_sibling_sort_keys(table: str, part: PartitionKeys, destination: str, sibling: CompactedVersion,
                              sks: tuple[tuple[str, str], ...], deltas: list[Delta]) -> None:
    """A new partition takes the table's keys from another partition; a sort key column none of its upserts has is
    not a bad delta (its appends were accepted: it records no keys yet) but keys that do not fit it. Say so, with
    the fix that keeps the table's keys, instead of the unknown-key line that offers skip-delta (dropping rows)."""
    columns = {c["name"] for d in deltas if d.operation == UPSERT for c in d.schema}
    absent = [n for n, _ in sks if n not in columns]
    if not absent or not columns:
        return
    raise FlashError(
        f"{table} [{format_partition(part)}] takes the table's keys from {destination} "
        f"[{format_partition(sibling.partition)}], but its sort key column(s) {absent} are in none of this "
        f"partition's deltas (its columns: {sorted(columns)}): append a delta that has them (an empty one will do: "
        "the earlier rows read them as null, which ranks below every value), then compact again; compacting it "
        "under keys of its own (--partition with --primary-key) would record other keys, which new partitions "
        "might take up")


def _refuse_unknown_keys(where: str, deltas: list[Delta], pks: tuple[str, ...], sks: tuple[tuple[str, str], ...],
                         prior: CompactedVersion | None) -> None:
    """Keys given for a table that records none yet, of which no pending delta has a column: a mistyped key name,
    not a bad delta. Say so, instead of blaming the first delta and offering to skip it (good data) or restart
    the stream. Keys a compacted version recorded (even an empty one) are the table's: a delta lacking them is a
    bad delta, and the per-delta checks name it with the commands that unblock the stream."""
    if prior is not None and prior.primary_keys:
        return
    known: set[str] = set(prior.pa_schema().names) if prior is not None and prior.arrow_schema else set()
    for d in deltas:
        known.update(c["name"] for c in d.schema)
    # delete deltas need only the primary key (their other columns, if any, prove nothing): sort keys are judged once
    # an upsert or a compacted version with rows (an empty one does not fix the columns) exists
    has_rows = prior is not None and bool(prior.arrow_schema) and prior.rows > 0
    judged_sks = [n for n, _ in sks] if has_rows or any(d.operation == UPSERT for d in deltas) else []
    unknown = [k for k in dict.fromkeys(list(pks) + judged_sks) if k not in known]
    if unknown:
        fix = ("append a delta that has them (an empty one will do: the earlier rows read them as null, which ranks "
               "below every value)" if not set(unknown) & set(pks) else "flash-compactor skip-delta, or new-stream")
        raise FlashError(f"key column(s) {unknown} are not columns of {where}: neither its pending deltas nor its "
                         f"compacted version have them (its columns: {sorted(known)}); check the key names given "
                         "(--primary-key / --sort-key; primary_keys / sort_keys in Python and tables.yaml) "
                         f"(they are case-sensitive; if they are right, the pending deltas lack them: {fix})")


def schema_start(prior: CompactedVersion | None, pks: Sequence[str]) -> pa.Schema | None:
    """The columns a compacted version fixes for the next one: its own, unless it is empty with only key columns
    (deletes only so far, no upsert known yet: the first upsert decides). An empty version whose rows were all
    deleted keeps its columns: the stream's schema still has them (schema evolution's union by name)."""
    if prior is None or not prior.arrow_schema:
        return None
    schema = prior.pa_schema()
    return schema if prior.rows or set(schema.names) - set(pks) else None


def validate_deltas(
    table_id: str,
    part: PartitionKeys,
    deltas: list[Delta],
    pks: tuple[str, ...],
    sks: tuple[tuple[str, str], ...],
    prior: CompactedVersion | None,
    catalog_uri: str | None = None,
    restartable: bool | None = None,
) -> pa.Schema:
    """Primary keys in every delta, sort keys in every upsert; returns the compacted schema.

    A bad delta blocks its stream until it is skipped or the stream restarts, so each refusal ends with the
    commands that do that (``catalog_uri`` makes them copy-pasteable)."""
    where = f"table {table_id!r} [{format_partition(part)}]"
    # an empty compacted version with only key columns (deletes only so far) does not fix the table's columns yet
    schema = schema_start(prior, pks)
    # thousands of small deltas usually share one schema: a delta whose recorded schema, column names and
    # operation passed these checks already is not checked again (0.08 s of planning for s4's 3,000 deltas)
    passed: set[tuple[str, str, frozenset[str]]] = set()
    # a sort key keeps its width once an index records it; before, its deltas may widen it (read casts them)
    fixed_width = [n for n, _ in sks if prior is not None and prior.index is not None and n in dict(prior.sort_keys)]
    _refuse_unknown_keys(where, deltas, pks, sks, prior)
    # a sort key column a later upsert added (schema evolution) is null in the earlier ones, as any added column,
    # and a null sort key ranks below every value: refused only when the keys are recorded (append refuses it)
    added = {c["name"] for d in deltas if d.operation == UPSERT for c in d.schema} if prior is None else set()
    for d in deltas:
        names = {c["name"] for c in d.schema}
        seen = (d.arrow_schema, d.operation, frozenset(names))
        if d.arrow_schema and seen in passed:
            continue
        missing = [k for k in pks if k not in names]
        blocked = functools.partial(_blocked, catalog_uri=catalog_uri, table_id=table_id, partition=part,
                                    position=d.position,
                                    restartable=prior is not None if restartable is None else restartable)
        if missing:
            raise blocked(f"primary key column(s) {missing} missing from the {d.operation} delta at position "
                          f"{d.position} of {where} (it has {sorted(names)})")
        if not d.arrow_schema:  # every append records it: a manifest without it was edited or written elsewhere
            raise blocked(f"the {d.operation} delta at position {d.position} of {where} records no Arrow schema "
                          "(field 'arrow_schema' of its manifest)")
        try:
            require_key_types(d.pa_schema(), pks, f"the {d.operation} delta at position {d.position} of {where}")
        except FlashError as exc:
            if prior is None:  # nothing compacted with these keys yet: the choice of key is what to change
                raise
            raise blocked(str(exc)) from None
        if d.operation == UPSERT:
            sk_missing = [n for n, _ in sks if n not in names and n not in added]
            if sk_missing:
                raise blocked(f"sort key column(s) {sk_missing} missing from the upsert delta at position {d.position} "
                              f"of {where}")
            s = d.pa_schema()
            if schema is None:
                schema = s
            elif {f.name: f.type for f in s} != {f.name: f.type for f in schema}:  # same columns and types, any order
                # the stream's schema evolved (catalog/schema_evolution.py): its appends accepted the change
                try:
                    schema = evolve(schema, s, upsert=True, source=f"the upsert delta at position {d.position}",
                                    where=where, sort_keys=fixed_width).schema
                except SchemaConflict as exc:
                    raise blocked(str(exc).removesuffix("; nothing was appended")) from None
        if d.arrow_schema:
            passed.add(seen)
    if schema is None and prior is not None and prior.arrow_schema:
        # deletes only, on an empty compacted version: it keeps its columns (Delta readers and export see them)
        schema = prior.pa_schema()
    if schema is None:  # deletes only and nothing compacted yet: an empty table with the key columns
        first = deltas[0].pa_schema()
        schema = pa.schema([first.field(k) for k in pks])
    return plain(schema)  # mapped schemas (renamed columns) carry their files' names: the version records none
