"""The Dagster layer's calls into the engine: compaction on Ray (progress streamed to the run), rehash, optimize.

Every call runs inside :func:`engine_errors`, so an engine error fails the run with a ``dagster.Failure`` whose
description is the same one line the CLI prints (and its exit code in the metadata).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, Callable, Iterator, TypeVar

from dagster import AssetExecutionContext, MaterializeResult

from assets.checks import run_checks
from resources.keys import keys
from assets.metadata import compaction_metadata, index_metadata, optimize_metadata, published_tables, round_observation
from assets.run_config import CompactConfig, OptimizeRunConfig, repair_run_config, run_options
from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.compactor.runtime.interrupt import StopRequest
from resources import CatalogResource, RayResource
from resources.config import TableConfig, parse_partition_key

T = TypeVar("T")


def engine_failure(exc: BaseException, table_id: str, partition: str, what: str, repair: TableConfig | None = None) -> BaseException:
    """The engine's one-line error as a ``dagster.Failure`` (the CLI prints the same line); anything else as is.

    The description is the line; the metadata names the table, partition, the delta that blocks a stream and the
    fix, as a command and as the UI action (the table's repair job, see assets/repair.py), so the run page says
    what to do; the traceback stays in the debug log."""
    from dagster import Failure, MetadataValue

    from flash_pipeline.errors import FlashError, StreamBlocked

    if not isinstance(exc, FlashError):
        return exc
    line = " ".join(str(exc).split())
    metadata: dict[str, Any] = {"table": table_id, "partition": partition, "operation": what, "error": type(exc).__name__,
                                "exit code (CLI)": int(exc.exit_code)}
    if isinstance(exc, StreamBlocked):
        metadata["table"] = exc.table_id
        metadata["delta position"] = exc.position
        metadata["fix (CLI)"] = line[line.index("skip it: "):] if "skip it: " in line else "flash-compactor skip-delta or new-stream"
        if repair is not None:
            metadata["fix (UI)"] = MetadataValue.md(repair_instructions(repair, partition, exc.position, "new-stream" in line))
    else:
        metadata["fix"] = fix_for(exc)
    return Failure(description=line, metadata=metadata)


def repair_instructions(table: TableConfig, partition: str, position: int, restartable: bool = True) -> str:
    """How to unblock a stream from the UI: the repair job's launchpad config for this partition and delta (a new
    stream version only when ``restartable``: a stream never compacted has no compacted rows to restart from)."""
    import yaml

    skip = yaml.safe_dump(repair_run_config(table, "skip_delta", position), sort_keys=False).strip()
    fresh = yaml.safe_dump(repair_run_config(table, "new_stream"), sort_keys=False).strip()
    restart = f"or to start a new stream version from the latest compacted rows:\n\n```yaml\n{fresh}\n```\n\n" if restartable else ""
    return (
        f"Jobs -> `{table.repair_job_name}` -> Launchpad, partition `{partition}`; to skip the delta at position {position}:\n\n"
        f"```yaml\n{skip}\n```\n\n{restart}then materialize the compacted stream partition again."
    )


def fix_for(exc: BaseException) -> str:
    """What a person does about an engine error that is not a blocked stream (the line itself names details)."""
    from flash_pipeline.errors import CommitConflict, CommitOutcomeUnknown, IntegrityError, InternalError

    if isinstance(exc, CommitConflict):
        return "another writer committed first: re-execute the run (it re-plans on the new version)"
    if isinstance(exc, CommitOutcomeUnknown):
        return "the store did not answer: re-execute the run; it reads back whether the commit applied"
    if isinstance(exc, IntegrityError):
        return "run flash-compactor verify on the table and restore or re-append what it names"
    if isinstance(exc, InternalError):
        return "a bug in the engine (nothing was committed): report it with the debug log"
    if "are not columns of" in str(exc):  # a mistyped key name: in a deployment the keys come from tables.yaml
        return "correct primary_keys / sort_keys of the table in tables.yaml (names are case-sensitive), then re-execute the run"
    return "correct the input or option the description names, then re-execute the run"


def log_traceback(exc: BaseException) -> None:
    """The engine's traceback at DEBUG level in the run's log: there for whoever debugs, out of the way of the
    one-line failure the run page shows (the Failure is raised without the engine error chained to it)."""
    import traceback

    from dagster import get_dagster_logger

    get_dagster_logger().debug("engine traceback of the failure below:\n" + "".join(traceback.format_exception(exc)))


@contextlib.contextmanager
def engine_errors(table_id: str, partition: str, what: str, repair: TableConfig | None = None) -> Iterator[None]:
    """Re-raise an engine error (FlashError) as the run's ``dagster.Failure`` with the engine's one line."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - engine_failure passes anything but a FlashError through unchanged
        failure = engine_failure(exc, table_id, partition, what, repair)
        if failure is exc:
            raise
        log_traceback(exc)
        raise failure from None


