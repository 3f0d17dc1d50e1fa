"""One compaction job run: ``compact(table, options, catalog=...)`` -- a session per partition stream.

Reads like the paper's "Compaction Illustrated": validate the request, plan a session for every partition
stream with pending deltas (planning/sessions.py, no writes), start or join Ray, size each session (hash
buckets, round budget, rounds, expected latency), then run the sessions concurrently (session.py); a session
whose base another writer moved re-plans on the new latest version.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from flash_pipeline.catalog import iceberg_external
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import retry_on_moved_base
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import CompactedVersion
from flash_pipeline.catalog.storage import overlapped
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.compactor.model.plans import SessionSizing
from flash_pipeline.compactor.model.results import CompactionResult, PartitionResult
from flash_pipeline.compactor.planning import latency
from flash_pipeline.compactor.planning.delta_ranges import delta_key_range
from flash_pipeline.compactor.planning.keys import (
    TableKeys,
    first_compacted_elsewhere,
    require_destination_partition_keys,
)
from flash_pipeline.compactor.planning.rounds import split_rounds
from flash_pipeline.compactor.planning.sessions import PlannedSession, plan_session, unreadable_input_error
from flash_pipeline.compactor.planning.sizing import budget_memory_per_task, choose_bucket_count, default_round_budget
from flash_pipeline.compactor.runtime.events import EventPublisher
from flash_pipeline.compactor.runtime.executor import choose_executor, local_cpus, local_resources, ray_running_here
from flash_pipeline.compactor.runtime.interrupt import StopRequest
from flash_pipeline.compactor.runtime.memory import (
    apply_huge_pages_setting,
    malloc_reuse_setting,
    note_pool_thread,
    release_at_job_end,
)
from flash_pipeline.compactor.runtime.progress import OnStep, progress_interval
from flash_pipeline.compactor.session import SessionHooks, run_session
from flash_pipeline.errors import FlashError, UnreadableInput
from flash_pipeline.settings import aot_kernels_switch, kernel_form, ray_num_cpus_setting, sha_extensions_switch

Progress = Callable[[str], None]
OnRound = Callable[[dict[str, Any]], None]


def compact(
    source_table_id: str,
    primary_keys: CompactOptions | Iterable[str] | None = None,
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
    options: CompactOptions | None = None,
    progress: Progress | None = None,
    on_round: OnRound | None = None,
    on_step: OnStep | None = None,
    stop: StopRequest | None = None,
    failures: str = "raise",
    **more: Any,
) -> CompactionResult:
    """Compact every partition stream of ``source_table_id`` that has new deltas.

    Two spellings of one call: ``compact(table, CompactOptions(...), catalog=...)``, the engine's entry, and the
    paper's keyword form ``compact(table, primary_keys, sort_keys, ..., catalog=...)`` (every field of
    :class:`CompactOptions` is accepted as a keyword), which builds the same options. Primary and sort keys are
    recorded with the compacted table at its first compaction and may be omitted later; different keys are
    refused unless ``rebuild=True``. All validation happens before any write. Each session commits exactly the
    version after the one it planned on; when another writer committed first, it re-plans (bounded, logged
    through ``progress``) and finally raises CommitConflict (exit 3). ``progress`` receives human-readable
    lines; ``on_round`` a dict per round (round, rounds, compacted_version, committed, last_position, rows,
    files_written, files_carried, elapsed_seconds, expected_seconds); ``on_step`` a dict whenever a task of a
    step finishes (partition, round, rounds, step, done, total, elapsed_seconds); without it, steps that run longer
    than a second are reported as ``progress`` lines. ``stop`` (a :class:`StopRequest`) lets a caller that runs
    the job on a thread of its own stop it, as Ctrl-C does in the calling thread: each session stops at its next
    step and commits nothing. ``failures="report"`` isolates partition streams from each other (a batch of many
    streams, as the Dagster batch runs compact them): a stream that cannot be planned or whose session fails is
    reported as a ``PartitionResult`` with status ``failed`` (its error in ``error`` and ``failure``) while the
    others go on and commit; the default ``"raise"`` stops at the first failure, as the CLI does.
    """
    if failures not in ("raise", "report"):
        raise FlashError(f"compact(): failures must be 'raise' or 'report', not {failures!r}")
    if isinstance(primary_keys, CompactOptions):
        options, primary_keys = primary_keys, None
    keywords = {
        "primary_keys": primary_keys, "sort_keys": sort_keys, "desired_sla": desired_sla,
        "destination_compacted_table_id": destination_compacted_table_id,
        "rows_per_primary_key_index_file": rows_per_primary_key_index_file,
        "rows_per_compacted_file": rows_per_compacted_file, "hash_bucket_count": hash_bucket_count,
        "sns_event_topic_arn": sns_event_topic_arn, "compacted_file_content_type": compacted_file_content_type, **more,
    }
    given = {k: v for k, v in keywords.items() if v is not None}
    if options is None:
        try:
            options = CompactOptions(**given)
        except TypeError as exc:  # an unknown keyword
            raise FlashError(f"compact(): {exc}") from None
    elif given:
        options = options.replace(**given)
    cat = catalog if catalog is not None else delta_catalog_client
    if cat is None:
        raise FlashError("compact() needs a catalog: pass catalog=Catalog('path or s3://bucket/prefix')")
    return run_job(source_table_id, options, cat if isinstance(cat, Catalog) else Catalog(cat), progress, on_round,
                   on_step, stop, report_failures=failures == "report")


def run_job(table: str, options: CompactOptions, catalog: Catalog, progress: Progress | None = None,
            on_round: OnRound | None = None, on_step: OnStep | None = None, stop: StopRequest | None = None,
            report_failures: bool = False) -> CompactionResult:
    """The job run behind :func:`compact`: plan every session, then size and run them concurrently. Inside one
    job a version manifest is fetched once however many steps consult it (Catalog.immutable_facts_read_once)."""
    with catalog.immutable_facts_read_once():
        return _run_job(table, options, catalog, progress, on_round, on_step, stop or StopRequest(), report_failures)


def failed_stream(partition: PartitionKeys, exc: BaseException) -> PartitionResult:
    """The result of a stream whose planning or session failed, in a job that reports failures per stream."""
    return PartitionResult(partition, status="failed", error=" ".join(str(exc).split()) or type(exc).__name__,
                           failure=exc)


def _run_job(table: str, options: CompactOptions, catalog: Catalog, progress: Progress | None,
             on_round: OnRound | None, on_step: OnStep | None, stop: StopRequest,
             report_failures: bool = False) -> CompactionResult:
    _check_settings()
    started = time.perf_counter()
    say = progress or _say
    destination = options.destination_compacted_table_id or table
    publisher = EventPublisher(options.sns_event_topic_arn)
    catalog.require_table(table)
    for p in options.partitions or ():
        catalog.require_partition(table, p)

    # --- plan every session and validate everything before any work ---------------------------------------
    result = CompactionResult(table, destination)
    siblings = TableKeys(catalog, destination)  # the keys another partition records, listed once for the job
    planned = _plan_sessions(catalog, table, options, say, siblings, result, report_failures)
    if not planned:
        result.seconds = time.perf_counter() - started
        return result
    require_destination_partition_keys(catalog, table, destination, [s.spec.partition for s in planned])
    if options.destination_compacted_table_id is None:
        _note_in_place_copy(catalog, table, [s.spec.partition for s in planned if s.prior is None], say)
    publisher.publish("job_run_started", source_table_id=table, destination_table_id=destination,
                      partitions=[[list(kv) for kv in s.spec.partition] for s in planned])
    hooks = SessionHooks(progress=say, on_round=on_round, on_step=on_step, publisher=publisher, stop=stop)
    job = _Job(table, options, catalog, hooks, siblings, _place(table, options, planned, say), report_failures)
    job.run_all(planned, result)
    result.seconds = time.perf_counter() - started
    publisher.publish("job_run_succeeded", source_table_id=table, seconds=result.seconds,
                      expected_seconds=max((p.expected_seconds or 0) for p in result.partitions),
                      rows_out=result.rows_out)
    return result


def _check_settings() -> None:
    """Read every setting a round uses before any write: a bad value stops the job here, the lake untouched."""
    apply_huge_pages_setting()  # before the round allocates (a bad FLASH_THP stops here, before any write)
    # every other FLASH_* setting a round reads too, and a FLASH_ICEBERG_CATALOG that is not JSON properties
    sha_extensions_switch(), kernel_form(), aot_kernels_switch(), malloc_reuse_setting(), progress_interval(), \
        ray_num_cpus_setting()
    iceberg_external.configured()


@dataclass(frozen=True)
class _Placement:
    """Where a job's sessions run (this process, or the Ray they share) and the budgets that follow from it."""

    in_process: bool
    cpus: int
    memory_per_task: int
    round_budget: int


