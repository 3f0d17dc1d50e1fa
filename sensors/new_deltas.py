"""The new-delta sensor: follows each table's change feed and requests the compaction of the streams that are due.

A tick reads what the source table's change feed (and the destination's, for compacted versions) recorded since
the cursor's positions (``flash_pipeline/catalog/changes.py``): one listing per feed when nothing changed, one
more read per new record otherwise, whatever the number of partition streams. The records fold into the
pending streams (``sensors/pending_streams.py``: only streams with deltas no compacted version covers), and each
stream that changed, or whose age rule may have come due, is judged by ``flash_pipeline.triggers.decide`` (the
rules ``flash-compactor auto`` uses). Run keys are ``<table>|<partition>|v<stream>|<position>``, so the same
deltas never launch two runs.

State, kept small where it is shipped every tick:

- the cursor (JSON, O(tables)): ``{"v": 2, "tables": {<name>: {"src", "dst", "state", "due", "rec_at", "rec"}}}``:
  the two feed positions, which saved state snapshot is current, when a waiting stream's time rule may fire next,
  and the bounded reconciliation's progress;
- the pending streams of each table: in the Dagster instance's key-value store (SQLite or PostgreSQL, the one
  the daemon keeps its own cursors in), one snapshot per tick that changed them, read only on ticks that have
  new records or a due time. A tick that fails after saving a snapshot leaves the cursor naming the previous one,
  and the fold is idempotent, so the next tick redoes it exactly.

Reconciliation: a commit whose record was lost (a writer killed between the two) is found by comparing the lake
with the state, a bounded number of partitions per tick (``FLASH_RECONCILE_BATCH``, default 200), one pass every
``FLASH_RECONCILE_SECONDS`` (default 6 hours), and at once for tables that predate the feed.
"""


