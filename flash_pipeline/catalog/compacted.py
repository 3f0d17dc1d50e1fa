"""The compacted side of the catalog: compacted stream versions committed by exclusive create and read back,
which deltas wait (``pending``), export, and restarting a stream from its compacted rows. The top layer of
``Catalog`` (tables.py lists the layers)."""

from __future__ import annotations

import json
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from flash_pipeline.catalog import encoding
from flash_pipeline.catalog.deletion_vectors import drop_dead_rows
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.export_files import (
    check_export_dir,
    conform_exported,
    local_root,
    read_compacted_bytes,
    recorded_user_schema,
    require_local_dir,
    stored_schema,
    swap_into_place,
    write_exact,
)
from flash_pipeline.catalog.model import (
    ACTIVE,
    DEPRECATED,
    UNRELEASED,
    UPSERT,
    CompactedVersion,
    Delta,
    Pending,
    StreamVersion,
    dumps,
)
from flash_pipeline.catalog.schema_names import changes_since, map_names, renamed_columns
from flash_pipeline.catalog.skip_markers import SkipMarkers
from flash_pipeline.catalog.validation import INTERNAL_COLUMNS, check_columns, columns_match
from flash_pipeline.errors import CommitOutcomeUnknown, FlashError, IntegrityError, NotFound


def damaged_compacted_file(catalog_uri: str, table_id: str, partition: PartitionKeys, what: str,
                           reason: str) -> IntegrityError:
    """The one line (exit 4) for a file of a committed compacted version that cannot be read: damage, not bad
    input, with what to do. Said alike by compaction (planning/sessions.py) and every reader (committed_file)."""
    import shlex

    return IntegrityError(
        f"{table_id} [{format_partition(partition)}]: {what} cannot be read ({reason}); run flash-compactor verify "
        f"--catalog {shlex.quote(catalog_uri)} --table {shlex.quote(table_id)}, restore the file, or recompact from "
        "the source stream with --rebuild")


def user_columns(table: pa.Table, compacted: CompactedVersion) -> pa.Table:
    """``table`` without the compactor's internal columns (kept: the version's user schema, when recorded)."""
    names: list[str] = []
    if compacted.arrow_schema:
        names = compacted.pa_schema().names
    elif compacted.schema:
        names = [c["name"] for c in compacted.schema]
    recorded = set(names)
    keep = [n for n in table.column_names if n not in INTERNAL_COLUMNS and (not names or n in recorded)]
    return table if keep == table.column_names else table.select(keep)


# the listings of the innermost `versions_listed_once` block of each thread (.memo; absent or None: none)


@dataclass(frozen=True)
class NewStream:
    """What :meth:`Catalog.new_stream_from_compacted` did."""

    stream: StreamVersion  # the new, active stream version
    previous: StreamVersion  # the stream version it replaced (now deprecated)
    compacted: CompactedVersion | None  # whose rows the new stream starts from (None: the old stream was empty)
    delta: Delta | None  # the carried rows at position 1 (None when the compacted version was empty)
    not_carried: list[int]  # positions of the old stream after the compacted version's last position
    rewritten: bool  # True when the rows were rewritten (new schema, CSV, internal columns) instead of copied