def _place(table: str, options: CompactOptions, planned: Sequence[PlannedSession], say: Progress) -> _Placement:
    """This process for small inputs, else Ray (started or joined here)."""
    from flash_pipeline.compactor.runtime.cluster import cluster_cpus, cluster_memory, ensure_ray, ray_target

    input_bytes = [sum(d.bytes for d in s.deltas) + (s.prior.bytes if s.prior is not None else 0) for s in planned]
    executor = choose_executor(options.executor, options.ray_address, input_bytes, local_cpus(options.num_cpus))
    if executor.in_process:
        cpus, heap, store = local_resources(options.num_cpus)
    else:
        if not ray_running_here():
            say(f"{table}: {ray_target(options.ray_address)} ({executor.reason}) ...")
        ensure_ray(num_cpus=options.num_cpus, address=options.ray_address)
        cpus = cluster_cpus()
        heap, store = cluster_memory()
    return _Placement(executor.in_process, cpus, budget_memory_per_task(heap, cpus, options.max_round_bytes),
                      options.max_round_bytes or default_round_budget(heap, store))


@dataclass
class _Job:
    """One job run's sessions: sized, run concurrently, each re-planned when another writer moved its base."""

    table: str
    options: CompactOptions
    catalog: Catalog
    hooks: SessionHooks  # its stop is set on the user's interrupt: every session stops at its next step
    siblings: TableKeys
    place: _Placement
    report_failures: bool

    @property
    def destination(self) -> str:
        return self.options.destination_compacted_table_id or self.table

    def run_all(self, planned: Sequence[PlannedSession], result: CompactionResult) -> None:
        from flash_pipeline.compactor.runtime.cluster import cluster_failure, flash_error_inside

        say, table = self.hooks.progress, self.table
        try:
            with ThreadPoolExecutor(max_workers=min(8, len(planned)), initializer=note_pool_thread) as pool:
                try:
                    result.partitions.extend(pool.map(self.launch, planned))
                # an interrupt reaches this thread only; the pool's exit waits for its sessions
                except BaseException as exc:
                    if not isinstance(exc, Exception):  # Ctrl-C, a terminated Dagster run's interrupt, SystemExit
                        self.hooks.stop.set()
                        say(f"{table}: interrupted: each running session stops at its next step and commits nothing "
                            "(a session already past its commit keeps its version)")
                    raise
        except BaseException as exc:
            cause = flash_error_inside(exc) or cluster_failure(exc, f"compact {table} -> {self.destination}")
            self.hooks.publisher.publish("job_run_failed", source_table_id=table,
                                         reason=f"{type(cause or exc).__name__}: {cause or exc}")
            if cause is not None:
                raise cause from None  # the one-line message a task raised, not Ray's wrapped traceback
            raise
        finally:
            # the pages the sessions' steps freed, kept by malloc and Arrow's pool for reuse, go back to the system
            # here, on the caller's thread (the one Arrow's pool returns them to: runtime/memory.py): a long-lived
            # process calling compact() kept 530-580 MiB after s1 in process without it (skipped when the process
            # ends right after the job: the flash-compactor compact command)
            release_at_job_end()

    def launch(self, first: PlannedSession) -> PartitionResult:
        """Run one session; when another writer moved its base, re-plan on the new latest version."""
        from flash_pipeline.compactor.runtime.cluster import flash_error_inside

        part: PartitionKeys = first.spec.partition
        queue = [first]
        say, table, catalog = self.hooks.progress, self.table, self.catalog

        def attempt() -> PartitionResult:
            outcome = queue.pop() if queue else plan_session(catalog, table, self.options, part, say, self.siblings)
            if isinstance(outcome, PartitionResult):
                return outcome  # the winner already compacted everything this session would have
            try:
                return self.run_planned(outcome)
            except BaseException as exc:
                cause = flash_error_inside(exc)
                if isinstance(cause, UnreadableInput):  # a task names the file; here the table and the fix are known
                    raise unreadable_input_error(cause, catalog_uri=catalog.uri, table_id=table,
                                                 destination=self.destination, partition=part,
                                                 restartable=outcome.restartable) from None
                raise

        try:
            return retry_on_moved_base(attempt, f"compact {table} -> {self.destination} [{format_partition(part)}]",
                                       say)
        except Exception as exc:
            if not self.report_failures:
                raise
            failed = failed_stream(part, flash_error_inside(exc) or exc)
            say(f"{table} [{format_partition(part)}]: failed: {failed.error}")
            return failed

    def run_planned(self, session: PlannedSession) -> PartitionResult:
        """Size one planned session, predict its latency, run it and report expected against actual."""
        spec, say, place, publisher = session.spec, self.hooks.progress, self.place, self.hooks.publisher
        where = f"{spec.source_table_id} [{format_partition(spec.partition)}]"
        prior, sizing = self.size(session, where)
        delta_range = delta_key_range(self.catalog.storage, session.deltas, prior)
        vector_limit = spec.max_dead_fraction if spec.deletion_vectors else -1.0
        workload = latency.estimate_workload(sizing, session.deltas, prior, place.cpus, delta_range, vector_limit)
        model = latency.IN_PROCESS if place.in_process else latency.RAY
        if place.in_process:
            workload = latency.with_kernel_forms(workload)
        expected = latency.predict(workload, executor=model)
        runs_on = "in this process" if place.in_process else "on Ray"
        say(f"{where}: expected latency {expected:.1f}s ({workload.rounds} round(s), {place.cpus} CPUs, {runs_on})")
        notes = _sla_notes(self.options, workload, expected, place.cpus, where, say)
        partition = [list(kv) for kv in spec.partition]
        publisher.publish("session_started", source_table_id=self.table, partition=partition, expected_seconds=expected,
                          hash_bucket_count=sizing.bucket_count, rounds=workload.rounds)
        t0 = time.perf_counter()
        res = run_session(self.catalog, spec, sizing, prior, place.cpus, self.hooks, expected_seconds=expected,
                          in_process=place.in_process)
        actual = time.perf_counter() - t0
        res.expected_seconds = round(expected, 3)
        res.seconds["total"] = round(actual, 4)
        res.notes = notes + res.notes
        latency.observe(latency.observed_workload(workload, session.deltas, prior, res.bytes_carried,
                                                  res.index_bytes_skipped), res.seconds, model)
        say(res.describe() + f" (expected {expected:.1f}s, actual {actual:.1f}s)")
        publisher.publish("session_succeeded", source_table_id=self.table, partition=partition,
                          expected_seconds=expected, actual_seconds=actual, rows_out=res.rows_out)
        return res

    def size(self, session: PlannedSession, where: str) -> tuple[CompactedVersion | None, SessionSizing]:
        """The session's hash buckets (rehashing the prior index first when they change), round budget and rounds."""
        spec, deltas, prior, say = session.spec, session.deltas, session.prior, self.hooks.progress
        rows = sum(d.rows for d in deltas) + (prior.rows if prior is not None else 0)
        inherited = prior.index.hash_bucket_count if prior is not None and prior.index else None
        indexed = prior.index.rows if prior is not None and prior.index else 0
        choice = choose_bucket_count(rows, spec.sort_key_width, self.place.memory_per_task, self.place.cpus, inherited,
                                     self.options.hash_bucket_count, indexed)
        say(f"{where}: {len(deltas)} new deltas, {rows} rows to consider; {choice.reason}")
        base_version = session.base_version
        if choice.rehash_needed and prior is not None:
            from flash_pipeline.compactor.index.rehash import rehash_version

            prior = rehash_version(self.catalog, prior, choice.bucket_count, spec.rows_per_index_file)
            base_version = prior.version
            say(f"{where}: rehashed the primary key index to {choice.bucket_count} buckets "
                f"(index version {prior.index.version if prior.index else '-'})")
        rounds = tuple(tuple(r) for r in split_rounds(deltas, self.place.round_budget, spec.sort_key_width))
        return prior, SessionSizing(choice.bucket_count, self.place.round_budget, rounds, base_version,
                                    session.previous)


