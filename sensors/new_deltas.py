"""The new-delta sensor: finds partition streams with pending deltas and requests their compaction.

Cursor (JSON): ``{"tables": {<table name>: {<partition component>: entry}}}`` with, per partition stream,

    key   the Dagster partition key          v     the active stream version
    seen  last delta position read           req   last position a run was requested for
    n/f/b/r deltas, files, bytes, rows pending (after ``req``)   t  commit time of the newest pending delta
    rq    set while no compacted version covers ``req`` (the last requested run's position)

A tick lists each table's partition directories (one listing), reads ``partition.json`` only for partitions it
has never seen, lists each known partition's delta positions (``Catalog.delta_positions``, one listing) and
reads only the manifests of positions it has not seen yet. The decision is ``flash_pipeline.triggers.decide``
(the rules ``flash-compactor auto`` uses) on the pending counts the cursor already holds: no re-listing per
partition, unlike ``triggers.evaluate``. Run keys are ``<table>|<partition>|v<stream>|<position>``,
so the same deltas never launch two runs.
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

from sensors.lineage import delta_events
from resources.config import ProjectConfig, TableConfig, partition_key, pending_trigger_stats
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.model import Delta
from flash_pipeline.errors import NotFound
from flash_pipeline.triggers import Decision, decide, pending_stats
from resources import CatalogResource


@dataclass
class ScanResult:
    entries: dict[str, dict[str, Any]]
    new_partition_keys: list[str] = field(default_factory=list)
    requests: list[tuple[str, int, int, str]] = field(default_factory=list)  # (partition key, stream, position, reason)
    decisions: dict[str, Decision] = field(default_factory=dict)  # partition key -> the trigger decision of this tick
    waiting: list[str] = field(default_factory=list)
    manifests_read: int = 0
    new_deltas: list[Delta] = field(default_factory=list)  # deltas this tick saw for the first time
    table_missing: bool = False  # the source table is not in the lake (yet, or a mistyped lake path)


def _active_version(catalog: Catalog, table_id: str, partition: Any, known: int | None) -> int | None:
    """The active stream version: one listing; stream.json is read only when the newest version changed."""
    prefix = f"{catalog.partition_prefix(table_id, partition)}/streams"
    versions = sorted(int(c) for c in catalog.storage.list_children(prefix) if c.isdigit())
    if not versions:
        return None
    if known is not None and versions[-1] == known:
        return known
    stream = catalog.active_stream(table_id, partition)
    return stream.version if stream is not None else None


def scan_table(catalog: Catalog, table: TableConfig, entries: dict[str, dict[str, Any]], now: float | None = None,
               in_flight: Callable[[str], bool] | None = None) -> ScanResult:
    """One tick for one table: update the cursor entries and decide which streams to compact.

    Pending means what no commit covers yet: while no compacted version covers the last requested run's position
    (``rq``) and no run is working on the partition (``in_flight(partition key)``), that run failed or was
    cancelled, and the next delta is judged on the lake's own pending deltas (``triggers.pending_stats``: skipped
    ones left out), as ``flash-compactor auto`` judges them; otherwise on the cursor's counts of new deltas."""
    now = time.time() if now is None else now
    entries = {k: dict(v) for k, v in entries.items()}
    out = ScanResult(entries)
    policy = table.trigger
    if not catalog.table_exists(table.source):
        out.table_missing = True
        return out
    parts_prefix = f"{catalog.table_prefix(table.source)}/partitions"
    for component in catalog.storage.list_children(parts_prefix):
        entry = entries.get(component)
        if entry is None:
            try:
                data = json.loads(catalog.storage.read(f"{parts_prefix}/{component}/partition.json"))
            except NotFound:
                continue  # a partition being created: next tick
            part = tuple((n, v) for n, v in data["partition"])
            entry = {"key": partition_key(part), "p": [[n, v] for n, v in part], "v": None, "seen": 0, "req": 0, "n": 0, "f": 0, "b": 0, "r": 0, "t": 0.0}
            entries[component] = entry
            out.new_partition_keys.append(entry["key"])
        part = tuple((n, v) for n, v in entry["p"])
        version = _active_version(catalog, table.source, part, entry["v"])
        if version is None:
            continue
        if version != entry["v"]:
            # a new stream version (restatement): its positions start over; compact() rebuilds from it
            entry.update({"v": version, "seen": 0, "req": 0, "n": 0, "f": 0, "b": 0, "r": 0, "t": 0.0})
            compacted = catalog.latest_compacted(table.destination, part)
            if compacted is not None and compacted.source_table_id == table.source and compacted.source_stream_version == version:
                entry["seen"] = entry["req"] = compacted.last_position  # compacted by someone else already
        positions = [p for p in catalog.delta_positions(table.source, part, version) if p > entry["seen"]]
        prefix = f"{catalog.stream_prefix(table.source, part, version)}/deltas"
        skipped = catalog.skipped_positions(table.source, part, version) if positions else set()  # skip-delta
        for pos in sorted(positions):
            if pos in skipped:  # not counted as pending; a trailing one is listed again until a later delta passes it
                continue
            try:
                delta = Delta.from_json(json.loads(catalog.storage.read(f"{prefix}/{pos:020d}.json")))
            except NotFound:
                break
            out.manifests_read += 1
            out.new_deltas.append(delta)
            entry["seen"] = pos
            entry["n"] = entry.get("n", 0) + 1
            entry["f"] += len(delta.files)
            entry["b"] += delta.bytes
            entry["r"] += delta.rows
            entry["t"] = max(entry["t"], delta.created_at)
        if entry["seen"] > entry["req"]:
            # a cursor written before "n" existed: at least one delta is pending
            n, t = max(1, entry.get("n", 0)), entry["t"]
            stats = pending_trigger_stats(n, entry["f"], entry["b"], entry["r"], now - t if t else None, t or None, version)
            from_lake = False
            if entry.get("rq") and not (in_flight is not None and in_flight(entry["key"])):
                if compacted_through(catalog, table, part, version) >= entry["req"]:
                    del entry["rq"]  # the requested run (or another writer) compacted its deltas
                else:  # that run failed or was cancelled: judge everything pending, as the lake says (skips applied)
                    stats = pending_stats(catalog, table.source, part, now, compacted_table_id=table.destination)
                    from_lake = True
            decision = decide(stats, policy)
            if decision.compact and not from_lake:
                # the cursor's counts may include deltas a commit already covers: a run that took deltas appended
                # after its request, or a compaction by the CLI or the API. Asked only before a request (one
                # listing and one manifest read): such deltas once started a run that found nothing to do, or
                # made a rule fire on rows already compacted
                covered = compacted_through(catalog, table, part, version)
                if covered >= entry["seen"]:
                    entry.pop("rq", None)
                    entry.update({"req": entry["seen"], "n": 0, "f": 0, "b": 0, "r": 0, "t": 0.0})
                    continue
                if covered > entry["req"]:  # the counts again, of the deltas after the commit only
                    pending = [d for d in catalog.pending(table.source, part, table.destination, keyed=False).deltas
                               if d.position <= entry["seen"]]
                    t = max((d.created_at for d in pending), default=0.0)
                    entry.update({"req": covered, "n": len(pending), "f": sum(len(d.files) for d in pending),
                                  "b": sum(d.bytes for d in pending), "r": sum(d.rows for d in pending), "t": t})
                    stats = pending_trigger_stats(len(pending), entry["f"], entry["b"], entry["r"], now - t if t else None,
                                                  t or None, version)
                    decision = decide(stats, policy)
            out.decisions[entry["key"]] = decision
            if not decision.compact:
                out.waiting.append(f"{entry['key']}: {decision.reason}")
                continue
            out.requests.append((entry["key"], version, entry["seen"], decision.reason))
            entry.update({"req": entry["seen"], "rq": 1, "n": 0, "f": 0, "b": 0, "r": 0})
    return out