import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dagster import (
    AssetMaterialization,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.changes import Change
from flash_pipeline.errors import NotFound
from flash_pipeline.settings import env_number
from flash_pipeline.triggers import Decision
from resources import CatalogResource
from resources.config import ProjectConfig, TableConfig, partition_key
from resources.keys import keys
from sensors.lineage import delta_events
from sensors.pending_streams import PendingStreams, Tick

CURSOR_VERSION = 2
FEED_BATCH = 5_000  # records read per feed per tick: a long backlog is caught up over several ticks


def reconcile_seconds() -> float:
    """FLASH_RECONCILE_SECONDS: how often the new-delta sensor compares every partition with its state (a commit
    whose change record a killed writer never wrote is found then). Default 6 hours."""
    return env_number("FLASH_RECONCILE_SECONDS", 6 * 3600.0, 0, 365 * 86400, "a number of seconds", "21600")


def reconcile_batch() -> int:
    """FLASH_RECONCILE_BATCH: partitions a tick reconciles at most (about 8 storage requests each). Default 200."""
    return int(env_number("FLASH_RECONCILE_BATCH", 200, 1, 1_000_000, "a whole number of partitions", "200", whole=True))


@dataclass
class ScanResult:
    entries: dict[str, Any]  # the table's next state: feed positions, reconciliation, and "streams"
    new_partition_keys: list[str] = field(default_factory=list)  # partitions with new deltas (registered if new)
    # key, stream, position, reason, rule, repair
    requests: list[tuple[str, int, int, str, str | None, int]] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    records_read: int = 0
    new_deltas: list[Change] = field(default_factory=list)
    table_missing: bool = False
    changed: bool = False  # the pending streams changed (a new snapshot is to be saved)


def _delta_stats(catalog: Catalog, table: TableConfig) -> Callable[[Change], tuple[int, int, int, float] | None]:
    """(files, bytes, rows, committed at) of the delta an ``unskip`` record names: its manifest, one read."""
    from flash_pipeline.catalog.model import Delta
    from flash_pipeline.catalog.validation import POSITION_DIGITS

    def stats(record: Change) -> tuple[int, int, int, float] | None:
        prefix = catalog.stream_prefix(table.source, record.partition, int(record.stream_version or 0))
        try:
            d = catalog._read_json(f"{prefix}/deltas/{int(record.position or 0):0{POSITION_DIGITS}d}.json", Delta.from_json)
        except NotFound:
            return None
        return len(d.files), d.bytes, d.rows, d.created_at

    return stats


def _reconcile(catalog: Catalog, table: TableConfig, pending: PendingStreams, entries: dict[str, Any], tick: Tick) -> bool:
    """One bounded step of a reconciliation pass: compare the next partitions with the lake. True when it ran."""
    marker = entries.get("rec")
    if marker is None:
        return False
    prefix = f"{catalog.table_prefix(table.source)}/partitions"
    components = catalog.storage.list_children(prefix, start_after=marker)[: reconcile_batch()]
    for component in components:
        try:
            part = catalog._read_json(f"{prefix}/{component}/partition.json", lambda d: tuple((n, v) for n, v in d["partition"]))
        except NotFound:
            continue
        lake = catalog.pending(table.source, part, table.destination, keyed=False)
        if lake.stream is None:
            continue
        covered = lake.base.last_position if lake.base is not None else 0
        work = pending.streams.get(component)
        if work is not None and work.v > lake.stream.version:
            continue
        for d in lake.deltas:
            pending.apply(Change(0, "delta", table.source, part, d.stream_version, d.position, d.created_at,
                                 {"files": len(d.files), "bytes": d.bytes, "rows": d.rows, "committed_at": d.created_at}),
                          tick, lambda r: None)
        work = pending.streams.get(component)
        if work is not None and work.v == lake.stream.version and covered > work.c:
            work.covered(covered)
            tick.touched.add(component)
            if work.idle:
                del pending.streams[component]
    entries["rec"] = components[-1] if len(components) >= reconcile_batch() else None
    return True


def scan_table(catalog: Catalog, table: TableConfig, entries: dict[str, Any], now: float | None = None,
               in_flight: Callable[[str], bool] | None = None,
               load_streams: Callable[[], dict[str, Any]] | None = None) -> ScanResult:
    """One tick for one table: read its feeds from ``entries``' positions, fold, decide. ``entries`` is the
    previous result's ``entries`` (``{}`` at first); its ``"streams"`` (the pending streams) may instead come from
    ``load_streams``, which is called only when this tick needs them."""
    now = time.time() if now is None else now
    entries = {k: v for k, v in entries.items()}
    in_flight = in_flight or (lambda key: False)
    out = ScanResult(entries)
    feed = catalog.changes
    if "src" not in entries:  # a fresh start
        if not catalog.table_exists(table.source):
            out.table_missing = True
            return out
        recorded = bool(catalog.table_metadata(table.source).get("changes_recorded"))
        if recorded:  # the feed holds the table's whole history: replay it
            entries.update(src=0, dst=0, rec=None, rec_at=now)
        else:  # a table from before the feed: start at the heads and reconcile every partition with the lake
            entries.update(src=feed.head(table.source), dst=feed.head(table.destination), rec="", rec_at=now)
    source = feed.read(table.source, entries["src"], FEED_BATCH)
    same = table.destination == table.source
    dest = [] if same else feed.read(table.destination, entries["dst"], FEED_BATCH)
    out.records_read = len(source) + len(dest)
    catching_up = len(source) >= FEED_BATCH or len(dest) >= FEED_BATCH
    if entries.get("rec") is None and now - float(entries.get("rec_at", now)) >= reconcile_seconds():
        entries.update(rec="", rec_at=now)
    due = entries.get("due")
    unjudged = bool(entries.get("unjudged"))  # a catch-up folded streams it did not judge yet
    if not source and not dest and entries.get("rec") is None and (due is None or now < due) and not unjudged:
        return out  # idle: not even the pending streams are read
    streams_doc = entries.get("streams")
    if streams_doc is None:
        streams_doc = load_streams() if load_streams is not None else {}
    pending = PendingStreams.from_json(table, streams_doc)
    tick = Tick()
    stats = _delta_stats(catalog, table)
    for record in source:
        pending.apply(record, tick, stats)
    for record in dest:
        pending.apply(record, tick, stats)
    if source:
        entries["src"] = source[-1].seq
        if same:
            entries["dst"] = entries["src"]
    if dest:
        entries["dst"] = dest[-1].seq
    _reconcile(catalog, table, pending, entries, tick)
    if catching_up:  # while a backlog is read, a delta's compaction may be in a later batch: judge after it
        entries["unjudged"] = True
    else:
        judge = set(tick.touched)
        if (due is not None and now >= due) or unjudged:
            judge |= set(pending.due_components(now))
        entries.pop("unjudged", None)
        pending.decide(judge, now, in_flight, tick)
        wakes = [t for t in (tick.due_at, due if due is not None and now < due else None) if t is not None]
        entries["due"] = min(wakes) if wakes else None
    out.requests, out.decisions, out.waiting, out.new_deltas = tick.requests, tick.decisions, tick.waiting, tick.new_deltas
    out.new_partition_keys = sorted({partition_key(r.partition) for r in tick.new_deltas})
    out.changed = bool(tick.touched)
    entries["streams"] = pending.to_json()
    return out


def state_key(sensor_name: str, table: TableConfig, snapshot: int) -> str:
    return f"flash/{sensor_name}/{table.name}/pending/{snapshot}"


def pending_streams_of(instance: Any, cursor: str | None, table: TableConfig, sensor_name: str = "new_delta_sensor") -> dict[str, Any]:
    """The pending streams of ``table`` (``sensors/pending_streams.py``'s JSON) as of the sensor's ``cursor``."""
    state = (json.loads(cursor) if cursor else {}).get("tables", {}).get(table.name, {})
    snapshot = int(state.get("state", 0))
    if not snapshot:
        return {}
    key = state_key(sensor_name, table, snapshot)
    raw = instance.run_storage.get_cursor_values({key}).get(key)
    return json.loads(raw) if raw else {}


IN_FLIGHT_STATUSES = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")


def streams_in_flight(instance: Any, table: TableConfig) -> set[str] | None:
    """Partition keys of ``table`` that a compaction or rehash run of this deployment is working on (queued or
    running): one-stream runs by their partition tag, batched runs by the partitions of their run config. None
    when a run covers a partition range (a backfill): the whole table then counts as busy."""
    from dagster import DagsterRunStatus, RunsFilter

    statuses = [DagsterRunStatus[s] for s in IN_FLIGHT_STATUSES]
    k = keys(table)
    watched = {k["compacted"], k["index"], k["rehash"]}
    found: set[str] = set()
    for run in instance.get_runs(filters=RunsFilter(statuses=statuses)):
        if run.job_name == table.batch_job_name:
            config = ((run.run_config or {}).get("ops", {}).get(table.batch_op_name) or {}).get("config") or {}
            found.update(config.get("partitions") or ())
            continue
        if run.job_name not in (table.compact_job_name, table.rehash_job_name) and not (
                run.asset_selection and watched & set(run.asset_selection)):
            continue
        pkey = run.tags.get("dagster/partition")
        if pkey is None:
            return None  # a partition range (a backfill run) or an unpartitioned launch: the whole table is busy
        found.add(pkey)
    return found


def _runs_in_flight(context: SensorEvaluationContext, table: TableConfig) -> Callable[[str], bool]:
    """``partition key -> a run is queued or running for it``, asking the instance once, when first needed."""
    busy: list[set[str] | None] = []

    def in_flight(pkey: str) -> bool:
        if not busy:
            busy.append(streams_in_flight(context.instance, table))
        return busy[0] is None or pkey in busy[0]

    return in_flight


def batches(table: TableConfig, res: "ScanResult") -> list[list[tuple[str, int, int, str, str | None, int]]]:
    """The due streams of one tick in runs: up to ``batch.streams`` streams and about ``batch.bytes`` pending
    bytes each (a stream larger than that alone), in partition key order."""
    out: list[list[tuple[str, int, int, str, str | None, int]]] = []
    size = 0
    for request in sorted(res.requests):
        decision = res.decisions.get(request[0])
        nbytes = decision.stats.pending_bytes if decision is not None else 0
        if not out or len(out[-1]) >= table.batch.streams or (out[-1] and size + nbytes > table.batch.bytes):
            out.append([])
            size = 0
        out[-1].append(request)
        size += nbytes
    return out


def batch_request(table: TableConfig, due: list[tuple[str, int, int, str, str | None, int]]) -> RunRequest:
    """One batched compaction run; its run key names exactly these streams at these positions (the same due
    streams never launch two runs)."""
    import hashlib
    from collections import Counter

    names = "\n".join(run_key(table, pkey, stream, position, repair) for pkey, stream, position, _, _, repair in due)
    rules = Counter(rule or "unknown" for _, _, _, _, rule, _ in due)
    return RunRequest(
        run_key=f"{table.name}|batch|{len(due)}|{hashlib.sha1(names.encode()).hexdigest()}",
        job_name=table.batch_job_name,
        run_config={"ops": {table.batch_op_name: {"config": {"partitions": [d[0] for d in due]}}}},
        tags={"flash/table": table.name, "flash/streams": str(len(due)), "flash/trigger": due[0][3][:200],
              "flash/trigger_rule": rules.most_common(1)[0][0],
              "flash/partitions": ",".join(d[0] for d in due)[:200]},
    )


def unregistered(instance: Any, partitions: DynamicPartitionsDefinition, wanted: list[str]) -> list[str]:
    """The keys among ``wanted`` not yet registered: a question per key when few (the usual tick), one listing
    of the definition's keys when many."""
    name = str(partitions.name)
    if len(wanted) <= 50:
        return [k for k in wanted if not instance.has_dynamic_partition(name, k)]
    known = set(instance.get_dynamic_partitions(name))
    return [k for k in wanted if k not in known]


PARTITIONS_PER_REQUEST = 1_000


def add_requests(partitions: DynamicPartitionsDefinition, keys: list[str]) -> list[Any]:
    """Requests adding ``keys`` to ``partitions``, at most PARTITIONS_PER_REQUEST each: a load touching 10,000 new
    partition streams registers them in bounded batches, not one request the instance writes at once."""
    return [partitions.build_add_request(keys[i:i + PARTITIONS_PER_REQUEST]) for i in range(0, len(keys), PARTITIONS_PER_REQUEST)]


def lake_not_found(catalog: Catalog, kind: str, tables: list[str]) -> str:
    """The skip reason of a tick that finds none of the configured tables: the lake may be new (nothing loaded
    yet) or its path mistyped, which once read as "no new deltas" forever."""
    from pathlib import Path

    where = catalog.uri
    if "://" not in where and not Path(where).exists():
        return f"the lake directory {where} does not exist: check FLASH_LAKE (or --lake) if deltas were already appended"
    return (f"no configured {kind} table ({', '.join(tables[:5])}) exists in the lake {where} yet: "
            "check FLASH_LAKE (or --lake) if deltas were already appended")


def run_key(table: TableConfig, pkey: str, stream: int, position: int, repair: int = 0) -> str:
    """A stream at a position; after a repair (skip-delta/unskip: ``repair`` is its feed record) another key, or the
    daemon would drop the retry as the run that failed (a skip leaves the last position as it was)."""
    return f"{table.name}|{pkey}|v{stream}|{position}" + (f"|r{repair}" if repair else "")


def _tick_table(context: SensorEvaluationContext, cat: Catalog, table: TableConfig, state: dict[str, Any],
                sensor_name: str) -> ScanResult:
    """``scan_table`` with the pending streams kept in the instance's key-value store (one snapshot per change)."""
    store = context.instance.run_storage
    snapshot = int(state.get("state", 0))

    def load() -> dict[str, Any]:
        return pending_streams_of(context.instance, json.dumps({"tables": {table.name: state}}), table, sensor_name)

    res = scan_table(cat, table, state, in_flight=_runs_in_flight(context, table), load_streams=load)
    streams = res.entries.pop("streams", None)
    if res.changed and streams is not None:
        new = snapshot + 1
        # one key a call: Dagster's SQL run storage (SQLite, PostgreSQL) inserts a call's pairs in one statement and,
        # if any key exists, only updates the existing ones, so a new snapshot written with the blanking of an old
        # one was dropped on SQLite (every later tick then read an empty snapshot and forgot the waiting streams)
        store.set_cursor_values({state_key(sensor_name, table, new): json.dumps(streams, separators=(",", ":"))})
        if snapshot > 1:  # two back: no cursor can name it any more
            store.set_cursor_values({state_key(sensor_name, table, snapshot - 1): ""})
        res.entries["state"] = new
    else:
        res.entries["state"] = snapshot
    return res


def build_new_delta_sensor(project: ProjectConfig, partitions: dict[str, DynamicPartitionsDefinition], jobs: dict[str, Any],
                           minimum_interval_seconds: int = 30, default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> Any:
    @sensor(
        name="new_delta_sensor",
        jobs=list(jobs.values()),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Follows the change feed of every configured table (any writer), registers partition streams, reports "
        "new deltas as materializations of <name>/deltas (tables without a load) and requests batched compaction runs "
        "(many streams each) of the streams that are due, honouring each table's trigger policy.",
    )
    def new_delta_sensor(context: SensorEvaluationContext, catalog: CatalogResource) -> SensorResult | SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {}
        tables_state = cursor.get("tables", {}) if cursor.get("v") == CURSOR_VERSION else {}
        cat = catalog.get_catalog()
        run_requests: list[RunRequest] = []
        asset_events: list[AssetMaterialization] = []
        partition_requests = []
        waiting: list[str] = []
        missing: list[str] = []
        for table in project.tables:
            res = _tick_table(context, cat, table, tables_state.get(table.name, {}), "new_delta_sensor")
            if res.table_missing:
                missing.append(table.source)
                continue
            tables_state[table.name] = res.entries
            wanted = sorted(set(res.new_partition_keys) | {r[0] for r in res.requests})
            new_keys = unregistered(context.instance, partitions[table.name], wanted) if wanted else []
            if new_keys:
                partition_requests += add_requests(partitions[table.name], new_keys)
                context.log.info(f"{table.name}: {len(new_keys)} new partition stream(s): {', '.join(new_keys[:10])}")
            if table.load is None:  # a load run reports its own deltas; any other writer's are reported here
                asset_events += delta_events(table, res.new_deltas, "a writer outside this deployment (seen by new_delta_sensor)")
            run_requests += [batch_request(table, due) for due in batches(table, res)]
            waiting += [f"{table.name} {w}" for w in res.waiting]
        new_cursor = json.dumps({"v": CURSOR_VERSION, "tables": tables_state}, separators=(",", ":"), sort_keys=True)
        if not run_requests and not partition_requests and not asset_events:
            context.update_cursor(new_cursor)
            if missing and len(missing) == len(project.tables):  # a mistyped lake path looks like an idle lake
                return SkipReason(lake_not_found(cat, "source", missing))
            absent = f"; not in the lake yet: {', '.join(missing[:5])} (check the source IDs in tables.yaml)" if missing else ""
            return SkipReason("no partition stream is due: " + ("; ".join(waiting[:5]) if waiting else "no new deltas")
                              + absent)
        if missing:
            context.log.info(f"configured source table(s) not in the lake yet: {', '.join(missing[:5])}")
        return SensorResult(run_requests=run_requests, dynamic_partitions_requests=partition_requests, asset_events=asset_events,
                            cursor=new_cursor)

    return new_delta_sensor


__all__ = ["ScanResult", "add_requests", "batch_request", "batches", "build_new_delta_sensor", "streams_in_flight", "lake_not_found", "pending_streams_of", "run_key", "scan_table", "unregistered"]
