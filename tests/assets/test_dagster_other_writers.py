"""The Dagster layer when other writers and runs interleave with a compaction run: the run's metadata and checks
name the version it committed, the lake observation sensor waits for runs in flight, the table's own Ray
settings reach the engine, and ``assets.headless --force`` compacts every waiting stream.

Another writer is made to land at a chosen moment by wrapping the engine's ``compact`` (the real engine runs,
then the other writer, a real compaction of a real delta, commits): only the timing is arranged."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance
from dagster_helpers import TABLES_YAML, rows, tick, write_config

import flash_pipeline.compactor.job as engine
from assets.definitions import build_definitions
from flash_pipeline import CompactOptions
from flash_pipeline.catalog.catalog import Catalog
from resources import RayResource

YAML = TABLES_YAML  # orders: immediate policy, 2 hash buckets; batched: an upsolver policy
P = (("day", "d1"),)


def _setup(tmp_path, text: str = YAML, ray: RayResource | None = None):
    lake = str(tmp_path / "lake")
    defs = build_definitions(write_config(tmp_path, text), lake, ray=ray or RayResource(num_cpus=1))
    return defs, DagsterInstance.ephemeral(), Catalog(lake)


def _materializations(result, leaf: str) -> list[dict]:
    return [{k: v.value for k, v in e.event_specific_data.materialization.metadata.items()}
            for e in result.get_asset_materialization_events() if e.event_specific_data.materialization.asset_key.path[-1] == leaf]


def _run(defs, instance, pkey: str = "day=d1"):
    return defs.resolve_job_def("compact_orders").execute_in_process(partition_key=pkey, instance=instance, raise_on_error=False)


def test_a_runs_metadata_and_checks_name_its_own_version_when_another_writer_commits_right_after_it(tmp_path, monkeypatch) -> None:
    defs, instance, cat = _setup(tmp_path)
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2, 3])])
    tick(defs, instance, None)
    real = engine.compact

    def then_another_writer(*args, **kwargs):
        out = real(*args, **kwargs)  # this run commits version 1: 3 rows
        cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([4, 5])])
        real("T.ORDERS", CompactOptions(destination_compacted_table_id="T.ORDERS_COMPACTED"), catalog=cat, progress=lambda m: None)
        return out

    monkeypatch.setattr(engine, "compact", then_another_writer)
    result = _run(defs, instance)
    assert result.success
    assert [v.version for v in [cat.latest_compacted("T.ORDERS_COMPACTED", P)]] == [2]  # the other writer's is the latest
    (meta,) = _materializations(result, "compacted")
    (index,) = _materializations(result, "pk_index")
    assert (meta["compacted version"], meta["dagster/row_count"], meta["rows out"], meta["last position"]) == (1, 3, 3, 1)
    assert index["compacted version"] == 1 and index["dagster/row_count"] == 3
    checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert checks and {c.metadata["compacted version"].value for c in checks} == {1}
    # the other writer's version 2 is reported by the lake observation sensor (this deployment did not materialize it)
    monkeypatch.setattr(engine, "compact", real)
    res, _ = tick(defs, instance, None, "lake_observation_sensor")
    assert sorted((e.asset_key.path[-1], e.metadata["compacted version"].value) for e in res.asset_events) == [("compacted", 2), ("pk_index", 2)]


def test_the_lake_observation_sensor_waits_for_a_compaction_run_in_flight(tmp_path, monkeypatch) -> None:
    defs, instance, cat = _setup(tmp_path)
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2, 3])])
    tick(defs, instance, None)
    _, lake_cursor = tick(defs, instance, None, "lake_observation_sensor")
    real = engine.compact
    during: dict = {}

    def then_a_tick(*args, **kwargs):
        out = real(*args, **kwargs)  # committed; the run has not recorded its materialization yet
        res, during["cursor"] = tick(defs, instance, lake_cursor, "lake_observation_sensor")
        during["events"] = list(getattr(res, "asset_events", None) or [])
        return out

    monkeypatch.setattr(engine, "compact", then_a_tick)
    assert _run(defs, instance).success
    assert during["events"] == []  # the run's own version is not "committed outside"
    res, _ = tick(defs, instance, during["cursor"], "lake_observation_sensor")  # after the run: nothing to report either
    assert not getattr(res, "asset_events", None)
    history = [r.asset_materialization.metadata for r in instance.fetch_materializations(AssetKey(["orders", "compacted"]), limit=10).records]
    assert [(m["compacted version"].value, "origin" in m) for m in history] == [(1, False)]


@pytest.mark.parametrize("table_sets", [True, False])
def test_a_tables_yaml_ray_setting_reaches_the_engine_and_the_resource_fills_in_the_rest(tmp_path, monkeypatch, table_sets: bool) -> None:
    text = YAML.replace("    hash_buckets: 2\n", "    hash_buckets: 2\n    num_cpus: 1\n    ray_address: 127.0.0.1:6390\n", 1) if table_sets else YAML
    defs, instance, cat = _setup(tmp_path, text, ray=RayResource(address="127.0.0.1:7777", num_cpus=2))
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    tick(defs, instance, None)
    real = engine.compact
    seen: dict = {}

    def spy(source, options, **kwargs):
        seen.update(num_cpus=options.num_cpus, ray_address=options.ray_address)
        return real(source, options.replace(ray_address=None), **kwargs)  # nothing listens there: compact here

    monkeypatch.setattr(engine, "compact", spy)
    assert _run(defs, instance).success
    assert seen == ({"num_cpus": 1, "ray_address": "127.0.0.1:6390"} if table_sets else {"num_cpus": 2, "ray_address": "127.0.0.1:7777"})


def test_headless_force_compacts_the_waiting_streams_beside_the_due_ones(tmp_path) -> None:
    from assets.headless import run_once

    text = """
