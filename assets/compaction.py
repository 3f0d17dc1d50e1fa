"""Per-table assets built from one ``TableConfig``: the delta stream (a PySpark load or an external writer),
the compacted stream and its primary key index (one multi-asset run on Ray, with asset checks) and the index
rehash. All partitioned by partition stream (dynamic partitions registered by the new-delta sensor)."""


import queue
import threading
import time
import warnings
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa
from dagster import (
    AssetCheckResult,
    BetaWarning,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSpec,
    BackfillPolicy,
    Config,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableSchema,
    asset,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from assets.config import TableConfig, parse_partition_key
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion
from resources import CatalogResource, RayResource

warnings.filterwarnings("ignore", category=BetaWarning)  # backfill_policy on an asset is beta

POINTER_SAMPLE = 64


def keys(table: TableConfig) -> dict[str, AssetKey]:
    return {
        "deltas": AssetKey([table.name, "deltas"]),
        "compacted": AssetKey([table.name, "compacted"]),
        "index": AssetKey([table.name, "pk_index"]),
        "rehash": AssetKey([table.name, "index_rehash"]),
        "optimized": AssetKey([table.name, "optimized"]),
    }


class CompactConfig(Config):
    """Run config of a compaction run; unset fields take the table's values from tables.yaml."""

    hash_bucket_count: Optional[int] = Field(default=None, description="hash buckets (default: the table's, or auto)")
    rows_per_compacted_file: Optional[int] = None
    rows_per_primary_key_index_file: Optional[int] = None
    desired_sla: Optional[float] = None
    max_round_bytes: Optional[int] = None
    rebuild: bool = False
    document_id: Optional[str] = Field(default=None, description="the SQS instruction document that asked for the run")


class RehashConfig(Config):
    hash_bucket_count: Optional[int] = Field(default=None, description="target bucket count (default: the table's rehash_buckets)")


class OptimizeRunConfig(Config):
    """Run config of a small-file packing run; unset fields take the table's ``optimize:`` values (Delta's 1 GiB)."""

    min_file_size: Optional[int] = Field(default=None, description="files smaller than this are packed (bytes)")
    max_file_size: Optional[int] = Field(default=None, description="a packed file's inputs total at most this (bytes)")


class LoadRunConfig(Config):
    batch: Optional[int] = Field(default=None, description="batch number (default: the next one)")
    orders: Optional[int] = None


def table_schema(compacted: CompactedVersion) -> TableSchema:
    if compacted.arrow_schema:
        cols = [TableColumn(f.name, str(f.type)) for f in compacted.pa_schema() if f.name != "__stream_position__"]
    else:
        cols = [TableColumn(c["name"], c["type"]) for c in compacted.schema if c["name"] != "__stream_position__"]
    return TableSchema(columns=cols)


# ----- checks (pure functions over the catalog; tests call them too) ----------------------------------------
def check_primary_keys_unique(catalog: Catalog, compacted: CompactedVersion) -> tuple[bool, dict[str, Any]]:
    from flash_pipeline.compactor.kernels.digest import primary_key_digests

    digests = []
    rows = 0
    for f in sorted(compacted.files, key=lambda f: f.file_number):
        t = catalog.read_file(f, list(compacted.primary_keys), schema=compacted.pa_schema() if compacted.arrow_schema else None)
        rows += t.num_rows
        if t.num_rows:
            digests.append(primary_key_digests(t, list(compacted.primary_keys)))
    all_d = np.concatenate(digests) if digests else np.empty((0, 20), dtype=np.uint8)
    distinct = len(np.unique(np.ascontiguousarray(all_d).view("S20").reshape(-1))) if len(all_d) else 0
    return distinct == rows, {"rows read": rows, "distinct primary keys": distinct, "duplicates": rows - distinct}


def check_index_rows(catalog: Catalog, compacted: CompactedVersion) -> tuple[bool, dict[str, Any]]:
    index_rows = compacted.index.rows if compacted.index else 0
    return index_rows == compacted.rows, {"index rows": index_rows, "compacted rows": compacted.rows}


def check_index_pointers(catalog: Catalog, compacted: CompactedVersion, sample: int = POINTER_SAMPLE, seed: int = 0) -> tuple[bool, dict[str, Any]]:
    """Sampled index rows: the compacted row they point at has the primary key digest they record."""
    from flash_pipeline.compactor.index import pk_index
    from flash_pipeline.compactor.kernels.digest import primary_key_digests

    if compacted.index is None:
        return compacted.rows == 0, {"sampled": 0, "reason": "no index"}
    rng = np.random.default_rng(seed)
    files = {f.file_number: f for f in compacted.files}
    buckets = [b for b in range(compacted.index.hash_bucket_count) if compacted.index.buckets[b]]
    picked = rng.choice(buckets, size=min(len(buckets), 8), replace=False) if buckets else []
    bad: list[str] = []
    sampled = 0
    cache: dict[int, pa.Table] = {}
    per_bucket = max(1, sample // max(1, len(picked)))
    for b in picked:
        rows = pk_index.read_bucket(catalog.storage, compacted.index, int(b))
        for i in rng.choice(len(rows), size=min(len(rows), per_bucket), replace=False):
            r = rows[int(i)]
            sampled += 1
            f = files.get(int(r["file"]))
            if f is None:
                bad.append(f"bucket {b}: file {int(r['file'])} not in version {compacted.version}")
                continue
            if f.file_number not in cache:
                cache[f.file_number] = catalog.read_file(f, list(compacted.primary_keys), schema=compacted.pa_schema() if compacted.arrow_schema else None)
            t = cache[f.file_number]
            row = int(r["row"])
            if row >= t.num_rows:
                bad.append(f"bucket {b}: row {row} beyond file {f.file_number}'s {t.num_rows} rows")
                continue
            got = primary_key_digests(t.slice(row, 1), list(compacted.primary_keys))[0].tobytes()
            if got != bytes(r["digest"]).ljust(20, b"\0"):
                bad.append(f"bucket {b}: file {f.file_number} row {row} holds another primary key")
    return not bad, {"sampled": sampled, "unresolved": len(bad), "first problems": "; ".join(bad[:5]) or "none"}


def check_files_intact(catalog: Catalog, table: TableConfig, partition: Any) -> tuple[bool, dict[str, Any]]:
    """``flash_pipeline.verify`` for one partition: every file of the latest compacted version and of the source
    stream's uncompacted deltas exists with its recorded size, content checksum and rows; index pointers resolve."""
    from flash_pipeline.verify import VerifyResult, verify

    results: list[VerifyResult] = []
    for table_id in dict.fromkeys((table.destination, table.source)):
        if catalog.table_exists(table_id) and partition in catalog.partitions(table_id):
            results.append(verify(catalog, table_id, [partition]))
    problems = [p.line() for r in results for p in r.problems]
    meta: dict[str, Any] = {
        "summary": "; ".join(r.summary() for r in results) or "nothing to verify",
        "files read": sum(r.files for r in results),
        "bytes read": sum(r.bytes for r in results),
        "problems": len(problems),
    }
    if problems:
        meta["problem lines"] = MetadataValue.md("\n".join(f"- `{line}`" for line in problems[:50]))
        meta["first problem"] = problems[0]
    return not problems, meta


def run_checks(catalog: Catalog, table: TableConfig, compacted: CompactedVersion | None, partition: Any = None) -> list[AssetCheckResult]:
    k = keys(table)
    part = compacted.partition if compacted is not None else partition
    intact: list[AssetCheckResult] = []
    if part is not None:
        try:
            passed, meta = check_files_intact(catalog, table, part)
        except Exception as exc:  # noqa: BLE001 - the check fails with its reason rather than failing the run
            passed, meta = False, {"error": f"{type(exc).__name__}: {exc}"}
        if compacted is not None:
            meta = {"compacted version": compacted.version, **meta}
        intact.append(AssetCheckResult(asset_key=k["compacted"], check_name="files_intact", passed=passed,
                                       severity=AssetCheckSeverity.ERROR, metadata=meta))
    if compacted is None:
        return [
            AssetCheckResult(asset_key=k["compacted"], check_name="primary_keys_unique", passed=True, metadata={"rows read": 0}),
            AssetCheckResult(asset_key=k["index"], check_name="index_rows_match_compacted", passed=True),
            AssetCheckResult(asset_key=k["index"], check_name="index_pointers_resolve", passed=True),
            *intact,
        ]
    out = []
    for key, name, fn in (
        (k["compacted"], "primary_keys_unique", check_primary_keys_unique),
        (k["index"], "index_rows_match_compacted", check_index_rows),
        (k["index"], "index_pointers_resolve", check_index_pointers),
    ):
        try:
            passed, meta = fn(catalog, compacted)
        except Exception as exc:  # noqa: BLE001 - an unreadable file fails the check, with its reason
            passed, meta = False, {"error": f"{type(exc).__name__}: {exc}"}
        out.append(AssetCheckResult(asset_key=key, check_name=name, passed=passed, severity=AssetCheckSeverity.ERROR,
                                    metadata={"compacted version": compacted.version, **meta}))
    return out + intact


def check_specs(table: TableConfig) -> list[AssetCheckSpec]:
    k = keys(table)
    return [
        AssetCheckSpec("primary_keys_unique", asset=k["compacted"], description="no primary key appears twice in the compacted stream version"),
        AssetCheckSpec("index_rows_match_compacted", asset=k["index"], description="the index has one row per compacted row"),
        AssetCheckSpec("index_pointers_resolve", asset=k["index"], description=f"{POINTER_SAMPLE} sampled index pointers resolve to rows with their primary key"),
        AssetCheckSpec("files_intact", asset=k["compacted"], description="every file of the latest compacted version (data and index) and of the uncompacted deltas exists with its recorded size, content checksum and row count, and every index pointer resolves (flash-compactor verify)"),
    ]


# ----- compaction -------------------------------------------------------------------------------------------
def engine_failure(exc: BaseException, table_id: str, partition: str, what: str) -> BaseException:
    """The engine's one-line error as a ``dagster.Failure`` (the CLI prints the same line); anything else as is.

    The line names the fix (a conflicting writer: run again; a blocked stream: the skip-delta or new-stream
    command), so the run page shows what to do; the traceback stays in the debug log."""
    from dagster import Failure

    from flash_pipeline.errors import FlashError

    if not isinstance(exc, FlashError):
        return exc
    line = " ".join(str(exc).split())
    return Failure(
        description=line,
        metadata={"table": table_id, "partition": partition, "operation": what, "error": type(exc).__name__,
                  "exit code (CLI)": int(exc.exit_code)},
    )



def _round_observation(asset_key: AssetKey, partition: str, info: dict[str, Any]) -> AssetObservation:
    """One observation per committed round, from the engine's structured ``on_round`` report."""
    return AssetObservation(
        asset_key=asset_key,
        partition=partition,
        description=f"round {info['round']}/{info['rounds']} committed",
        metadata={
            "round": int(info["round"]),
            "rounds": int(info["rounds"]),
            "compacted version": int(info["compacted_version"]),
            "last position": int(info["last_position"]),
            "rows": int(info["rows"]),
            "files written": int(info["files_written"]),
            "files carried": int(info["files_carried"]),
            "elapsed seconds": float(info["elapsed_seconds"]),
            "expected total seconds": float(info["expected_seconds"]),
        },
    )


def run_compaction(context: AssetExecutionContext, table: TableConfig, config: CompactConfig, catalog: CatalogResource, ray: RayResource) -> Iterator[Any]:
    from flash_pipeline import compact

    k = keys(table)
    pkey = context.partition_key
    part = parse_partition_key(pkey)
    cat = catalog.get_catalog()
    messages: "queue.Queue[str | dict[str, Any]]" = queue.Queue()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = compact(
                table.source,
                list(table.primary_keys),
                sort_keys=table.sort_key_pairs(),
                desired_sla=config.desired_sla if config.desired_sla is not None else table.desired_sla,
                catalog=cat,
                destination_compacted_table_id=table.destination,
                rows_per_primary_key_index_file=config.rows_per_primary_key_index_file or table.rows_per_index_file,
                rows_per_compacted_file=config.rows_per_compacted_file or table.rows_per_file,
                hash_bucket_count=config.hash_bucket_count or table.hash_buckets,
                compacted_file_content_type=table.format,
                partitions=[part],
                rebuild=config.rebuild,
                max_round_bytes=config.max_round_bytes,
                progress=messages.put,
                on_round=messages.put,
                **ray.compact_kwargs(),
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the run's thread below
            outcome["error"] = exc

    started = time.perf_counter()
    # Start (or join) Ray in this long-lived thread, not in the worker thread below: a local Ray's GCS and raylet
    # die with the thread that started them (they are spawned with a parent-death signal, which Linux delivers
    # when the spawning *thread* exits).
    from flash_pipeline.compactor.runtime.cluster import ensure_ray

    ensure_ray(num_cpus=ray.num_cpus, address=ray.address)
    worker = threading.Thread(target=work, name=f"compact-{table.name}", daemon=True)
    worker.start()
    # the run's thread logs progress while the engine works: one observation per committed round
    while True:
        try:
            msg = messages.get(timeout=0.2)
        except queue.Empty:
            if not worker.is_alive():
                break
            continue
        if isinstance(msg, dict):
            context.log_event(_round_observation(k["compacted"], pkey, msg))
        else:
            context.log.info(msg)
    worker.join()
    if "error" in outcome:
        raise engine_failure(outcome["error"], table.source, pkey, "compaction")
    result = outcome["result"]
    pres = result.partitions[0] if result.partitions else None
    compacted = cat.latest_compacted(table.destination, part)
    wall = time.perf_counter() - started
    meta: dict[str, Any] = {
        "source table": table.source,
        "destination table": table.destination,
        "partition": format_partition(part),
        "status": pres.status if pres else "no stream",
    }
    if pres is not None and pres.status == "compacted":
        meta.update(
            {
                "rows in": pres.rows_in,
                "delete rows in": pres.delete_rows_in,
                "prior rows": pres.prior_rows,
                "rows out": pres.rows_out,
                "duplicates dropped": pres.duplicates_dropped,
                "deletes applied": pres.deletes_applied,
                "files written": pres.files_written,
                "bytes written": pres.bytes_written,
                "files carried": pres.files_carried,
                "bytes carried": pres.bytes_carried,
                "hash buckets": pres.hash_bucket_count,
                "rounds": pres.rounds,
                "expected seconds": pres.expected_seconds,
                "actual seconds": pres.seconds.get("total", wall),
                "step seconds": MetadataValue.json({k2: round(v, 4) for k2, v in pres.seconds.items()}),
                "notes": "; ".join(pres.notes) or "none",
            }
        )
    if document := config.document_id:
        meta["instruction document"] = document
    if compacted is not None:
        meta.update(
            {
                "dagster/row_count": compacted.rows,
                "dagster/column_schema": table_schema(compacted),
                "compacted version": compacted.version,
                "last position": compacted.last_position,
                "files": len(compacted.files),
                "bytes": compacted.bytes,
            }
        )
    meta["summary"] = MetadataValue.md(_summary(table, part, pres, compacted, wall))
    yield MaterializeResult(asset_key=k["compacted"], metadata=meta)
    index_meta: dict[str, Any] = {"partition": format_partition(part)}
    if compacted is not None and compacted.index is not None:
        index_meta.update(
            {
                "index version": compacted.index.version,
                "hash buckets": compacted.index.hash_bucket_count,
                "dagster/row_count": compacted.index.rows,
                "bytes": compacted.index.bytes,
                "index files": sum(len(b) for b in compacted.index.buckets),
                "sort key width": compacted.index.sort_key_width,
                "bytes written": pres.index_bytes_written if pres and pres.status == "compacted" else 0,
            }
        )
    yield MaterializeResult(asset_key=k["index"], metadata=index_meta)
    yield from run_checks(cat, table, compacted, part)


def _summary(table: TableConfig, part: Any, pres: Any, compacted: CompactedVersion | None, wall: float) -> str:
    head = f"### {table.destination} [{format_partition(part)}]\n\n"
    if pres is None or pres.status != "compacted":
        state = f"version {compacted.version}, {compacted.rows} rows" if compacted else "nothing compacted yet"
        return head + f"No new deltas: up to date ({state})."
    lines = [
        "| | |", "|---|---|",
        f"| rows in (upserts) | {pres.rows_in:,} (+{pres.prior_rows:,} compacted, {pres.delete_rows_in:,} delete keys) |",
        f"| rows out | **{pres.rows_out:,}** |",
        f"| duplicates dropped / deletes applied | {pres.duplicates_dropped:,} / {pres.deletes_applied:,} |",
        f"| files written / carried by reference | {pres.files_written} ({pres.bytes_written:,} B) / {pres.files_carried} ({pres.bytes_carried:,} B) |",
        f"| hash buckets / rounds | {pres.hash_bucket_count} / {pres.rounds} |",
        f"| latency expected / actual | {pres.expected_seconds or 0:.1f}s / {pres.seconds.get('total', wall):.1f}s |",
        f"| compacted version | {pres.compacted_version} (up to position {pres.last_position}) |",
    ]
    return head + "\n".join(lines) + "\n"


def build_table_assets(table: TableConfig, partitions: DynamicPartitionsDefinition) -> list[Any]:
    k = keys(table)
    group = table.name
    out: list[Any] = []

    if table.load is not None:
        load = table.load

        @asset(
            key=k["deltas"],
            group_name=group,
            kinds={"pyspark"},
            description=f"Deltas of {table.source}: a PySpark load of order-status events ({load.orders} orders per batch over {load.days} order days), committed to the catalog as one delta per order day.",
        )
        def load_asset(context: AssetExecutionContext, config: LoadRunConfig, catalog: CatalogResource, pyspark: LazyPySparkResource) -> MaterializeResult:
            from flash_pipeline.spark.order_status import load_batch

            t0 = time.perf_counter()
            report = load_batch(pyspark.spark_session, catalog.get_catalog(), table.source, batch=config.batch,
                                orders=config.orders or load.orders, days=load.days, files_per_day=load.files_per_day)
            context.log.info(report.describe())
            return MaterializeResult(
                metadata={
                    "batch": report.batch,
                    "events": report.upsert_rows,
                    "late events": report.late_rows,
                    "cancellations": report.delete_rows,
                    "deltas": len(report.deltas),
                    "partitions": MetadataValue.json(report.partitions),
                    "positions": MetadataValue.json({f"{d.operation} {format_partition(d.partition)}": d.position for d in report.deltas}),
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )

        out.append(load_asset)
    else:
        out.append(AssetSpec(k["deltas"], group_name=group, description=f"Deltas of {table.source}, written by any writer (external asset).", kinds={"parquet"}))

    @multi_asset(
        name=f"{table.name}__compact",
        specs=[
            AssetSpec(k["compacted"], deps=[k["deltas"]], partitions_def=partitions, group_name=group, kinds={"ray"},
                      description=f"The compacted stream {table.destination}: one row per primary key {list(table.primary_keys)}, latest by {list(table.sort_keys) or 'stream position'}."),
            AssetSpec(k["index"], deps=[k["deltas"]], partitions_def=partitions, group_name=group, kinds={"ray"},
                      description="The primary key index version of the compacted stream (digest, file, row, sort key bytes per row)."),
        ],
        check_specs=check_specs(table),
        can_subset=False,
    )
    def compact_asset(context: AssetExecutionContext, config: CompactConfig, catalog: CatalogResource, ray: RayResource) -> Iterator[Any]:
        yield from run_compaction(context, table, config, catalog, ray)

    @asset(
        key=k["rehash"],
        deps=[k["index"]],
        partitions_def=partitions,
        group_name=group,
        backfill_policy=BackfillPolicy.single_run(),
        description=f"Rehashes the primary key index of the chosen partition streams to {table.rehash_buckets} buckets (configurable); no table data is read.",
    )
    def rehash_asset(context: AssetExecutionContext, config: RehashConfig, catalog: CatalogResource) -> MaterializeResult:
        from flash_pipeline.compactor.index.rehash import rehash

        cat = catalog.get_catalog()
        target = config.hash_bucket_count or table.rehash_buckets
        done = []
        for pkey in context.partition_keys:
            part = parse_partition_key(pkey)
            before = cat.latest_compacted(table.destination, part)
            (new,) = rehash(cat, table.destination, target, partitions=[part], log=context.log.info)
            frm = before.index.hash_bucket_count if before and before.index else None
            context.log.info(f"{table.destination} [{format_partition(part)}]: index rehashed {frm} -> {target} buckets, version {new.version}")
            done.append({"partition": pkey, "from buckets": frm, "to buckets": target, "compacted version": new.version,
                         "index version": new.index.version if new.index else None, "index rows": new.index.rows if new.index else 0})
        return MaterializeResult(
            metadata={
                "hash buckets": target,
                "partitions rehashed": len(done),
                "dagster/row_count": sum(d["index rows"] for d in done),
                "rehashed": MetadataValue.json(done),
            }
        )

    @asset(
        key=k["optimized"],
        deps=[k["compacted"]],
        partitions_def=partitions,
        group_name=group,
        backfill_policy=BackfillPolicy.single_run(),
        description=f"Packs the small files of the compacted stream {table.destination} (Delta's OPTIMIZE: bins of files "
        f"below {table.optimize.min_file_size} B up to {table.optimize.max_file_size} B, configurable); same rows, data_change=false.",
    )
    def optimize_asset(context: AssetExecutionContext, config: OptimizeRunConfig, catalog: CatalogResource) -> MaterializeResult:
        return run_optimize(context, table, config, catalog)

    out += [compact_asset, rehash_asset, optimize_asset]
    return out


# ----- small-file packing -------------------------------------------------------------------------------------
def run_optimize(context: AssetExecutionContext, table: TableConfig, config: OptimizeRunConfig, catalog: CatalogResource) -> MaterializeResult:
    """``flash_pipeline.optimize.optimize`` on the compacted table for the run's partition(s) (one or a backfill range)."""
    from flash_pipeline.optimize import OptimizeResult, PartitionOptimizeResult, optimize

    cat = catalog.get_catalog()
    min_size = config.min_file_size or table.optimize.min_file_size
    max_size = config.max_file_size or table.optimize.max_file_size
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
            one = optimize(cat, table.destination, partitions=[part], min_file_size=min_size, max_file_size=max_size,
                           progress=context.log.info)
            res = one.partitions[0]
        total.partitions.append(res)
        latest = cat.latest_compacted(table.destination, part) if prior is not None else None
        if latest is not None:
            rows += latest.rows
            versions[pkey] = {"version": latest.version, "files": len(latest.files), "data_change": latest.data_change}
            if res.status == "optimized":
                committed_data_change.append(latest.data_change)
    total.seconds = time.perf_counter() - started
    added, removed = total.files_added, total.files_removed
    meta: dict[str, Any] = {
        "table": table.destination,
        "partitions": len(total.partitions),
        "partitions optimized": total.partitions_optimized,
        "status": total.partitions[0].status if len(total.partitions) == 1 else f"{total.partitions_optimized} optimized",
        "min file size": int(min_size),
        "max file size": int(max_size),
        "num files added": total.num_files_added,
        "num files removed": total.num_files_removed,
        "bytes added": added.total_size,
        "bytes removed": removed.total_size,
        "files added": MetadataValue.json(added.to_json()),
        "files removed": MetadataValue.json(removed.to_json()),
        "num bins": total.num_bins,
        "total considered files": total.total_considered_files,
        "total files skipped": total.total_files_skipped,
        "data change": any(committed_data_change),  # as recorded on the committed versions (optimize: false)
        "seconds": round(total.seconds, 4),
        "dagster/row_count": rows,
        "versions": MetadataValue.json(versions),
        "per partition": MetadataValue.json([p.to_json() for p in total.partitions]),
    }
    meta["summary"] = MetadataValue.md(_optimize_summary(table, total))
    return MaterializeResult(metadata=meta)


def _optimize_summary(table: TableConfig, total: Any) -> str:
    added, removed = total.files_added, total.files_removed
    lines = [
        f"### OPTIMIZE {table.destination}\n",
        f"Bins of files below **{total.min_file_size:,} B** packed up to **{total.max_file_size:,} B** each; "
        "rows unchanged, committed with `data_change: false`.\n",
        "| | |", "|---|---|",
        f"| files removed | {removed.total_files:,} ({removed.total_size:,} B) |",
        f"| files added | **{added.total_files:,}** ({added.total_size:,} B) |",
        f"| bins | {total.num_bins:,} |",
        f"| files considered / skipped | {total.total_considered_files:,} / {total.total_files_skipped:,} |",
        f"| partitions optimized | {total.partitions_optimized} of {len(total.partitions)} |",
        f"| seconds | {total.seconds:.2f} |",
        "",
        "| partition | status | version | files removed -> added | notes |", "|---|---|---|---|---|",
    ]
    for p in total.partitions:
        lines.append(f"| {format_partition(p.partition)} | {p.status} | {p.compacted_version if p.compacted_version is not None else '-'} "
                     f"| {p.files_removed.total_files} -> {p.files_added.total_files} | {'; '.join(p.notes) or ''} |")
    return "\n".join(lines) + "\n"
