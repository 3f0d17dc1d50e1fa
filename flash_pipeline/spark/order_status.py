"""A generator of order-status events grown from the paper's CUSTOMER_ORDER_STATUS example, written by Spark.

One *batch* (one load run) does what an order system's change feed would:

- new orders: every order of the batch gets a SUBMITTED event and, depending on a hash of its ID, later
  PACKED / SHIPPED / DELIVERED events with increasing ``last_updated`` timestamps;
- out-of-order arrival: the events are shuffled within the batch, and a few stale SUBMITTED events of the
  previous batch's orders arrive late (their ``last_updated`` is older, so the sort key makes them lose);
- cancellations as deletes: about 1 in 10 orders of the previous batch is cancelled, written as a delete delta
  holding just their primary keys;
- a schema change: from batch ``CHANNEL_FROM_BATCH`` on, every event also says the ``channel`` it came through
  (the order system gained a field), which the streams take on by schema evolution
  (catalog/schema_evolution.py): earlier rows read it as null.

Spark writes the events as Parquet partitioned by ``order_day`` into a temporary directory; each day's part
files are then committed to the catalog as ONE upsert delta (and one delete delta for the cancellations) of
the partition stream ``order_day=<day>``. Timestamps are written as TIMESTAMP_MICROS so every delta has the
same Arrow schema.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.model import Delta

STATUSES = ("SUBMITTED", "PACKED", "SHIPPED", "DELIVERED")
FIRST_DAY = "1995-04-03"
PARTITION_COLUMN = "order_day"
PRIMARY_KEY = "order_id"
SORT_KEY = "last_updated"
CHANNEL_FROM_BATCH = 2  # the first batch whose events carry a ``channel`` column
CHANNELS = ("web", "app", "store")


@dataclass
class LoadReport:
    table_id: str
    batch: int
    upsert_rows: int = 0
    delete_rows: int = 0
    late_rows: int = 0
    deltas: list[Delta] = field(default_factory=list)

    @property
    def partitions(self) -> list[str]:
        return sorted({f"{n}={v}" for d in self.deltas for n, v in d.partition})

    def describe(self) -> str:
        return (
            f"{self.table_id} batch {self.batch}: {self.upsert_rows} events ({self.late_rows} late), "
            f"{self.delete_rows} cancellations, {len(self.deltas)} deltas over {len(self.partitions)} order days"
        )


def events_frame(spark: Any, batch: int, orders: int, days: int) -> tuple[Any, Any]:
    """(events, cancellations) DataFrames of one batch; deterministic in (batch, orders, days)."""
    from pyspark.sql import functions as F

    base = batch * orders
    ids = spark.range(base, base + orders).withColumnRenamed("id", PRIMARY_KEY)
    ids = ids.withColumn(PARTITION_COLUMN, F.date_format(
        F.date_add(F.lit(FIRST_DAY).cast("date"), (F.col(PRIMARY_KEY) % days).cast("int")), "yyyy-MM-dd"))
    # how far each order got: 0..3, from a hash of its ID
    ids = ids.withColumn("stage", (F.abs(F.xxhash64(F.col(PRIMARY_KEY), F.lit(batch))) % 4).cast("int"))
    events = ids.withColumn("s", F.explode(F.sequence(F.lit(0), F.col("stage"))))
    start = F.to_timestamp(F.col(PARTITION_COLUMN)) + F.make_interval(
        F.lit(0), F.lit(0), F.lit(0), F.lit(0), F.lit(0), F.lit(0), (F.col(PRIMARY_KEY) % 86_400).cast("decimal(18,6)"))
    events = events.select(
        PRIMARY_KEY,
        PARTITION_COLUMN,
        F.element_at(F.array(*[F.lit(s) for s in STATUSES]), F.col("s") + 1).alias("order_status"),
        (start + F.make_interval(F.lit(0), F.lit(0), F.lit(0), F.lit(0),
                                 F.col("s") * 7, F.lit(0), F.lit(0))).alias(SORT_KEY),
    )
    if batch > 0:
        prev = spark.range((batch - 1) * orders, batch * orders).withColumnRenamed("id", PRIMARY_KEY)
        prev = prev.withColumn(PARTITION_COLUMN, F.date_format(
            F.date_add(F.lit(FIRST_DAY).cast("date"), (F.col(PRIMARY_KEY) % days).cast("int")), "yyyy-MM-dd"))
        late = prev.where(F.col(PRIMARY_KEY) % 17 == 3).select(
            PRIMARY_KEY,
            PARTITION_COLUMN,
            F.lit("SUBMITTED").alias("order_status"),
            (F.to_timestamp(F.col(PARTITION_COLUMN)) - F.expr("INTERVAL 1 HOUR")).alias(SORT_KEY),
        )
        events = events.unionByName(late)
        cancelled = (prev.where(F.abs(F.xxhash64(F.col(PRIMARY_KEY), F.lit(7))) % 10 == 0)
                     .select(PRIMARY_KEY, PARTITION_COLUMN))
    else:
        cancelled = ids.where(F.lit(False)).select(PRIMARY_KEY, PARTITION_COLUMN)
    if batch >= CHANNEL_FROM_BATCH:
        channel = F.element_at(F.array(*[F.lit(c) for c in CHANNELS]),
                               (F.abs(F.xxhash64(F.col(PRIMARY_KEY))) % len(CHANNELS) + 1).cast("int"))
        events = events.withColumn("channel", channel)
    return events, cancelled


def _part_files(root: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for d in sorted(root.glob(f"{PARTITION_COLUMN}=*")):
        files = sorted(p for p in d.glob("part-*.parquet") if p.stat().st_size > 0)
        if files:
            out[d.name.split("=", 1)[1]] = files
    return out


def load_batch(
    spark: Any,
    catalog: Catalog,
    table_id: str,
    batch: int | None = None,
    orders: int = 2000,
    days: int = 3,
    files_per_day: int = 2,
) -> LoadReport:
    """Generate one batch with Spark, write it as Parquet and commit one delta per order day (and operation).

    ``batch`` defaults to the next one after those already loaded. Order IDs are ``batch * orders + i``: keep
    ``orders`` the same from batch to batch so late events and cancellations hit the previous batch's orders.
    """
    from pyspark.sql import functions as F

    if batch is None:
        batch = next_batch(catalog, table_id)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    events, cancelled = events_frame(spark, batch, orders, days)
    report = LoadReport(table_id, batch)
    tmp = Path(tempfile.mkdtemp(prefix="flash-spark-load-"))
    try:
        # files_per_day tasks, each holding some orders of every day: (up to) files_per_day files per day; arrival
        # order inside a file is a hash, not event order
        (events.repartitionByRange(files_per_day, F.col(PRIMARY_KEY) % files_per_day)
            .sortWithinPartitions(F.xxhash64(F.col(PRIMARY_KEY), F.col(SORT_KEY), F.lit(batch)))
            .write.mode("overwrite").partitionBy(PARTITION_COLUMN).parquet(str(tmp / "upserts")))
        (cancelled.repartition(1).write.mode("overwrite").partitionBy(PARTITION_COLUMN).parquet(str(tmp / "deletes")))
        upserts, deletes = _part_files(tmp / "upserts"), _part_files(tmp / "deletes")
        for day in sorted(set(upserts) | set(deletes)):
            part = {PARTITION_COLUMN: day}
            if day in upserts:
                d = catalog.append(table_id, part, "upsert", upserts[day])
                report.deltas.append(d)
                report.upsert_rows += d.rows
            if day in deletes:
                d = catalog.append(table_id, part, "delete", deletes[day])
                report.deltas.append(d)
                report.delete_rows += d.rows
        if batch > 0:
            report.late_rows = len(range((batch - 1) * orders, batch * orders)[3::17])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def next_batch(catalog: Catalog, table_id: str) -> int:
    """One more than the highest batch loaded: order IDs are ``batch * orders + i``; read from the manifests."""
    if not catalog.table_exists(table_id):
        return 0
    upserts = max((len([d for d in catalog.deltas(table_id, p) if d.operation == "upsert"])
                   for p in catalog.partitions(table_id)), default=0)
    return upserts