def compacted_through(catalog: Catalog, table: TableConfig, part: Any, stream_version: int) -> int:
    """The last source position the destination's latest compacted version covers for this stream version (0 when
    none does): one listing and one manifest read, made only when new deltas follow a requested run."""
    compacted = catalog.latest_compacted(table.destination, part)
    if compacted is None or compacted.source_table_id != table.source or compacted.source_stream_version != stream_version:
        return 0
    return compacted.last_position or 0


def _runs_in_flight(context: SensorEvaluationContext, job_name: str) -> Callable[[str], bool]:
    """``partition key -> a run of job_name is queued or running for it``, asking the instance once, when first needed."""
    from dagster import DagsterRunStatus, RunsFilter

    keys: list[set[str]] = []

    def busy(pkey: str) -> bool:
        if not keys:
            statuses = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
                        DagsterRunStatus.CANCELING]
            runs = context.instance.get_runs(filters=RunsFilter(job_name=job_name, statuses=statuses))
            keys.append({r.tags.get("dagster/partition") for r in runs} - {None})
        return pkey in keys[0]

    return busy


def lake_not_found(catalog: Catalog, kind: str, tables: list[str]) -> str:
    """The skip reason of a tick that finds none of the configured tables: the lake may be new (nothing loaded
    yet) or its path mistyped, which once read as "no new deltas" forever."""
    from pathlib import Path

    where = catalog.uri
    if "://" not in where and not Path(where).exists():
        return f"the lake directory {where} does not exist: check FLASH_LAKE (or --lake) if deltas were already appended"
    return (f"no configured {kind} table ({', '.join(tables[:5])}) exists in the lake {where} yet: "
            "check FLASH_LAKE (or --lake) if deltas were already appended")


