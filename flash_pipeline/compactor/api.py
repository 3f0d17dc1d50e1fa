"""The paper's Python API: ``compact()`` -- one compaction job run, one session per partition stream."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import retry_on_moved_base
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.files import ContentType, require_storable
from flash_pipeline.catalog.model import UPSERT, CompactedVersion, Delta, schema_to_b64
from flash_pipeline.compactor import latency
from flash_pipeline.compactor.digest import require_key_types, sort_key_width
from flash_pipeline.compactor.events import EventPublisher
from flash_pipeline.compactor.planner import choose_bucket_count, default_round_budget
from flash_pipeline.compactor.result import CompactionResult, PartitionResult
from flash_pipeline.compactor.session import SessionSpec, run_session
from flash_pipeline.errors import FlashError

STREAM_POSITION = "__stream_position__"
DEFAULT_ROWS_PER_FILE = 4_000_000  # the paper's defaults
DEFAULT_ROWS_PER_INDEX_FILE = 38_000_000
DEFAULT_SORT_KEYS: list[tuple[str, str]] = [(STREAM_POSITION, "ascending")]


def parse_sort_keys(sort_keys: Iterable[Any] | None) -> tuple[tuple[str, str], ...]:
    """Accept (name, direction) pairs or ``name[:direction]`` strings; the virtual stream position is implicit."""
    out = []
    for item in sort_keys or ():
        if isinstance(item, str):
            name, _, direction = item.partition(":") if ":" in item else (item, "", "ascending")
            direction = direction or "ascending"
        else:
            name, direction = item
        if name == STREAM_POSITION:
            if direction != "ascending":
                raise FlashError("the stream position sort key can only be ascending (the latest delta wins)")
            continue
        out.append((str(name), str(direction)))
    return tuple(out)


def compact(
    source_table_id: str,
    primary_keys: Iterable[str] | None = None,
    sort_keys: Sequence[Any] | None = None,
    desired_sla: float | None = None,
    catalog: Catalog | str | Path | None = None,
    destination_compacted_table_id: str | None = None,
    rows_per_primary_key_index_file: int | None = None,
    rows_per_compacted_file: int | None = None,
    hash_bucket_count: int | None = None,
    sns_event_topic_arn: str | None = None,
    compacted_file_content_type: ContentType | str | None = None,
    *,
    delta_catalog_client: Catalog | str | Path | None = None,
    partitions: Sequence[Any] | None = None,
    rebuild: bool = False,
    num_cpus: int | None = None,
    ray_address: str | None = None,
    max_round_bytes: int | None = None,
    progress: Callable[[str], None] | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> CompactionResult:
    """Compact every partition stream of ``source_table_id`` that has new deltas.

    Each partition stream gets its own session; sessions run concurrently. Primary and sort keys are recorded
    with the compacted table at its first compaction and may be omitted later; different keys are refused
    unless ``rebuild=True`` (a full rebuild from the source stream). Rows per compacted file and per index file
    (defaults 4,000,000 and 38,000,000, the paper's) are recorded the same way and inherited when not given.
    All validation happens before any write. Each session commits exactly the version after the one it
    planned on; when another writer committed first, the session re-plans on the new latest version (bounded,
    logged through ``progress``) and finally raises CommitConflict (exit 3) naming the partition and winner.
    ``progress`` receives human-readable lines; ``on_round`` receives a dict per committed round (round, rounds,
    compacted_version, last_position, rows, files_written, files_carried, elapsed_seconds, expected_seconds).
    """
    from flash_pipeline.compactor.ray_runtime import cluster_cpus, cluster_memory, ensure_ray

    started = time.perf_counter()
    say = progress or (lambda message: print(message, file=sys.stderr))
    cat = catalog if catalog is not None else delta_catalog_client
    if cat is None:
        raise FlashError("compact() needs a catalog: pass catalog=Catalog('path or s3://bucket/prefix')")
    cat = cat if isinstance(cat, Catalog) else Catalog(cat)
    # None: the format recorded with the compacted table, or Parquet (the paper's default) for a new one
    requested_type = ContentType.parse(compacted_file_content_type) if compacted_file_content_type is not None else None
    for given in (rows_per_compacted_file, rows_per_primary_key_index_file):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
            raise FlashError("rows per compacted file and rows per index file must be positive integers")
    publisher = EventPublisher(sns_event_topic_arn)
    destination = destination_compacted_table_id or source_table_id
    cat.require_table(source_table_id)
    wanted = [normalize_partition(p) for p in partitions] if partitions else None
    if wanted:
        for p in wanted:
            cat.require_partition(source_table_id, p)
    pk_given = tuple(sorted(set(primary_keys))) if primary_keys else None
    sk_given = parse_sort_keys(sort_keys) if sort_keys is not None else None

    # --- plan every session and validate everything before any work --------------------------------------
    def plan_partition(part: PartitionKeys) -> PartitionResult | tuple[SessionSpec, list[Delta], CompactedVersion | None]:
        """The session for ``part`` on the latest committed version, or its result if nothing is pending."""
        stream = cat.active_stream(source_table_id, part)
        if stream is None:
            return PartitionResult(partition=part, status="no-stream")
        latest = cat.latest_compacted(destination, part)
        base_version = cat.latest_version_number(destination, part)
        prior = None if rebuild else latest
        notes = []
        if prior is not None and (prior.source_table_id != source_table_id or prior.source_stream_version != stream.version):
            notes.append(
                f"compacted version {prior.version} came from {prior.source_table_id} stream v{prior.source_stream_version}; "
                f"rebuilding from stream v{stream.version}"
            )
            prior = None
        if prior is not None and not prior.primary_keys:
            notes.append(f"compacted version {prior.version} was packed without primary keys (optimize); compacting from the stream's start")
            prior = None
        pks, sks = _resolve_keys(destination, part, prior, pk_given, sk_given, latest)
        after = prior.last_position if prior is not None else None
        deltas = cat.deltas(source_table_id, part, stream.version, after_position=after)
        if not deltas:
            return PartitionResult(partition=part, status="up-to-date", notes=notes)
        schema = _validate_deltas(source_table_id, part, deltas, pks, sks, prior, catalog_uri=cat.uri)
        content_type = requested_type or (latest.content_type if latest is not None else ContentType.PARQUET)
        require_storable(schema, content_type, f"table {destination!r} [{format_partition(part)}]")
        has_upserts = any(d.operation == UPSERT for d in deltas) or (prior is not None and prior.rows > 0)
        if sks and (has_upserts or all(n in schema.names for n, _ in sks)):
            width = sort_key_width({f.name: f.type for f in schema}, list(sks), f"table {source_table_id!r}")
        else:  # no sort keys, or deletes only with nothing to keep: the first upsert fixes the width
            width = 0
        recorded = latest.options if latest is not None else {}
        spec = SessionSpec(
            source_table_id=source_table_id,
            destination_table_id=destination,
            partition=part,
            stream_version=stream.version,
            primary_keys=pks,
            sort_keys=sks,
            sort_key_width=width,
            columns=tuple(schema.names),
            schema_b64=schema_to_b64(schema),
            rows_per_file=rows_per_compacted_file or int(recorded.get("rows_per_compacted_file", DEFAULT_ROWS_PER_FILE)),
            rows_per_index_file=rows_per_primary_key_index_file
            or int(recorded.get("rows_per_primary_key_index_file", DEFAULT_ROWS_PER_INDEX_FILE)),
            content_type=content_type,
            bucket_count=0,
            max_round_bytes=0,
            rebuild=rebuild,
            base_version=base_version,
        )
        for n in notes:
            say(f"{source_table_id} [{format_partition(part)}]: {n}")
        return spec, deltas, prior

    pending: list[tuple[SessionSpec, list[Delta], CompactedVersion | None]] = []
    result = CompactionResult(source_table_id, destination)
    for part in wanted or cat.partitions(source_table_id):
        planned = plan_partition(part)
        if isinstance(planned, PartitionResult):
            if planned.status != "no-stream":
                result.partitions.append(planned)
        else:
            pending.append(planned)

    if not pending:
        result.seconds = time.perf_counter() - started
        return result
    publisher.publish("job_run_started", source_table_id=source_table_id, destination_table_id=destination,
                      partitions=[[list(kv) for kv in spec.partition] for spec, _, _ in pending])

    ensure_ray(num_cpus=num_cpus, address=ray_address)
    cpus = cluster_cpus()
    heap, store = cluster_memory()
    memory_per_task = max(64 << 20, heap // cpus)
    round_budget = max_round_bytes or default_round_budget(heap, store)
    if max_round_bytes is not None and max_round_bytes < 1:
        raise FlashError(f"max round bytes must be positive, got {max_round_bytes}")

    def run_planned(item: tuple[SessionSpec, list[Delta], CompactedVersion | None]) -> PartitionResult:
        spec, deltas, prior = item
        rows = sum(d.rows for d in deltas) + (prior.rows if prior is not None else 0)
        inherited = prior.index.hash_bucket_count if prior is not None and prior.index else None
        choice = choose_bucket_count(rows, spec.sort_key_width, memory_per_task, cpus, inherited, hash_bucket_count)
        where = f"{spec.source_table_id} [{format_partition(spec.partition)}]"
        say(f"{where}: {len(deltas)} new deltas, {rows} rows to consider; {choice.reason}")
        if choice.rehash_needed and prior is not None:
            from flash_pipeline.compactor.rehash import rehash_version

            prior = rehash_version(cat, prior, choice.bucket_count, spec.rows_per_index_file)
            say(f"{where}: rehashed the primary key index to {choice.bucket_count} buckets (index version {prior.index.version if prior.index else '-'})")
        spec = dataclasses.replace(
            spec, bucket_count=choice.bucket_count, max_round_bytes=round_budget,
            base_version=prior.version if choice.rehash_needed and prior is not None else spec.base_version,
        )
        workload = estimate_workload(spec, deltas, prior, cpus)
        expected = latency.predict(workload)
        say(f"{where}: expected latency {expected:.1f}s ({workload.rounds} round(s), {cpus} CPUs)")
        notes = []
        if desired_sla is not None and expected > desired_sla:
            need = latency.cpus_for(workload, desired_sla)
            note = (
                f"desired SLA {desired_sla:.0f}s cannot be met with {cpus} CPUs (expected {expected:.1f}s); "
                + (f"about {need} CPUs would meet it: connect to a larger Ray cluster (--ray-address)" if need else "no cluster size meets it: split the input or relax the SLA")
            )
            notes.append(note)
            say(f"{where}: {note}")
            if need and ray_address:
                request_cpus(need)
        publisher.publish("session_started", source_table_id=source_table_id, partition=[list(kv) for kv in spec.partition],
                          expected_seconds=expected, hash_bucket_count=spec.bucket_count, rounds=workload.rounds)
        t0 = time.perf_counter()
        res = run_session(cat, spec, deltas, prior, cpus, say, publisher=publisher, expected_seconds=expected, on_round=on_round)
        actual = time.perf_counter() - t0
        res.expected_seconds = round(expected, 3)
        res.seconds["total"] = round(actual, 4)
        res.notes = notes + res.notes
        latency.observe(workload, res.seconds)
        say(res.describe() + f" (expected {expected:.1f}s, actual {actual:.1f}s)")
        publisher.publish("session_succeeded", source_table_id=source_table_id, partition=[list(kv) for kv in spec.partition],
                          expected_seconds=expected, actual_seconds=actual, rows_out=res.rows_out)
        return res

    def launch(item: tuple[SessionSpec, list[Delta], CompactedVersion | None]) -> PartitionResult:
        """Run one session; when another writer moved its base, re-plan on the new latest version."""
        part = item[0].partition
        first = [item]

        def attempt() -> PartitionResult:
            planned = first.pop() if first else plan_partition(part)
            if isinstance(planned, PartitionResult):
                return planned  # the winner already compacted everything this session would have
            return run_planned(planned)

        where = f"compact {source_table_id} -> {destination} [{format_partition(part)}]"
        return retry_on_moved_base(attempt, where, say)

    try:
        with ThreadPoolExecutor(max_workers=min(8, len(pending))) as pool:
            result.partitions.extend(pool.map(launch, pending))
    except BaseException as exc:
        cause = flash_error_inside(exc)
        publisher.publish("job_run_failed", source_table_id=source_table_id, reason=f"{type(cause or exc).__name__}: {cause or exc}")
        if cause is not None:
            raise cause from None  # the one-line message a task raised, not Ray's wrapped traceback
        raise
    result.seconds = time.perf_counter() - started
    publisher.publish("job_run_succeeded", source_table_id=source_table_id, seconds=result.seconds,
                      expected_seconds=max((p.expected_seconds or 0) for p in result.partitions), rows_out=result.rows_out)
    return result


def flash_error_inside(exc: BaseException) -> FlashError | None:
    """The FlashError a Ray task raised, however deeply Ray wrapped it (a task whose input task failed wraps the
    failure once more), or None when the failure is something else."""
    for _ in range(16):
        inner = getattr(exc, "cause", None)
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc if isinstance(exc, FlashError) else None


def estimate_workload(spec: SessionSpec, deltas: list[Delta], prior: CompactedVersion | None, cpus: int) -> latency.Workload:
    """What the session will touch, from catalog statistics alone (no data is read)."""
    from flash_pipeline.compactor.session import split_rounds

    delta_rows = sum(d.rows for d in deltas)
    upsert_rows = sum(d.rows for d in deltas if d.operation == UPSERT)
    upsert_bytes = sum(d.bytes for d in deltas if d.operation == UPSERT)
    prior_rows = prior.rows if prior is not None else 0
    touched = 0
    if prior is not None and prior.files:
        # updates spread uniformly touch a file with probability 1 - exp(-u/F); clustered ones touch fewer
        touched = int(prior.bytes * (1 - math.exp(-delta_rows / len(prior.files))))
    rounds = len(split_rounds(deltas, spec.max_round_bytes, spec.sort_key_width))
    files = sum(len(d.files) for d in deltas)
    return latency.Workload(
        delta_rows=delta_rows,
        indexed_rows=prior_rows * rounds,
        rewrite_bytes=upsert_bytes + touched,
        rounds=rounds,
        cpus=cpus,
        buckets=spec.bucket_count,
        hash_tasks=max(1, min(cpus, files + delta_rows // 1_000_000)),
        materialize_tasks=max(1, min(16, (upsert_rows + prior_rows) // 1_000_000 + 1)),
    )


def request_cpus(cpus: int) -> None:
    """Ask a Ray cluster's autoscaler for CPUs (a no-op on clusters without one)."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(num_cpus=cpus)
    except Exception:  # noqa: BLE001 - only an autoscaling cluster can honour this
        pass


def _resolve_keys(
    destination: str,
    part: PartitionKeys,
    prior: CompactedVersion | None,
    pk_given: tuple[str, ...] | None,
    sk_given: tuple[tuple[str, str], ...] | None,
    latest: CompactedVersion | None = None,
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The session's keys: given ones, else those recorded with the compacted table.

    A session that builds on ``prior`` must use its keys (different ones need a rebuild). A session that starts
    from scratch (a rebuild, a new stream version) still inherits the keys recorded with ``latest`` when none
    are given, like every other setting."""
    where = f"compacted table {destination!r} [{format_partition(part)}]"
    if prior is None:
        recorded = latest if latest is not None and latest.primary_keys else None
        if pk_given:
            return pk_given, sk_given or ()
        if recorded is None:
            raise FlashError(f"no primary keys given and {where} has none recorded: pass --primary-key COL")
        return tuple(recorded.primary_keys), sk_given if sk_given is not None else tuple(recorded.sort_keys)
    pks = pk_given or prior.primary_keys
    sks = sk_given if sk_given is not None else prior.sort_keys
    if tuple(pks) != tuple(prior.primary_keys) or tuple(sks) != tuple(prior.sort_keys):
        raise FlashError(
            f"{where} was compacted with primary keys {list(prior.primary_keys)} and sort keys "
            f"{[list(s) for s in prior.sort_keys]}, not {list(pks)} and {[list(s) for s in sks]}: "
            "use the recorded keys or pass --rebuild (rebuild=True) for a full rebuild"
        )
    return tuple(pks), tuple(sks)


def _columns(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


def _validate_deltas(
    table_id: str,
    part: PartitionKeys,
    deltas: list[Delta],
    pks: tuple[str, ...],
    sks: tuple[tuple[str, str], ...],
    prior: CompactedVersion | None,
    catalog_uri: str | None = None,
) -> pa.Schema:
    """Primary keys in every delta, sort keys in every upsert; returns the compacted schema.

    A bad delta blocks its stream until it is skipped or the stream restarts, so each refusal ends with the
    commands that do that (``catalog_uri`` makes them copy-pasteable)."""
    from flash_pipeline.catalog.catalog import recovery_hint

    where = f"table {table_id!r} [{format_partition(part)}]"
    # an empty compacted version (deletes only so far) does not fix the table's columns yet
    schema: pa.Schema | None = prior.pa_schema() if prior is not None and prior.arrow_schema and prior.rows else None
    for d in deltas:
        names = {c["name"] for c in d.schema}
        missing = [k for k in pks if k not in names]
        if missing:
            raise FlashError(
                f"primary key column(s) {missing} missing from the {d.operation} delta at position {d.position} of {where} "
                f"(it has {sorted(names)}); {recovery_hint(catalog_uri, table_id, part, d.position)}"
            )
        require_key_types(d.pa_schema(), pks, f"the {d.operation} delta at position {d.position} of {where}")
        if d.operation == UPSERT:
            sk_missing = [n for n, _ in sks if n not in names]
            if sk_missing:
                raise FlashError(
                    f"sort key column(s) {sk_missing} missing from the upsert delta at position {d.position} of {where}; "
                    f"{recovery_hint(catalog_uri, table_id, part, d.position)}"
                )
            s = d.pa_schema()
            if schema is None:
                schema = s
            elif set(s.names) != set(schema.names) or any(s.field(n).type != schema.field(n).type for n in schema.names):
                raise FlashError(
                    f"the upsert delta at position {d.position} of {where} has columns {_columns(s)} unlike the "
                    f"compacted table's {_columns(schema)}; {recovery_hint(catalog_uri, table_id, part, d.position)}"
                )
    if schema is None:  # deletes only and nothing compacted yet: an empty table with the key columns
        first = deltas[0].pa_schema()
        schema = pa.schema([first.field(k) for k in pks])
    return schema