def _plan_sessions(catalog: Catalog, table: str, options: CompactOptions, say: Progress, siblings: TableKeys,
                   result: CompactionResult, report_failures: bool) -> list[PlannedSession]:
    """The session of every partition with work to do; the others' results (up to date; failed, when failures are
    reported) go into ``result``. Each partition's planning is a dozen small requests; on an object store they
    overlap across partitions (a no-op run over 2,000 partitions paid them one after another). Otherwise the
    first failure in partition order stops the job before any work, as when they were planned in turn."""
    def plan(part: PartitionKeys) -> PlannedSession | PartitionResult:
        try:
            return plan_session(catalog, table, options, part, say, siblings)
        except FlashError as exc:
            if not report_failures:
                raise
            return failed_stream(part, exc)

    planned: list[PlannedSession] = []
    for outcome in overlapped(catalog.storage, plan, list(options.partitions or catalog.partitions(table)),
                              "flash-plan"):
        if isinstance(outcome, PlannedSession):
            planned.append(outcome)
        elif outcome.status != "no-stream":
            result.partitions.append(outcome)
    return planned


def _say(message: str) -> None:
    """Progress on stderr, one write per line (concurrent sessions must not interleave within a line)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _note_in_place_copy(catalog: Catalog, table: str, new_parts: Sequence[PartitionKeys],
                        say: Callable[[str], None]) -> None:
    """A line when a partition compacted in place for the first time is already compacted into another table
    (``--destination``): without it the user who forgot --destination gets a second, separate compacted copy
    in the source and the destination stays behind. One listing when the table has no destination records."""
    found = first_compacted_elsewhere(catalog, table, new_parts)
    if found is not None:
        part, held = found
        say(f"note: {table} [{format_partition(part)}] is compacted into {held}; without --destination this "
            f"compacts it in place too, a separate copy (pass --destination {held} to bring {held} up to date)")


def _sla_notes(options: CompactOptions, workload: latency.Workload, expected: float, cpus: int, where: str,
               say: Progress) -> list[str]:
    """The paper's desired SLA: when the prediction misses it, say how many CPUs would meet it (and ask an
    autoscaling cluster for them)."""
    sla = options.desired_sla
    if sla is None or expected <= sla:
        return []
    from flash_pipeline.compactor.runtime.cluster import request_cpus

    need = latency.cpus_for(workload, sla)
    note = (
        f"desired SLA {sla:.0f}s cannot be met with {cpus} CPUs (expected {expected:.1f}s); "
        + (f"about {need} CPUs would meet it: connect to a larger Ray cluster (--ray-address)" if need
           else "no cluster size meets it: split the input or relax the SLA")
    )
    say(f"{where}: {note}")
    if need and options.ray_address:
        request_cpus(need)
    return [note]