def run_key(table: TableConfig, pkey: str, stream: int, position: int) -> str:
    return f"{table.name}|{pkey}|v{stream}|{position}"


def build_new_delta_sensor(project: ProjectConfig, partitions: dict[str, DynamicPartitionsDefinition], jobs: dict[str, Any],
                           minimum_interval_seconds: int = 30, default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> Any:
    @sensor(
        name="new_delta_sensor",
        jobs=list(jobs.values()),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Finds new deltas of every configured table (any writer), registers partition streams, reports them as "
        "materializations of <name>/deltas (tables without a load) and "
        "requests one compaction run per stream with pending deltas, honouring each table's trigger policy.",
    )
    def new_delta_sensor(context: SensorEvaluationContext, catalog: CatalogResource) -> SensorResult | SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {}
        tables_state = cursor.get("tables", {})
        cat = catalog.get_catalog()
        run_requests: list[RunRequest] = []
        asset_events: list[AssetMaterialization] = []
        partition_requests = []
        waiting: list[str] = []
        missing: list[str] = []
        for table in project.tables:
            res = scan_table(cat, table, tables_state.get(table.name, {}), in_flight=_runs_in_flight(context, jobs[table.name].name))
            tables_state[table.name] = res.entries
            if res.table_missing:
                missing.append(table.source)
            if res.new_partition_keys:
                partition_requests.append(partitions[table.name].build_add_request(res.new_partition_keys))
                context.log.info(f"{table.name}: {len(res.new_partition_keys)} new partition stream(s): {', '.join(res.new_partition_keys[:10])}")
            if table.load is None:  # a load run reports its own deltas; any other writer's are reported here
                asset_events += delta_events(table, res.new_deltas, "a writer outside this deployment (seen by new_delta_sensor)")
            for pkey, stream, position, reason in res.requests:
                run_requests.append(
                    RunRequest(
                        run_key=run_key(table, pkey, stream, position),
                        job_name=jobs[table.name].name,
                        partition_key=pkey,
                        tags={"flash/table": table.name, "flash/trigger": reason[:200], "flash/last_position": str(position),
                              "flash/trigger_rule": (res.decisions[pkey].rule if pkey in res.decisions else None) or "unknown"},
                    )
                )
            waiting += [f"{table.name} {w}" for w in res.waiting]
        new_cursor = json.dumps({"tables": tables_state}, separators=(",", ":"), sort_keys=True)
        if not run_requests and not partition_requests and not asset_events:
            context.update_cursor(new_cursor)
            if missing and len(missing) == len(project.tables):  # a mistyped lake path looks like an idle lake
                return SkipReason(lake_not_found(cat, "source", missing))
            return SkipReason("no partition stream is due: " + ("; ".join(waiting[:5]) if waiting else "no new deltas"))
        return SensorResult(run_requests=run_requests, dynamic_partitions_requests=partition_requests, asset_events=asset_events,
                            cursor=new_cursor)

    return new_delta_sensor


__all__ = ["ScanResult", "build_new_delta_sensor", "lake_not_found", "run_key", "scan_table"]
