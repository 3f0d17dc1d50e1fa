"""PySpark loads through Dagster, then the headless pipeline (load -> sensor -> compaction -> print) once.

One Spark session for the module (dagster-pyspark's resource reuses it through ``getOrCreate``).
"""

import io

import pytest
from dagster import DagsterInstance, materialize

from assets.checks import check_specs
from resources.keys import keys
from resources.config import load_config, partition_key
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog, user_columns
from flash_pipeline.merge_on_read import read as merge_on_read
from flash_pipeline.spark.order_status import load_batch

SOURCE = "AMZN.ORDER_STATUS_EVENTS.V1"
DEST = "AMZN.ORDER_STATUS_EVENTS_COMPACTED.V1"


@pytest.fixture(scope="module")
def spark():
    from resources import spark_resource

    res = spark_resource()
    from dagster_pyspark.resources import spark_session_from_config

    session = spark_session_from_config(res.spark_config)
    yield session
    session.stop()


def test_generator_writes_order_day_deltas_with_late_updates_and_cancellations(spark, tmp_path) -> None:
    cat = Catalog(tmp_path / "lake")
    first = load_batch(spark, cat, "T.EVENTS", orders=300, days=3, files_per_day=2)
    second = load_batch(spark, cat, "T.EVENTS", orders=300, days=3, files_per_day=2)
    assert (first.batch, second.batch) == (0, 1)
    assert first.delete_rows == 0 and second.delete_rows > 0 and second.late_rows > 0
    parts = cat.partitions("T.EVENTS")
    assert [dict(p)["order_day"] for p in parts] == ["1995-04-03", "1995-04-04", "1995-04-05"]
    deltas = cat.deltas("T.EVENTS", parts[0])
    assert [d.operation for d in deltas] == ["upsert", "upsert", "delete"]
    assert all(1 <= len(d.files) <= 2 for d in deltas if d.operation == "upsert")
    schema = deltas[0].pa_schema()
    assert schema.names == ["order_id", "order_status", "last_updated"] and str(schema.field("last_updated").type).startswith("timestamp[us")
    assert deltas[-1].pa_schema().names == ["order_id"]
    # every order's events sit in the day partition of its ID, several statuses per order
    events = cat.read_file(deltas[0].files[0]).to_pylist()
    assert {e["order_status"] for e in events} == {"SUBMITTED", "PACKED", "SHIPPED", "DELIVERED"}
    # the third batch's events carry a new column: the streams evolve, earlier rows read it as null
    third = load_batch(spark, cat, "T.EVENTS", orders=300, days=3, files_per_day=2)
    assert third.batch == 2 and "channel" in third.deltas[0].pa_schema().names
    rows = merge_on_read(cat, "T.EVENTS", partitions=[parts[0]], primary_keys=["order_id"], sort_keys=[("last_updated", "ascending")]).to_pylist()
    assert {r["channel"] is None for r in rows} == {True, False}
    assert all((r["channel"] is not None) == (r["order_id"] >= 600) for r in rows)


def test_headless_pipeline_loads_on_spark_and_compacts_on_ray(spark, tmp_path) -> None:
    from assets.headless import run_once

    lake = str(tmp_path / "lake")
    instance = DagsterInstance.ephemeral()
    # the load asset through dagster.materialize, with the code location's pyspark resource
    defs = build_definitions(None, lake)
    table = load_config().table("order_status")
    load_def = defs.resolve_assets_def(keys(table)["load"])
    res = materialize([load_def], instance=instance)
    assert res.success
    mats = res.asset_materializations_for_node(load_def.node_def.name)
    meta = next(m for m in mats if m.asset_key == keys(table)["load"]).metadata
    assert meta["batch"].value == 0 and meta["deltas"].value == 3 and meta["events"].value > 2000
    # lineage: the load materializes the deltas asset once per partition stream it wrote (registered as partitions)
    delta_mats = {m.partition: m.metadata for m in mats if m.asset_key == keys(table)["deltas"]}
    cat = Catalog(lake)
    expected = {partition_key(p): cat.deltas(table.source, p) for p in cat.partitions(table.source)}
    assert set(delta_mats) == set(expected) and len(expected) == 3
    assert set(instance.get_dynamic_partitions(table.partitions_name)) == set(expected)
    for pkey, ds in expected.items():
        assert delta_mats[pkey]["last position"].value == ds[-1].position
        assert delta_mats[pkey]["upsert rows"].value == sum(d.rows for d in ds if d.operation == "upsert")
        assert delta_mats[pkey]["delete rows"].value == sum(d.rows for d in ds if d.operation == "delete")
    # the headless run: another load, one sensor tick (the rows rule triggers), compaction runs, printed tables
    out = io.StringIO()
    summary = run_once(lake, out=out, instance=instance)
    text = out.getvalue()
    assert summary["loads"] == ["order_status"]
    assert len(summary["runs"]) == 3 and all(r["success"] and not r["failed_checks"] for r in summary["runs"])
    assert f"checks: all passed ({len(check_specs(table))})" in text and f"{DEST} order_day=1995-04-03" in text
    cat = Catalog(lake)
    total = 0
    for part in cat.partitions(DEST):
        compacted = cat.latest_compacted(DEST, part)
        rows = [r for f in compacted.files for r in user_columns(cat.read_live(f), compacted).to_pylist()]
        ids = [r["order_id"] for r in rows]
        assert len(ids) == len(set(ids))
        total += len(rows)
    # two batches of 2000 orders (tables.yaml); about 1 in 10 orders of batch 0 was cancelled (deleted)
    assert 2 * 2000 - 400 < total < 2 * 2000 - 100
    assert summary["tables"][DEST] == total
