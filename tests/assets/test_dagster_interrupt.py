"""An interrupted Dagster run of a compaction commits nothing (docs/guarantees.md, *Ctrl-C, SIGTERM*).

A real SIGINT reaches the run's process at the dedupe step (FLASH_CRASH_AT with FLASH_CRASH_SIGNAL=INT,
flash_pipeline/faults.py) while the compaction asset runs in a Dagster job executed in that process: Dagster turns the
interrupt into its own (a BaseException), the job stops its session at the next step, and the partition stays
uncompacted; the next run compacts it. What the Dagster UI's "terminate" sends a run worker is an interrupt too;
this test does not go through the UI or a run launcher.

The compaction asset runs the engine on a thread of its own (assets/engine.py) and the interrupt lands in the
run's thread: before the asset passed its stop request on, the run failed while the engine went on in the
background and committed its version after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from dagster import DagsterInstance
from dagster_helpers import request_for, rows, tick, write_config
from pathlib import Path
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from resources import RayResource

tmp = Path(sys.argv[1])
lake = str(tmp / "lake")
cat = Catalog(lake)
if not cat.table_exists("T.ORDERS"):
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2, 3, 4], ts=[1, 1, 1, 1])])
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([2, 5], ts=[5, 1])])
defs = build_definitions(write_config(tmp), lake, ray=RayResource(num_cpus=2))
instance = DagsterInstance.ephemeral()
result, _ = tick(defs, instance, None)  # the new-delta sensor registers the partition and asks for the run
req = request_for(result, "day=d1")
outcome = "no exception"
try:
    run = defs.resolve_job_def(req.job_name).execute_in_process(partition_key=req.partition_key, instance=instance,
                                                                run_config=req.run_config or None, raise_on_error=False)
    outcome = "success" if run.success else "failed"
except BaseException as exc:  # an interrupt may leave execute_in_process as an exception
    outcome = type(exc).__name__
import time
time.sleep(3)  # a compaction that went on in the background after the run failed would commit meanwhile
latest = cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d1"),))
print(json.dumps({"outcome": outcome, "version": latest.version if latest else None, "rows": latest.rows if latest else None}))
"""


def _run(tmp_path: Path, crash: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_CRASH_AT", "FLASH_CRASH_SIGNAL")}
    env["FLASH_EXECUTOR"] = "in-process"
    if crash:
        env.update(FLASH_CRASH_AT="driver:dedupe", FLASH_CRASH_SIGNAL="INT")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(REPO / "tests")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    return json.loads(lines[-1])


def test_an_interrupted_dagster_run_commits_nothing_and_the_next_run_compacts(tmp_path: Path) -> None:
    interrupted = _run(tmp_path, crash=True)
    assert interrupted["outcome"] != "success", interrupted
    assert interrupted["version"] is None, interrupted  # the session stopped before its commit
    assert not any("/compacted/data/" in str(p) for p in (tmp_path / "lake").rglob("*.parquet")), "attempt files left"
    again = _run(tmp_path, crash=False)
    assert again == {"outcome": "success", "version": 1, "rows": 5}, again
