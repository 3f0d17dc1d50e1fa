"""The `<name>/optimized` asset: small-file packing (flash_pipeline.optimize) of compacted streams through Dagster.

Compacts two partition streams with one row per file (run config), then packs them: one partition, then a backfill
over both with a run-config size limit; rows are compared with an independent merge-on-read of the source.
"""

import pytest
from dagster_helpers import rows, write_config
from dagster import AssetKey, DagsterInstance

from assets.checks import check_index_pointers, check_primary_keys_unique
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.merge_on_read import read
from resources import RayResource

D1, D2 = "day=d1", "day=d2"
DEST = "T.ORDERS_COMPACTED"


@pytest.fixture
def env(tmp_path_factory):
    """A lake of its own for each test (no test builds on another's leftovers), both streams compacted."""
    tmp = tmp_path_factory.mktemp("dagster_optimize")
    lake = str(tmp / "lake")
    cat = Catalog(lake)
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows(list(range(1, 9)), ts=[1] * 8), rows([2, 9], ts=[5, 1])])
    cat.append("T.ORDERS", {"day": "d1"}, "delete", [rows([3]).select(["id"])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows(list(range(20, 30)), day="d2")])
    defs = build_definitions(write_config(tmp), lake, ray=RayResource(num_cpus=2))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("orders__streams", [D1, D2])
    compact = defs.resolve_job_def("compact_orders")
    for key in (D1, D2):  # many small compacted files: one row each
        run = compact.execute_in_process(partition_key=key, instance=instance,
                                         run_config={"ops": {"orders__compact": {"config": {"rows_per_compacted_file": 1}}}})
        assert run.success
    return defs, instance, cat


def _meta(run, partitions=1):
    """The run's metadata (a single-run backfill materializes each partition of the range with the same metadata)."""
    ms = [e.event_specific_data.materialization for e in run.get_asset_materialization_events()
          if e.event_specific_data.materialization.asset_key == AssetKey(["orders", "optimized"])]
    assert len(ms) == partitions
    return ms[0].metadata


def _rows_of_version(cat, part):
    v = cat.latest_compacted(DEST, part)
    return sorted((r["id"], r["ts"], r["v"]) for f in v.files for r in cat.read_live(f).to_pylist())


def _independent(cat, day):
    t = read(cat, "T.ORDERS", partitions=[{"day": day}], compacted_table_id=DEST)
    return sorted((r["id"], r["ts"], r["v"]) for r in t.to_pylist())


def test_optimized_depends_on_compacted(env) -> None:
    defs, _, _ = env
    graph = defs.resolve_asset_graph()
    node = graph.get(AssetKey(["orders", "optimized"]))
    assert AssetKey(["orders", "compacted"]) in node.parent_keys
    assert node.partitions_def.name == "orders__streams"


def test_optimize_one_partition_packs_files_keeps_rows(env) -> None:
    defs, instance, cat = env
    part = (("day", "d1"),)
    before = cat.latest_compacted(DEST, part)
    assert len(before.files) == 8  # ids 1, 2, 4..9
    expected = _independent(cat, "d1")
    assert _rows_of_version(cat, part) == expected and len(expected) == 8
    run = defs.resolve_job_def("optimize_orders").execute_in_process(partition_key=D1, instance=instance)
    assert run.success
    after = cat.latest_compacted(DEST, part)
    assert after.version == before.version + 1 and len(after.files) == 1  # Delta's defaults: 1 GiB bins
    assert after.data_change is False and after.last_position == before.last_position
    assert after.rows == before.rows and after.index.live_rows == before.index.live_rows
    assert _rows_of_version(cat, part) == expected == _independent(cat, "d1")
    assert check_primary_keys_unique(cat, after)[0] and check_index_pointers(cat, after)[0]
    meta = _meta(run)
    assert meta["status"].value == "optimized" and meta["data change"].value is False
    assert meta["num files removed"].value == 8 and meta["num files added"].value == 1
    assert meta["num bins"].value == 1 and meta["total considered files"].value == 8 and meta["total files skipped"].value == 0
    assert meta["min file size"].value == 1 << 30 and meta["max file size"].value == 1 << 30
    assert meta["bytes removed"].value == sum(f.bytes for f in before.files)
    assert meta["files added"].value["total_files"] == 1 and meta["dagster/row_count"].value == 8
    assert meta["versions"].value[D1] == {"version": after.version, "files": 1, "data_change": False}
    assert "OPTIMIZE T.ORDERS_COMPACTED" in meta["summary"].value and "| files added | **1**" in meta["summary"].value
    # right after: nothing to do, no new version
    run = defs.resolve_job_def("optimize_orders").execute_in_process(partition_key=D1, instance=instance)
    assert run.success and _meta(run)["status"].value == "nothing-to-do" and cat.latest_compacted(DEST, part).version == after.version


def test_backfill_over_partitions_with_run_config_sizes(env) -> None:
    defs, instance, cat = env
    part2 = (("day", "d2"),)
    before = cat.latest_compacted(DEST, part2)
    assert len(before.files) == 10
    expected = _independent(cat, "d2")
    limit = 2 * max(f.bytes for f in before.files) + 1  # at least two files per bin, several bins
    assert defs.resolve_job_def("optimize_orders").execute_in_process(partition_key=D1, instance=instance).success  # d1 packed first
    run = defs.resolve_job_def("optimize_orders").execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": D1, "dagster/asset_partition_range_end": D2},
        run_config={"ops": {"orders__optimized": {"config": {"max_file_size": limit}}}},
    )
    assert run.success
    meta = _meta(run, partitions=2)
    assert meta["partitions"].value == 2 and meta["partitions optimized"].value == 1  # d1 was packed already
    assert meta["max file size"].value == limit and meta["num bins"].value >= 2
    after = cat.latest_compacted(DEST, part2)
    assert 1 < len(after.files) < 10 and after.data_change is False
    assert meta["num files added"].value == meta["num bins"].value
    assert _rows_of_version(cat, part2) == expected == _independent(cat, "d2")
    assert check_index_pointers(cat, after)[0]
    per = {tuple(map(tuple, p["partition"])): p["status"] for p in meta["per partition"].value}
    assert per == {(("day", "d1"),): "nothing-to-do", (("day", "d2"),): "optimized"}
    mats = instance.fetch_materializations(AssetKey(["orders", "optimized"]), limit=10).records
    assert {m.partition_key for m in mats} == {D1, D2}


def test_a_partition_never_compacted_is_skipped(env) -> None:
    defs, instance, cat = env
    cat.append("T.ORDERS", {"day": "d9"}, "upsert", [rows([90], day="d9")])
    instance.add_dynamic_partitions("orders__streams", ["day=d9"])
    run = defs.resolve_job_def("optimize_orders").execute_in_process(partition_key="day=d9", instance=instance)
    assert run.success and _meta(run)["status"].value == "skipped"
    assert cat.latest_compacted(DEST, (("day", "d9"),)) is None
