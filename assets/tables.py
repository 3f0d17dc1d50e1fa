"""The assets of one configured table (definitions only): the delta stream (a PySpark load or an external
writer), the compacted stream and its primary key index (one multi-asset run on Ray, with asset checks), the
index rehash and the small-file packing. All partitioned by partition stream (dynamic partitions registered by
the new-delta sensor). The engine calls live in ``assets/engine.py``, the metadata in ``assets/metadata.py``.

No ``from __future__ import annotations`` here: Dagster resolves the run config types of the asset functions."""


import os
import time
import warnings
from typing import Any, Iterator

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    BetaWarning,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset,
)

from assets.checks import check_specs
from assets.engine import engine_errors, run_compaction, run_optimize, run_rehash
from resources.keys import keys
from sensors.lineage import delta_events, register_partitions
from assets.run_config import CompactConfig, LoadRunConfig, OptimizeRunConfig, RehashConfig
from flash_pipeline.catalog.encoding import format_partition
from resources import CatalogResource, DeferredPySparkResource, RayResource
from resources.config import TableConfig

warnings.filterwarnings("ignore", category=BetaWarning)  # backfill_policy on an asset is beta

# a backfill of rehash or optimize over thousands of partitions runs this many partitions per run
BACKFILL_PARTITIONS_PER_RUN = 256



def build_table_assets(table: TableConfig, partitions: DynamicPartitionsDefinition) -> list[Any]:
    k = keys(table)
    out: list[Any] = [] if table.load is None else [_load_asset(table, partitions, table.load)]
    writer = f"the PySpark load {table.name}/load" if table.load is not None else "any writer (reported by the new-delta sensor)"
    out.append(AssetSpec(k["deltas"], deps=[k["load"]] if table.load is not None else [], partitions_def=partitions,
                         group_name=table.name, kinds={"parquet"},
                         description=f"Deltas of {table.source}, one partition per partition stream, committed by {writer}."))
    out += [_compact_asset(table, partitions), _rehash_asset(table, partitions), _optimize_asset(table, partitions)]
    return out


def _load_asset(table: TableConfig, partitions: DynamicPartitionsDefinition, load: Any) -> Any:
    """The PySpark load of the table's demo events: one delta per order day."""
    k = keys(table)
    group = table.name

    @asset(
        key=k["load"],
        group_name=group,
        kinds={"pyspark"},
        description=f"A PySpark load of order-status events into {table.source} ({load.orders} orders per batch over "
        f"{load.days} order days), committed to the catalog as one delta per order day: it materializes the partitions "
        f"of {table.name}/deltas it wrote.",
    )
    def load_asset(context: AssetExecutionContext, config: LoadRunConfig, catalog: CatalogResource, pyspark: DeferredPySparkResource) -> MaterializeResult:
        from flash_pipeline.spark.order_status import load_batch
    
        t0 = time.perf_counter()
        if str(pyspark.spark_config.get("spark.master", "local")).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local Spark: loopback, and no warning about it
        with engine_errors(table.source, "all", "load"):
            report = load_batch(pyspark.spark_session, catalog.get_catalog(), table.source, batch=config.batch,
                                orders=config.orders or load.orders, days=load.days, files_per_day=load.files_per_day)
        context.log.info(report.describe())
        register_partitions(context.instance, partitions, report.deltas)
        for event in delta_events(table, report.deltas, f"the PySpark load, batch {report.batch}"):
            context.log_event(event)
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

    return load_asset


def _compact_asset(table: TableConfig, partitions: DynamicPartitionsDefinition) -> Any:
    """The compacted stream and its primary key index, materialized together by one compaction run."""
    k = keys(table)
    group = table.name

    @multi_asset(
        name=f"{table.name}__compact",
        specs=[
            AssetSpec(k["compacted"], deps=[k["deltas"]], partitions_def=partitions, group_name=group, kinds={"ray"},
                      description=f"The compacted stream {table.destination}: one row per primary key {list(table.primary_keys)}, latest by {[str(s) for s in table.sort_keys] or 'stream position'}."),
            AssetSpec(k["index"], deps=[k["deltas"]], partitions_def=partitions, group_name=group, kinds={"ray"},
                      description="The primary key index version of the compacted stream (digest, file, row, sort key bytes per row)."),
        ],
        check_specs=check_specs(table, partitions),
        can_subset=False,
    )
    def compact_asset(context: AssetExecutionContext, config: CompactConfig, catalog: CatalogResource, ray: RayResource) -> Iterator[Any]:
        yield from run_compaction(context, table, config, catalog, ray)

    return compact_asset


def _rehash_asset(table: TableConfig, partitions: DynamicPartitionsDefinition) -> Any:
    """The rehash of a partition stream's primary key index (backfilled over the partitions chosen)."""
    k = keys(table)
    group = table.name

    @asset(
        key=k["rehash"],
        deps=[k["index"]],
        partitions_def=partitions,
        group_name=group,
        backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=BACKFILL_PARTITIONS_PER_RUN),
        description=f"Rehashes the primary key index of a partition stream to {table.rehash_buckets} buckets (configurable; "
        f"select partitions and backfill: up to {BACKFILL_PARTITIONS_PER_RUN} partitions per run); no table data is read. "
        "Each partition materializes its new primary key index version and evaluates the index checks on it.",
    )
    def rehash_asset(context: AssetExecutionContext, config: RehashConfig, catalog: CatalogResource) -> Iterator[Any]:
        target = table.rehash_buckets if config.hash_bucket_count is None else config.hash_bucket_count  # 0 is refused, not the default
        done = yield from run_rehash(context, table, target, catalog)
        if len(done) == 1:
            (one,) = done.values()
            metadata = {"hash buckets": target, "from buckets": one["from buckets"], "compacted version": one["compacted version"],
                        "index version": one["index version"], "dagster/row_count": one["index rows"]}
        else:
            metadata = {"hash buckets": target, "partitions": len(done), "dagster/row_count": sum(d["index rows"] for d in done.values()),
                        "per partition": MetadataValue.json(done)}
        yield MaterializeResult(metadata=metadata)

    return rehash_asset


def _optimize_asset(table: TableConfig, partitions: DynamicPartitionsDefinition) -> Any:
    """Delta's OPTIMIZE of the compacted stream: small files packed, same rows."""
    k = keys(table)
    group = table.name

    @asset(
        key=k["optimized"],
        deps=[k["compacted"]],
        partitions_def=partitions,
        group_name=group,
        backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=BACKFILL_PARTITIONS_PER_RUN),
        description=f"Packs the small files of the compacted stream {table.destination} (Delta's OPTIMIZE: bins of files "
        f"below {table.optimize.min_file_size} B up to {table.optimize.max_file_size} B, configurable); same rows, data_change=false.",
    )
    def optimize_asset(context: AssetExecutionContext, config: OptimizeRunConfig, catalog: CatalogResource) -> MaterializeResult:
        return run_optimize(context, table, config, catalog)

    return optimize_asset
