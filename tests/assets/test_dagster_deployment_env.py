"""Deployment by environment: the same code location on a local lake by default and on S3 (moto) when FLASH_LAKE
says so, with the lake, S3 endpoint and Ray address shown as environment variables in the resources' config."""

import uuid

import pytest
from dagster import DagsterInstance, EnvVar
from dagster_helpers import request_for, rows, tick, write_config

from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog

ENV = ("FLASH_LAKE", "FLASH_S3_ENDPOINT_URL", "FLASH_RAY_ADDRESS", "FLASH_SPARK_MASTER")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_are_a_local_lake_and_local_engines(tmp_path, clean_env) -> None:
    clean_env.chdir(tmp_path)
    defs = build_definitions(write_config(tmp_path))
    catalog, ray = defs.resources["catalog"], defs.resources["ray"]
    assert catalog.uri == "./demo_lake" and catalog.endpoint_url is None
    assert ray.address is None
    assert defs.resources["pyspark"].spark_config["spark.master"] == "local[2]"


def test_flash_lake_on_s3_runs_the_same_code_location_there(tmp_path, clean_env, moto_endpoint) -> None:
    """FLASH_LAKE=s3://..., FLASH_S3_ENDPOINT_URL and FLASH_RAY_ADDRESS reach the resources as EnvVar (the UI shows
    the variable, runs read its value at launch); a sensor tick and a compaction run on the S3 lake."""
    from conftest import BUCKET

    uri = f"s3://{BUCKET}/deploy-{uuid.uuid4().hex[:8]}"
    clean_env.setenv("FLASH_LAKE", uri)
    clean_env.setenv("FLASH_S3_ENDPOINT_URL", moto_endpoint)
    clean_env.setenv("FLASH_SPARK_MASTER", "local[1]")
    defs = build_definitions(write_config(tmp_path))
    catalog = defs.resources["catalog"]
    assert catalog.uri == EnvVar("FLASH_LAKE") and catalog.endpoint_url == EnvVar("FLASH_S3_ENDPOINT_URL")
    assert defs.resources["pyspark"].spark_config["spark.master"] == "local[1]"
    lake = Catalog(uri, endpoint_url=moto_endpoint)
    lake.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2, 3])])
    lake.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([2], ts=[5])])
    instance = DagsterInstance.ephemeral()
    result, _ = tick(defs, instance, None)
    req = request_for(result, "day=d1")
    run = defs.resolve_job_def(req.job_name).execute_in_process(partition_key=req.partition_key, instance=instance,
                                                                run_config=req.run_config or None)
    assert run.success
    compacted = lake.latest_compacted("T.ORDERS_COMPACTED", (("day", "d1"),))
    assert compacted is not None and compacted.rows == 3
    # a configured Ray address is an EnvVar too (not used here: a run with it would join that cluster)
    clean_env.setenv("FLASH_RAY_ADDRESS", "ray://head.example:10001")
    assert build_definitions(write_config(tmp_path)).resources["ray"].address == EnvVar("FLASH_RAY_ADDRESS")


def test_the_repository_instance_settings_load_and_dequeue_every_second(tmp_path, monkeypatch) -> None:
    """The dagster.yaml README users get (dg dev from the repository root) is valid instance config: two runs at a
    time, and queued runs picked up every second rather than Dagster's default 5 s (2.3-4.5 s of every run's
    launch-to-commit time in benchmarks/results_dagster_run.md)."""
    import shutil

    from dagster_helpers import REPO

    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.get() as instance:
        coordinator = instance.run_coordinator
        assert coordinator.dequeue_interval_seconds == 1
        assert instance.get_concurrency_config().run_queue_config.max_concurrent_runs == 2
