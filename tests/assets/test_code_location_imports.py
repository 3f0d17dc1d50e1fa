"""What loading the code location costs every run worker: it imports neither pyspark nor dagster-pyspark.

A compaction run is a new process that imports the code location; dagster-pyspark (with ``pyspark.sql``) cost
0.36 s of that here, and only a load run uses it (resources.DeferredPySparkResource imports it on first use)."""

import os
import subprocess
import sys

from dagster_helpers import REPO


def test_loading_the_code_location_imports_no_spark(tmp_path) -> None:
    env = dict(os.environ, FLASH_LAKE=str(tmp_path / "lake"))
    probe = ("import sys, assets; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'dagster_pyspark', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_spark_resource_hands_over_dagster_pysparks_session_config(tmp_path) -> None:
    from resources import spark_resource

    res = spark_resource("local[1]")
    delegate = res._resource()  # dagster-pyspark's own resource, built on first use
    assert type(delegate).__module__.startswith("dagster_pyspark") and delegate.spark_config == res.spark_config
    assert res._resource() is delegate and res.spark_config["spark.master"] == "local[1]"
