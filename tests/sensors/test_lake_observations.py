"""The lake observation sensor: compacted versions committed outside this deployment appear in the asset history
of the right partition, once; this deployment's own compaction runs are not reported twice."""

from dagster import AssetRecordsFilter, DagsterInstance, SkipReason
from dagster_helpers import rows, tick, write_config

from assets.definitions import build_definitions
from resources.keys import keys
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import main
from flash_pipeline.compactor.job import compact
from resources import RayResource
from resources.config import load_config, parse_partition_key

SENSOR = "lake_observation_sensor"


def _latest(instance: DagsterInstance, key, pkey: str):  # type: ignore[no-untyped-def]
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[pkey]), limit=1).records
    return records[0].asset_materialization if records else None


def test_versions_committed_elsewhere_appear_once_in_the_right_partition(tmp_path) -> None:
    lake = str(tmp_path / "lake")
    cat = Catalog(lake)
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2, 3], ts=[1, 1, 1])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([4, 5], day="d2")])
    config = write_config(tmp_path)
    defs = build_definitions(config, lake, ray=RayResource(num_cpus=2))
    instance = DagsterInstance.ephemeral()
    table = next(t for t in load_config(config).tables if t.name == "orders")
    k = keys(table)

    result, cursor = tick(defs, instance, None, SENSOR)
    assert isinstance(result, SkipReason)  # nothing compacted yet

    # the Python API compacts day=d1 outside Dagster
    compact(table.source, table.options.replace(partitions=[parse_partition_key("day=d1")]), catalog=cat, progress=lambda m: None)
    result, cursor = tick(defs, instance, cursor, SENSOR)
    d1 = cat.latest_compacted(table.destination, parse_partition_key("day=d1"))
    events = list(result.asset_events)
    assert sorted((e.asset_key.to_user_string(), e.partition) for e in events) == sorted(
        [(k["compacted"].to_user_string(), "day=d1"), (k["index"].to_user_string(), "day=d1")])
    by_key = {e.asset_key: e for e in events}
    assert by_key[k["compacted"]].metadata["compacted version"].value == d1.version
    assert by_key[k["compacted"]].metadata["dagster/row_count"].value == d1.rows == 3
    assert by_key[k["index"]].metadata["dagster/row_count"].value == d1.index.live_rows
    assert "day=d1" in instance.get_dynamic_partitions(table.partitions_name)  # registered by the tick
    for e in events:  # what the daemon does with a sensor's asset events
        instance.report_runless_asset_event(e)
    assert _latest(instance, k["compacted"], "day=d1").metadata["compacted version"].value == d1.version

    result, cursor = tick(defs, instance, cursor, SENSOR)
    assert isinstance(result, SkipReason)  # reported once

    # this deployment's own compaction run of day=d2 is in the history already: not reported again
    instance.add_dynamic_partitions(table.partitions_name, ["day=d2"])
    run = defs.resolve_job_def(table.compact_job_name).execute_in_process(partition_key="day=d2", instance=instance)
    assert run.success
    d2 = cat.latest_compacted(table.destination, parse_partition_key("day=d2"))
    assert _latest(instance, k["compacted"], "day=d2").metadata["compacted version"].value == d2.version
    result, cursor = tick(defs, instance, cursor, SENSOR)
    assert isinstance(result, SkipReason)

    # the CLI compacts a new delta of day=d1: its new version is reported
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([2, 9], ts=[5, 5])])
    assert main(["compact", "--catalog", lake, "--table", table.source, "--destination", table.destination, "--partition", "day=d1"]) == 0
    result, cursor = tick(defs, instance, cursor, SENSOR)
    new = cat.latest_compacted(table.destination, parse_partition_key("day=d1"))
    assert new.version > d1.version and new.rows == 4
    got = {(e.asset_key, e.partition): e.metadata["compacted version"].value for e in result.asset_events}
    assert got == {(k["compacted"], "day=d1"): new.version, (k["index"], "day=d1"): new.version}


def test_every_version_committed_between_two_ticks_is_reported_once(tmp_path) -> None:
    """Versions committed elsewhere between two ticks each enter the asset history (only the latest did), and a
    version this deployment's own run materialized among them is still not reported again."""
    lake = str(tmp_path / "lake")
    cat = Catalog(lake)
    config = write_config(tmp_path)
    defs = build_definitions(config, lake, ray=RayResource(num_cpus=2))
    instance = DagsterInstance.ephemeral()
    table = next(t for t in load_config(config).tables if t.name == "orders")
    k = keys(table)
    d1 = parse_partition_key("day=d1")

    def compact_elsewhere(ids: list[int], ts: int) -> int:
        cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows(ids, ts=[ts] * len(ids))])
        compact(table.source, table.options.replace(partitions=[d1]), catalog=cat, progress=lambda m: None)
        return cat.latest_compacted(table.destination, d1).version

    first = compact_elsewhere([1, 2], 1)
    result, cursor = tick(defs, instance, None, SENSOR)
    assert {e.metadata["compacted version"].value for e in result.asset_events} == {first}
    for e in result.asset_events:
        instance.report_runless_asset_event(e)
    second, third = compact_elsewhere([3], 2), compact_elsewhere([1], 3)
    result, cursor = tick(defs, instance, cursor, SENSOR)
    got = sorted((e.asset_key.to_user_string(), e.metadata["compacted version"].value) for e in result.asset_events)
    assert got == sorted((key.to_user_string(), v) for key in (k["compacted"], k["index"]) for v in (second, third))
    for e in result.asset_events:
        instance.report_runless_asset_event(e)
    # a run of this deployment, then a compaction elsewhere, before the next tick: only the latter is reported
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([4], ts=[4])])
    instance.add_dynamic_partitions(table.partitions_name, ["day=d1"])
    assert defs.resolve_job_def(table.compact_job_name).execute_in_process(partition_key="day=d1", instance=instance).success
    by_run = cat.latest_compacted(table.destination, d1).version
    last = compact_elsewhere([5], 5)
    result, cursor = tick(defs, instance, cursor, SENSOR)
    assert by_run == third + 1 and {e.metadata["compacted version"].value for e in result.asset_events} == {last}
