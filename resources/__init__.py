"""Dagster resources of the flash compactor: the catalog, Ray, PySpark and the SQS job-run queue.

Only this layer imports Dagster; the engine (``flash_pipeline``) gets plain objects from these resources.
"""


import os
from typing import Any, Optional

from dagster import ConfigurableResource, EnvVar
from pydantic import Field, PrivateAttr

from flash_pipeline.catalog.catalog import Catalog

DEFAULT_LAKE = "./demo_lake"


def default_lake() -> str:
    return os.environ.get("FLASH_LAKE") or DEFAULT_LAKE


class CatalogResource(ConfigurableResource):
    """The delta catalog: a local directory (default ``$FLASH_LAKE`` or ``./demo_lake``) or ``s3://bucket/prefix``.

    For ``s3://`` lakes the boto3 client is built by dagster-aws's ``S3Resource`` (endpoint, region, profile and
    credentials configured the dagster-aws way); ``endpoint_url`` also reaches the engine for its own clients.
    """

    uri: str = Field(default_factory=default_lake, description="lake root: a directory or s3://bucket/prefix")
    endpoint_url: Optional[str] = Field(default=None, description="S3 endpoint (moto, MinIO); default $FLASH_S3_ENDPOINT_URL")
    region_name: Optional[str] = Field(default=None, description="AWS region of the lake bucket")

    def s3_client(self) -> Any:
        from dagster_aws.s3 import S3Resource

        endpoint = self.endpoint_url or os.environ.get("FLASH_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
        return S3Resource(endpoint_url=endpoint, region_name=self.region_name or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1").get_client()

    def get_catalog(self) -> Catalog:
        if self.uri.startswith("s3://"):
            endpoint = self.endpoint_url or os.environ.get("FLASH_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
            return Catalog(self.uri, client=self.s3_client(), endpoint_url=endpoint, region=self.region_name)
        return Catalog(self.uri)


class RayResource(ConfigurableResource):
    """Where compactions run: a local Ray started in the run process (default) or an existing cluster.

    ``address`` (default ``$FLASH_RAY_ADDRESS``) is e.g. ``ray://head:10001`` or ``auto``; ``num_cpus`` caps a
    local Ray. The engine's ``ensure_ray`` does the ``ray.init`` and warms the workers once per process.
    """

    address: Optional[str] = Field(default_factory=lambda: os.environ.get("FLASH_RAY_ADDRESS") or None)
    num_cpus: Optional[int] = Field(default=None, description="CPUs of a local Ray (default: all)")

    def compact_kwargs(self) -> dict[str, Any]:
        return {"ray_address": self.address, "num_cpus": self.num_cpus}


class SQSResource(ConfigurableResource):
    """The queue of compaction instruction documents (the paper's job-run dispatcher listens to it)."""

    queue_url: Optional[str] = Field(default_factory=lambda: os.environ.get("FLASH_SQS_QUEUE_URL") or None)
    dead_letter_queue_url: Optional[str] = Field(default_factory=lambda: os.environ.get("FLASH_SQS_DLQ_URL") or None)
    endpoint_url: Optional[str] = Field(default_factory=lambda: os.environ.get("FLASH_SQS_ENDPOINT_URL") or None)
    region_name: Optional[str] = Field(default=None)
    max_messages_per_tick: int = Field(default=100, description="messages read per sensor tick at most")

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "sqs", endpoint_url=self.endpoint_url, region_name=self.region_name or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        )


def _env_or(name: str, default: Any) -> Any:
    """``EnvVar(name)`` when the variable is set (the UI shows the variable, runs read it at launch), else ``default``."""
    return EnvVar(name) if os.environ.get(name) else default


def catalog_from_env() -> CatalogResource:
    """The deployment's lake, chosen by environment: ``FLASH_LAKE`` (a directory or ``s3://bucket/prefix``, default
    ``./demo_lake``) and ``FLASH_S3_ENDPOINT_URL`` (an S3-compatible endpoint), with no code change."""
    return CatalogResource(uri=_env_or("FLASH_LAKE", DEFAULT_LAKE), endpoint_url=_env_or("FLASH_S3_ENDPOINT_URL", None))


def ray_from_env() -> RayResource:
    """Where the deployment's large compactions run: ``FLASH_RAY_ADDRESS`` (a cluster), else a local Ray (the
    engine also reads Ray's own ``RAY_ADDRESS`` when neither is configured)."""
    return RayResource(address=_env_or("FLASH_RAY_ADDRESS", None))


class DeferredPySparkResource(ConfigurableResource):
    """dagster-pyspark's ``LazyPySparkResource``, imported when a load first asks for its session.

    Every run worker and code server imports the code location; importing dagster-pyspark (and with it
    ``pyspark.sql``) cost 0.36 s of it here, which compaction runs, the sensors and the UI never use. The session
    itself is dagster-pyspark's: ``spark_session`` builds its ``LazyPySparkResource`` from ``spark_config`` on
    first use and hands over that resource's session.
    """

    spark_config: dict[str, Any]
    _pyspark: Any = PrivateAttr(default=None)

    def _resource(self) -> Any:
        if self._pyspark is None:
            from dagster_pyspark import LazyPySparkResource

            self._pyspark = LazyPySparkResource(spark_config=self.spark_config)
        return self._pyspark

    @property
    def spark_session(self) -> Any:
        return self._resource().spark_session

    @property
    def spark_context(self) -> Any:
        return self._resource().spark_context


def spark_resource(master: str | None = None) -> DeferredPySparkResource:
    """dagster-pyspark's (lazy) PySpark resource: ``local[2]`` unless ``master`` or ``$FLASH_SPARK_MASTER`` says otherwise.

    Lazy twice over: compaction runs never start a Spark session, and never import pyspark.
    """
    return DeferredPySparkResource(
        spark_config={
            "spark.master": master or os.environ.get("FLASH_SPARK_MASTER") or "local[2]",
            "spark.app.name": "flash-compactor-loads",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",  # no stage progress bars in the dg dev terminal
            "spark.log.level": os.environ.get("FLASH_SPARK_LOG_LEVEL", "ERROR"),  # Spark's WARN lines are not the user's
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            "spark.driver.memory": os.environ.get("FLASH_SPARK_DRIVER_MEMORY", "1g"),
        }
    )


__all__ = ["CatalogResource", "DeferredPySparkResource", "RayResource", "SQSResource", "catalog_from_env", "default_lake", "ray_from_env", "spark_resource"]
