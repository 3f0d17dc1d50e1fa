"""The code location: assets, jobs, sensors, schedules and resources, all built from the table config file.

``workspace.yaml`` loads the ``assets`` package, whose ``defs`` is ``build_definitions()``: tables from
``$FLASH_TABLES`` or ``tables.yaml``, the lake from ``$FLASH_LAKE`` or ``./demo_lake``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    DynamicPartitionsDefinition,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
)

from resources.keys import keys
from assets.batch import build_batch_job
from assets.repair import build_repair_job
from assets.tables import build_table_assets
from resources.config import ProjectConfig, load_config
from resources import CatalogResource, RayResource, SQSResource, catalog_from_env, ray_from_env, spark_resource
from sensors.lake_observations import build_lake_observation_sensor
from sensors.new_deltas import build_new_delta_sensor
from sensors.sqs_dispatch import build_sqs_dispatch_sensor


def build_definitions(
    config_path: str | Path | None = None,
    lake: str | None = None,
    *,
    sqs: SQSResource | None = None,
    ray: RayResource | None = None,
    spark_master: str | None = None,
    sensor_interval_seconds: int = 30,
) -> Definitions:
    project = load_config(config_path)
    parts = {t.name: DynamicPartitionsDefinition(name=t.partitions_name) for t in project.tables}
    assets: list[Any] = []
    compact_jobs: dict[str, Any] = {}
    batch_jobs: dict[str, Any] = {}
    jobs: list[Any] = []
    schedules: list[Any] = []
    for t in project.tables:
        k = keys(t)
        assets += build_table_assets(t, parts[t.name])
        compact_jobs[t.name] = define_asset_job(
            t.compact_job_name, selection=AssetSelection.assets(k["compacted"], k["index"]),
            description=f"Compact one partition stream of {t.source} into {t.destination} on Ray (with the asset checks).",
        )
        jobs.append(define_asset_job(t.rehash_job_name, selection=AssetSelection.assets(k["rehash"]),
                                     description=f"Rehash the primary key index of {t.destination} (backfill over chosen partitions)."))
        jobs.append(build_repair_job(t, parts[t.name]))
        batch_jobs[t.name] = build_batch_job(t)
        jobs.append(define_asset_job(t.optimize_job_name, selection=AssetSelection.assets(k["optimized"]),
                                     description=f"Pack the small files of {t.destination} (Delta OPTIMIZE; backfill over chosen partitions)."))
        if t.load is not None:
            load_job = define_asset_job(t.load_job_name, selection=AssetSelection.assets(k["load"]),
                                        description=f"One PySpark load batch into {t.source}.")
            jobs.append(load_job)
            schedules.append(
                ScheduleDefinition(
                    name=f"{t.load_job_name}_schedule", job=load_job, cron_schedule=os.environ.get("FLASH_LOAD_CRON", "*/3 * * * *"),
                    default_status=DefaultScheduleStatus.STOPPED if os.environ.get("FLASH_DEMO_LOADS") == "0" else DefaultScheduleStatus.RUNNING,
                    description="Demo loads: one PySpark batch of order-status events every few minutes.",
                )
            )
    sqs = sqs or SQSResource()
    sensors = [
        build_new_delta_sensor(project, parts, batch_jobs, minimum_interval_seconds=sensor_interval_seconds,
                               default_status=DefaultSensorStatus.STOPPED if os.environ.get("FLASH_SENSORS") == "0" else DefaultSensorStatus.RUNNING),
        build_sqs_dispatch_sensor(project, parts, compact_jobs,
                                  default_status=DefaultSensorStatus.RUNNING if sqs.queue_url else DefaultSensorStatus.STOPPED),
        build_lake_observation_sensor(project, parts, minimum_interval_seconds=sensor_interval_seconds,
                                      default_status=DefaultSensorStatus.STOPPED if os.environ.get("FLASH_SENSORS") == "0" else DefaultSensorStatus.RUNNING),
    ]
    return Definitions(
        assets=assets,
        jobs=list(compact_jobs.values()) + list(batch_jobs.values()) + jobs,
        sensors=sensors,
        schedules=schedules,
        resources={
            "catalog": CatalogResource(uri=lake) if lake else catalog_from_env(),
            "ray": ray or ray_from_env(),
            "pyspark": spark_resource(spark_master),
            "sqs": sqs,
        },
        executor=in_process_executor,
    )


def project_config(config_path: str | Path | None = None) -> ProjectConfig:
    return load_config(config_path)


defs = build_definitions()
