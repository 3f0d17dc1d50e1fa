"""The Dagster instance where teams run it: PostgreSQL (dagster-postgres). A real server (tests/postgres_server.py)
holds the runs, events, dynamic partitions and the new-delta sensor's pending streams; the sensor and a batched
compaction run work against it as against the embedded SQLite."""

from __future__ import annotations

import json

import pytest
from dagster import AssetKey, instance_for_test
from dagster_helpers import ONE_TABLE, rows, run_requests, streams_of, tick, write_config

from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from postgres_server import run_server

@pytest.fixture(scope="module")
def postgres_url():
    yield from run_server()


def test_the_sensor_and_a_batched_run_against_a_postgres_instance(tmp_path, postgres_url) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    days = [f"d{i:02d}" for i in range(20)]
    for i, day in enumerate(days):
        cat.append("T.ORDERS", {"day": day}, "upsert", [rows([i, i + 100], ts=[1, 1], day=day)])
    defs = build_definitions(write_config(tmp_path, ONE_TABLE), str(lake))
    with instance_for_test(overrides={"storage": {"postgres": {"postgres_url": postgres_url}}}, temp_dir=str(tmp_path)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result, cursor = tick(defs, instance, None)
        (req,) = run_requests(result)
        assert streams_of(req) == [f"day={d}" for d in days]
        assert sorted(instance.get_dynamic_partitions("orders__streams")) == [f"day={d}" for d in days]
        state = json.loads(cursor)["tables"]["orders"]
        key = f"flash/new_delta_sensor/orders/pending/{state['state']}"
        assert len(json.loads(instance.run_storage.get_cursor_values({key})[key])) == 20  # in PostgreSQL
        run = defs.resolve_job_def(req.job_name).execute_in_process(instance=instance, run_config=req.run_config)
        assert run.success
        records = instance.fetch_materializations(AssetKey(["orders", "compacted"]), limit=100).records
        assert sorted(r.partition_key for r in records) == [f"day={d}" for d in days]
        assert all(r.asset_materialization.metadata["dagster/row_count"].value == 2 for r in records)
        result, cursor = tick(defs, instance, cursor)  # the run's commits cleared every stream
        assert not run_requests(result)
        state = json.loads(cursor)["tables"]["orders"]
        key = f"flash/new_delta_sensor/orders/pending/{state['state']}"
        assert json.loads(instance.run_storage.get_cursor_values({key})[key]) == {}