class CompactedLog(SkipMarkers):
    """Committing, reading and exporting compacted stream versions (numbers and manifests: compacted_versions.py)."""

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
        written as Parquet (Feather where Parquet would change a type: write_exact). Without ``schema`` the rows
        keep the version's recorded types, so a file whose format stores a column widened is rewritten too. Deltas
        after the compacted version's last position are not carried (reported).
        Everything is read and checked before the first write; the new stream is created unreleased and
        activated once its first delta is committed."""
        import tempfile

        partition, where, active = self._require_active_stream(table_id, partition, "append a delta instead")
        compacted = self._restart_point(table_id, partition, where, active, compacted_table_id)
        if compacted is None:
            # nothing appended to it (a first append that died after claiming the stream's schema): the new
            # stream starts empty, and its first append claims the schema afresh
            stream = self.new_stream_version(table_id, partition, state=ACTIVE)
            return NewStream(stream, active, None, None, [], False)
        keys = list(compacted.primary_keys) + [n for n, _ in compacted.sort_keys]
        if schema is not None:
            check_columns(schema, "the new schema")
            missing = [k for k in keys if k not in schema.names]
            if missing:
                raise FlashError(
                    f"the new schema of {where} lacks the primary/sort key column(s) {missing} recorded by compacted "
                    f"version {compacted.version} of {compacted.table_id!r}: keep them"
                )
        pending = [d.position for d in self.deltas(table_id, partition, active.version,  # an empty one (evolve's)
                                                   after_position=compacted.last_position) if d.rows]  # holds none
        edits = changes_since(self, active, compacted)  # evolve --rename/--drop since: the rows carried under them
        with tempfile.TemporaryDirectory(prefix="flash-new-stream-") as tmp:
            paths: list[str] = []
            rewritten = False
            for f in sorted(compacted.files, key=lambda f: f.file_number):
                if f.live_rows == 0:
                    continue
                with self.committed_file(compacted, f):
                    data = self.storage.read(f.key)
                    table = read_compacted_bytes(data, f.content_type, compacted)  # each column in its recorded type
                    dead = self.dead_rows(f)
                    stored = stored_schema(data, f.content_type)  # as the file gives its columns back without a schema
                table = drop_dead_rows(table, dead)  # rows a vector marks dead are not carried (rewritten below)
                users = user_columns(table, compacted)
                # the recorded types: a format may store a column widened (Parquet timestamp[s] as ms, ORC uint64
                # as int64), and the new stream must record the table's own types, not the stored ones
                recorded = recorded_user_schema(compacted, users.schema)
                users = renamed_columns(users, edits)
                target = schema if schema is not None else renamed_columns(recorded.empty_table(), edits).schema
                if (stored is not None and not len(dead) and users.num_columns == table.num_columns
                        and columns_match(users.schema, target) and columns_match(stored, target)):
                    path = Path(tmp) / f"{f.file_number}{f.content_type.extension}"
                    path.write_bytes(data)  # the very bytes of the compacted file
                else:
                    rewritten = True
                    path = write_exact(conform_exported(users, target, f.key), Path(tmp), str(f.file_number))
                paths.append(str(path))
            stream = self.new_stream_version(table_id, partition, state=UNRELEASED)
            delta = self.append(table_id, partition, UPSERT, paths, _into=stream) if paths else None
        stream = self.set_stream_state(stream, ACTIVE)
        for old in self.streams(table_id, partition):
            if old.state == ACTIVE and old.version != stream.version:
                self.set_stream_state(old, DEPRECATED)
        return NewStream(stream, active, compacted, delta, pending, rewritten)

    def _restart_point(self, table_id: str, partition: PartitionKeys, where: str, active: StreamVersion,
                       compacted_table_id: str | None) -> CompactedVersion | None:
        """The compacted version of the active stream a new stream starts from; None when the stream holds no
        delta at all (nothing to start from). Refused without one, or with several and no ``compacted_table_id``."""
        every = self.compactions_of(table_id, partition)
        if compacted_table_id is not None:
            every = [c for c in every if c.table_id == compacted_table_id]
        candidates = [c for c in every if c.source_stream_version == active.version]
        if not candidates and not self.delta_positions(table_id, partition, active.version):
            return None
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
        return candidates[0]

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
                f"compacted version {base.version} came from {base.source_table_id} stream "
                f"v{base.source_stream_version}; rebuilding from stream v{stream.version}"
            )
            base = None
        if base is not None and not base.primary_keys and keyed:  # keyed last: it may be a lookup (triggers._TableKeys)
            notes.append(f"compacted version {base.version} was packed without primary keys (optimize); compacting "
                         "from the stream's start")
            base = None
        after = base.last_position if base is not None else None
        deltas = self.deltas(table_id, partition, stream.version, after_position=after) if stream is not None else []
        base = base if stream is not None else None
        deltas, base = map_names(self, stream, deltas, base)  # columns renamed or dropped since (schema_names.py)
        return Pending(stream, latest, base, deltas, tuple(notes))





    def prepare_compacted_commit(self, version: CompactedVersion) -> CompactedVersion:
        """What a commit checks and records before its create (the table's documents, the source's destination, the
        flags every writer's manifest gets): a failure here (a corrupt ``table.json``) sends nothing, so the attempt
        is known uncommitted and its files go (commits.Attempt)."""
        self._ensure_table(version.table_id, version.partition)
        if version.source_table_id != version.table_id:  # before the commit: a reader of the source finds it
            self.record_destination(version.source_table_id, version.table_id)
        # decided here for every writer (a rehash copies its prior's manifest, flag included)
        version = version.replace(delta_log=self.deltalake_blocker(version) is None)
        return self.declare_features(version)

    def commit_compacted(self, version: CompactedVersion, prepared: bool = False) -> bool:
        """Publish ``version`` at exactly ``version.version`` if that number is free; True if it is ours.

        The caller builds ``version.version`` as its base version + 1, so a writer whose base moved loses
        instead of committing over (or after) a version it never saw. The outcome is decided by reading the
        manifest back and comparing commit ids, never by an exception alone: a create whose response was lost
        may well have been applied. Raises :class:`CommitOutcomeUnknown` when even the read-back fails; the
        caller must then keep the attempt's files (they may be committed). ``prepared``: the version comes from
        :meth:`prepare_compacted_commit` already.
        """
        if not prepared:
            version = self.prepare_compacted_commit(version)
        key = self.version_key(version.table_id, version.partition, version.version)
        failure: Exception | None = None
        created = False  # the create alone is tried: a publication failing after it is no failed create
        try:
            created = self.storage.create(key, dumps(version.to_json()))  # ours now, or found holding our bytes
        except Exception as exc:  # noqa: BLE001 - the request may have reached the store: read back below
            failure = exc
        outcome: bool | None = True if created else self.commit_outcome(version)
        if outcome is False and failure is not None and not self.storage.exists(key):
            # nobody holds the number and our create failed without an answer: it may still land (a delayed
            # request), so this attempt must not be treated as lost and its files must not be deleted
            outcome = None
        if outcome:
            try:
                self._publish_committed(version)
            finally:  # committed whatever its publication did: the feed records it
                self.changes.compacted_committed(version)
        if outcome is None:
            raise CommitOutcomeUnknown(
                f"could not tell whether compacted version {version.version} of {version.table_id!r} "
                f"[{format_partition(version.partition)}] was committed ({type(failure or Exception()).__name__}); "
                "its files are kept: run `flash-compactor show` and `verify`, then compact again"
            ) from failure
        return outcome

    def _publish_committed(self, version: CompactedVersion) -> None:
        """The Delta commit of a version whose manifest is ours (what makes it visible, deltalake_table.py), then
        its Iceberg snapshot (iceberg_table.py). A failure of either leaves that table a version behind until the
        partition's next commit completes it, and says so."""
        if not version.delta_log:
            return
        from flash_pipeline.catalog.deltalake_table import DeltaLakePublicationPending
        from flash_pipeline.catalog.iceberg_table import IcebergPublicationPending
        from flash_pipeline.faults import maybe_crash

        maybe_crash("commit:before_delta")
        _publish_or_pending(version, self.publish_deltalake, DeltaLakePublicationPending, "Delta commit", "readers")
        maybe_crash("commit:after_delta")
        _publish_or_pending(version, self.publish_iceberg, IcebergPublicationPending, "Iceberg snapshot",
                            "Iceberg readers")
        maybe_crash("commit:after_iceberg")

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

    @contextmanager
    def committed_file(self, version: CompactedVersion, data_file: Any) -> Iterator[None]:
        """Reads of a file of a committed compacted version (or of its deletion vector) inside: one that is gone
        or cannot be read is damage, not bad input -- IntegrityError (exit 4) naming the file and what to do, as
        compaction says it (compactor/planning/sessions.py unreadable_input_error)."""
        try:
            yield
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, pa.ArrowKeyError, NotFound) as exc:
            reason = " ".join(str(exc).split())
            # the key once
            reason = reason[len(data_file.key):].lstrip(": ") if reason.startswith(data_file.key) else reason
            raise damaged_compacted_file(self.uri, version.table_id, version.partition,
                                         f"file {data_file.key} of compacted version {version.version}",
                                         reason[:200]) from None

    def read_committed(self, version: CompactedVersion, data_file: Any, columns: Any = None,
                       schema: pa.Schema | None = None, live: bool = True) -> pa.Table:
        """``read_live`` (``read_file`` with ``live=False``) of a file of a committed compacted version, its
        damage reported as such (``committed_file``)."""
        with self.committed_file(version, data_file):
            read = self.read_live if live else self.read_file
            return read(data_file, columns, schema)


    def export(self, table_id: str, out_dir: str | Path, partition: object | None = None, *, overwrite: bool = False,
               version: int | None = None) -> list[Path]:
        """Write the latest compacted rows (user columns only) as Parquet files into ``out_dir``; with ``version``
        (one partition's, so ``partition`` is needed when the table has several) that retained version's rows.

        ``out_dir`` must be new or empty unless ``overwrite``, which replaces its whole contents: a stale file
        left beside the new ones would bring deleted rows back for a reader of the directory. The export is
        written into a temporary directory beside ``out_dir`` and renamed into place, so a failure or crash
        never leaves a half export there (at worst a hidden ``.<name>.export-*`` directory beside it)."""
        import pyarrow.parquet as pq

        require_local_dir(out_dir)
        out = Path(out_dir).expanduser()
        check_export_dir(out, overwrite, lake_root=local_root(self.storage))
        self.require_table(table_id)
        parts = self.partitions(table_id)
        if partition is not None:
            wanted = normalize_partition(partition)
            self.require_partition(table_id, wanted)
            parts = [wanted]
        chosen = {part: self._exported_version(table_id, part, version, len(parts)) for part in parts}
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent.absolute() / f".{out.name}.export-{uuid.uuid4().hex[:12]}"  # absolute: "a:/b" is no URI
        tmp.mkdir()
        written = []
        try:
            for part in parts:
                compacted = chosen[part]
                if compacted is None:
                    continue
                component = encoding.partition_component(part)
                for f in compacted.files:
                    table = user_columns(self.read_committed(
                        compacted, f, schema=compacted.pa_schema() if compacted.arrow_schema else None), compacted)
                    if table.num_rows == 0:
                        continue
                    (tmp / component).mkdir(exist_ok=True)
                    name = f"part-{f.file_number:05d}.parquet"
                    pq.write_table(table, tmp / component / name)
                    written.append(out / component / name)
            swap_into_place(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return written

    def _exported_version(self, table_id: str, part: PartitionKeys, version: int | None,
                          partitions: int) -> CompactedVersion | None:
        """The version ``export`` writes: the latest visible one, or the retained ``version`` asked for."""
        if version is None:
            return self.latest_compacted(table_id, part)
        if partitions != 1:
            raise FlashError(f"{table_id!r} has {partitions} partitions and versions are per partition: name one with "
                             "--partition")
        latest = self.latest_compacted(table_id, part)
        live = [n for n in self.compacted_versions(table_id, part) if latest is not None and n <= latest.version]
        if version not in live:
            raise FlashError(
                f"compacted version {version} of {table_id!r} [{format_partition(part)}] is not retained "
                f"(retained: {', '.join(map(str, live)) or 'none'}): choose one of those"
            )
        return self.compacted_version(table_id, part, version)


def _publish_or_pending(version: CompactedVersion, publish: Any, pending: type[FlashError], what: str,
                        readers: str) -> None:
    """``publish(version)`` of a committed version; an unexpected failure becomes ``pending`` naming the version
    and how it completes (the version itself stays committed)."""
    try:
        publish(version)
    except FlashError:
        raise
    except Exception as exc:  # noqa: BLE001 - the version is committed: say so, and how it completes
        raise pending(
            f"compacted version {version.version} of {version.table_id!r} [{format_partition(version.partition)}] "
            f"is committed but its {what} failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); {readers} see the version before until the next "
            "compaction, optimize or rehash of the partition completes it"
        ) from exc