tables:
  - name: batched
    source: T.BATCHED
    primary_keys: [id]
    trigger: {policy: upsolver, min_files: 30, quiet_seconds: 100, max_files: 60, small_file_bytes: 1000000, stale_seconds: 100000, max_pending_rows: 5}
"""
    config = write_config(tmp_path, text)
    lake = str(tmp_path / "lake")
    cat = Catalog(lake)
    cat.append("T.BATCHED", {"day": "due"}, "upsert", [pa.table({"id": list(range(10))})])  # 10 rows > 5: due
    cat.append("T.BATCHED", {"day": "waiting"}, "upsert", [pa.table({"id": [1, 2]})])  # waits on the policy
    summary = run_once(lake, str(config), force=True, skip_loads=True, out=io.StringIO())
    assert sorted((r["partition"], r["success"]) for r in summary["runs"]) == [("day=due", True), ("day=waiting", True)]
    assert {p: cat.latest_compacted("T.BATCHED_COMPACTED", p).rows for p in cat.partitions("T.BATCHED_COMPACTED")} == \
        {(("day", "due"),): 10, (("day", "waiting"),): 2}


def test_headless_reports_a_failed_run_with_the_engines_line_and_runs_the_others(tmp_path) -> None:
    """A run that fails (a delta file that cannot be read) is printed as FAILED with the engine's one line, the
    other runs and the tables still print, and main() exits 1 (it died with Dagster's traceback, printing nothing)."""
    from assets.headless import main, run_once

    config = write_config(tmp_path, "tables:\n  - name: orders\n    source: T.ORDERS\n    primary_keys: [id]\n")
    lake = str(tmp_path / "lake")
    cat = Catalog(lake)
    cat.append("T.ORDERS", {"day": "a"}, "upsert", [pa.table({"id": [1, 2]})])
    bad = cat.append("T.ORDERS", {"day": "b"}, "upsert", [pa.table({"id": [3]})])
    (tmp_path / "lake" / bad.files[0].key).write_bytes(b"garbage")
    out = io.StringIO()
    summary = run_once(lake, str(config), skip_loads=True, out=out)
    assert sorted((r["partition"], r["success"]) for r in summary["runs"]) == [("day=a", True), ("day=b", False)]
    text = out.getvalue()
    assert "[day=b]: FAILED" in text and "delta at position 1 cannot be read" in text and "skip-delta" in text
    assert "T.ORDERS_COMPACTED day=a (version 1, 2 rows" in text
    assert main(["--lake", lake, "--tables", str(config), "--skip-loads"]) == 1
