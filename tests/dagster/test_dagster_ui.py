"""`dagster dev` end to end over HTTP: start the webserver and daemon on 127.0.0.1, find the compacted-stream
asset, launch a compaction through the GraphQL API (what the UI's Materialize button calls), wait for success,
read the row-count metadata and the check results back, and stop the server.

No browser: the GraphQL API is the UI's own backend (Debian's chromium + Playwright would add ~300 MB of
downloads to CI for the same assertions). The page itself is fetched to check the UI is served.
"""

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from _graphql import GraphQL
from _helpers import REPO
from conftest import free_port, wait_for_port

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import DEMO_SOURCE, demo_deltas

PARTITION = "Order Day=1995-04-04"


def test_dagster_dev_launches_a_compaction_and_reports_its_row_count(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    for part, files in demo_deltas():
        cat.append(DEMO_SOURCE, part, "upsert", files)
    (tmp_path / "home").mkdir()
    port = free_port()
    env = dict(os.environ, FLASH_LAKE=str(lake), DAGSTER_HOME=str(tmp_path / "home"), FLASH_SENSORS="0", FLASH_DEMO_LOADS="0",
               FLASH_RAY_NUM_CPUS="2")
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    log = open(tmp_path / "dagster-dev.log", "wb")
    proc = subprocess.Popen([dagster, "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, timeout=180, proc=proc)
        base = f"http://127.0.0.1:{port}"
        g = GraphQL(base)
        html = urllib.request.urlopen(base + "/assets", timeout=60).read().decode()
        assert "<html" in html.lower()
        # find the compacted-stream asset the UI lists
        nodes = g("{ assetNodes { assetKey { path } jobNames partitionDefinition { name } } }")["assetNodes"]
        compacted = next(n for n in nodes if n["assetKey"]["path"] == ["customer_order_status", "compacted"])
        assert "compact_customer_order_status" in compacted["jobNames"]
        g.add_partition("assets", "customer_order_status__streams", PARTITION)
        run_id = g.launch("assets", "compact_customer_order_status", PARTITION)
        assert g.wait(run_id, timeout=300) == "SUCCESS", (tmp_path / "dagster-dev.log").read_text()[-3000:]
        meta = g.materialization_metadata(["customer_order_status", "compacted"], PARTITION)
        # the paper's 1995-04-04 partition: 8 rows in, 3 orders out (5 older statuses dropped)
        assert meta["dagster/row_count"] == 3 and meta["rows in"] == 8 and meta["duplicates dropped"] == 5
        assert g.check_results(["customer_order_status", "compacted"]) == {"primary_keys_unique": "SUCCEEDED"}
        assert set(g.check_results(["customer_order_status", "pk_index"]).values()) == {"SUCCEEDED"}
    finally:
        # dagster dev shuts down on Ctrl-C; whatever of its process group is left after 10 s is killed
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()