def on_engine_thread(context: Any, where: str, call: Callable[[Callable[[Any], None], StopRequest], T],
                     on_round: Callable[[dict[str, Any]], None] | None = None, log_every: float = 0.0) -> T:
    """``call(report, stop)`` on a thread of its own while the run's thread logs what it reports: a line as a log
    message, a dict (a round) to ``on_round``. A terminated run's interrupt reaches the run's thread, not the
    engine's: it sets ``stop`` (each session stops at its next step and commits nothing), waits and re-raises.
    ``log_every`` > 0 logs at most one line per that many seconds (with how many it left out): a batch of hundreds
    of streams says a few lines each, and every log line is an event the instance stores (~8 ms on SQLite)."""
    last_logged = [float("-inf"), 0]  # when the last line was logged, lines left out since

    def log(line: str) -> None:
        now = time.monotonic()
        if log_every <= 0 or now - last_logged[0] >= log_every:
            skipped = f" ({last_logged[1]} more lines since the last)" if last_logged[1] else ""
            context.log.info(line + skipped)
            last_logged[:] = [now, 0]
        else:
            last_logged[1] += 1

    messages: "queue.Queue[str | dict[str, Any]]" = queue.Queue()
    outcome: dict[str, Any] = {}
    stop = StopRequest()

    def work() -> None:
        try:
            outcome["result"] = call(messages.put, stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the run's thread below
            outcome["error"] = exc

    # The engine decides whether this run needs Ray at all (small inputs compact in this process, see
    # runtime/executor.py); when it starts a local Ray, it does so from a thread that lives as long as the run
    # worker (cluster._init_in_keeper_thread), so the worker thread below may end before Ray does.
    worker = threading.Thread(target=work, name=f"engine-{where}", daemon=True)
    worker.start()
    try:
        while True:
            try:
                msg = messages.get(timeout=0.2)
            except queue.Empty:
                if not worker.is_alive():
                    break
                continue
            if isinstance(msg, dict):
                if on_round is not None:
                    on_round(msg)
            else:
                log(msg)
    except BaseException:
        stop.set()
        context.log.warning(f"{where}: interrupted: the compaction stops at its next step and commits nothing")
        worker.join()
        raise
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def run_compaction(context: AssetExecutionContext, table: TableConfig, config: CompactConfig, catalog: CatalogResource, ray: RayResource) -> Iterator[Any]:
    from flash_pipeline.compactor.job import compact

    k = keys(table)
    pkey = context.partition_key
    part = parse_partition_key(pkey)
    cat = catalog.get_catalog()
    rounds: list[dict[str, Any]] = []

    def on_round(msg: dict[str, Any]) -> None:
        rounds.append(msg)
        context.log_event(round_observation(k["compacted"], pkey, msg))

    def call(report: Callable[[Any], None], stop: StopRequest) -> Any:
        options = table.options.replace(**run_options(config), partitions=[part], **ray_settings(table, ray))
        return compact(table.source, options, catalog=cat, progress=report, on_round=report, stop=stop)

    started = time.perf_counter()
    with engine_errors(table.source, pkey, "compaction", table):
        result = on_engine_thread(context, f"{table.source} [{pkey}]", call, on_round)
    pres = result.partitions[0] if result.partitions else None
    # the version this run committed, not whatever is latest now: another writer may have committed since
    compacted = own_version(cat, table.destination, part, pres.compacted_version if pres is not None else None)
    wall = time.perf_counter() - started
    published = published_tables(cat, table.destination, part, compacted)
    meta = compaction_metadata(table, part, pres, compacted, wall, config.document_id, rounds, published)
    yield MaterializeResult(asset_key=k["compacted"], metadata=meta)
    index_meta = index_metadata(part, pres, compacted)
    yield MaterializeResult(asset_key=k["index"], metadata=index_meta)
    yield from run_checks(cat, table, compacted, part, instance=context.instance)


def ray_settings(table: TableConfig, ray: RayResource) -> dict[str, Any]:
    """The deployment's Ray (``RayResource``: address, CPUs) for what the table's entry does not set itself: a
    ``num_cpus`` or ``ray_address`` in tables.yaml wins, and an unset resource field leaves the table's value
    (it used to replace both with None, silently dropping the table's)."""
    given = table.options.given()
    return {k: v for k, v in ray.compact_kwargs().items() if v is not None and k not in given}


def own_version(cat: Any, table_id: str, part: Any, version: int | None) -> Any:
    """The compacted version a run committed (``version``), or the latest when it committed none (up to date,
    nothing to do). Reading "the latest" after a commit would describe another writer's version when one
    committed in between (a CLI compaction, another deployment): metadata, checks and the lake observation
    sensor's bookkeeping must name the run's own."""
    if version is not None:
        return cat.compacted_version(table_id, part, version)
    return cat.latest_compacted(table_id, part)


def rehash_partition(context: AssetExecutionContext, table: TableConfig, target: int, catalog: CatalogResource,
                     pkey: str) -> tuple[list[Any], dict[str, Any]]:
    """Rehash the index of one partition stream to ``target`` buckets: (its events, what it did). The events are
    the new primary key index version's materialization (on ``<name>/pk_index``) and the index checks on it,
    blocking like a compaction's: a failed check raises ``dagster.Failure`` after the version is committed."""
    from dagster import AssetMaterialization

    from assets.checks import index_check_evaluations
    from flash_pipeline.compactor.index.rehash import rehash

    k = keys(table)
    part = parse_partition_key(pkey)
    cat = catalog.get_catalog()
    with engine_errors(table.destination, pkey, "rehash"):
        before = cat.latest_compacted(table.destination, part)
        (new,) = rehash(cat, table.destination, target, partitions=[part], log=context.log.info)
    frm = before.index.hash_bucket_count if before and before.index else None
    where = f"{table.destination} [{format_partition(part)}]"
    context.log.info(f"{where}: index rehashed {frm} -> {target} buckets, version {new.version}")
    events: list[Any] = [AssetMaterialization(
        asset_key=k["index"], partition=pkey, description=f"{where}: index rehashed {frm} -> {target} buckets",
        metadata={**index_metadata(part, None, new), "compacted version": new.version, "rehashed from buckets": frm},
    )]
    evaluations = index_check_evaluations(cat, table, new, pkey)
    events += evaluations
    failed = [e.check_name for e in evaluations if not e.passed]
    done = {"from buckets": frm, "compacted version": new.version, "index version": new.index.version if new.index else None,
            "index rows": new.index.live_rows if new.index else 0, "failed checks": failed,
            "failure": f"{where}: index check(s) {failed} failed on the rehashed index version {new.version}: "
                       f"run flash-compactor verify on {table.destination}" if failed else None}
    return events, done


def run_rehash(context: AssetExecutionContext, table: TableConfig, target: int, catalog: CatalogResource) -> Iterator[Any]:
    """Rehash every partition of the run (one, or many in a backfill run: ``BackfillPolicy.multi_run``), yielding
    each partition's events as it is done; a partition that fails is reported as its own while the others go on,
    and the run fails at the end naming them. Returns (through ``StopIteration``) the per-partition results."""
    from dagster import Failure

    done: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    first: Failure | None = None
    for pkey in context.partition_keys:
        try:
            events, one = rehash_partition(context, table, target, catalog, pkey)
        except Failure as exc:
            failed[pkey], first = str(exc.description), first or exc
            continue
        yield from events
        done[pkey] = one
        if one["failure"]:
            failed[pkey] = one["failure"]
    if failed:
        if len(context.partition_keys) == 1 and first is not None:
            raise first
        key = sorted(failed)[0]
        others = " (the others committed)" if len(failed) < len(context.partition_keys) else ""
        raise Failure(description=f"{len(failed)} of {len(context.partition_keys)} partition(s) of {table.destination} "
                      f"failed to rehash{others}; [{key}] {failed[key]}",
                      metadata={"failed partitions": failed, "table": table.destination})
    return done


def run_optimize(context: AssetExecutionContext, table: TableConfig, config: OptimizeRunConfig, catalog: CatalogResource) -> MaterializeResult:
    """``flash_pipeline.optimize.optimize`` on the compacted table for the run's partition(s) (one or a backfill range)."""
    from flash_pipeline.optimize import OptimizeResult, PartitionOptimizeResult, optimize

    cat = catalog.get_catalog()
    # unset takes the table's; a 0 or negative size reaches optimize(), which refuses it as the command does
    min_size = table.optimize.min_file_size if config.min_file_size is None else config.min_file_size
    max_size = table.optimize.max_file_size if config.max_file_size is None else config.max_file_size
    started = time.perf_counter()
    total = OptimizeResult(table.destination, int(min_size), int(max_size))
    rows = 0
    versions: dict[str, Any] = {}
    committed_data_change: list[bool] = []
    for pkey in context.partition_keys:
        part = parse_partition_key(pkey)
        prior = cat.latest_compacted(table.destination, part) if cat.table_exists(table.destination) else None
        if prior is None:
            # nothing compacted yet: the stream's deltas are compaction's business (they carry deletes and keys)
            res = PartitionOptimizeResult(part, "skipped", notes=["nothing compacted yet: compact the stream first"])
            context.log.info(f"{table.destination} [{format_partition(part)}]: skipped (nothing compacted yet)")
        else:
            with engine_errors(table.destination, pkey, "optimize"):
                one = optimize(cat, table.destination, partitions=[part], min_file_size=min_size, max_file_size=max_size,
                               progress=context.log.info)
            res = one.partitions[0]
        total.partitions.append(res)
        latest = own_version(cat, table.destination, part, res.compacted_version if res.status == "optimized" else None) if prior is not None else None
        if latest is not None:
            rows += latest.rows
            versions[pkey] = {"version": latest.version, "files": len(latest.files), "data_change": latest.data_change}
            if res.status == "optimized":
                committed_data_change.append(latest.data_change)
    total.seconds = time.perf_counter() - started
    meta = optimize_metadata(table, total, int(min_size), int(max_size), rows, versions, committed_data_change)
    return MaterializeResult(metadata=meta)
