"""`dagster dev` end to end in a real browser: start the webserver and daemon on 127.0.0.1, open the
compacted-stream asset's page in headless Chromium (Debian's package, driven by Playwright; see
`browser_setup.py`), launch a compaction through the GraphQL API (what the UI's Materialize button calls), wait
for success, reload the page and read the row count the UI shows, check it against the materialization's
metadata read over GraphQL, and stop the server.

The launch goes through GraphQL rather than a click on *Materialize…*: for this dynamically partitioned
multi-asset the button opens two dialogs and a partition picker, which would test Dagster's widgets more than
this project. A screenshot of the asset page is left in the test's tmp_path (`asset-page.png`).
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from dagster_graphql import GraphQL
from dagster_helpers import REPO
from browser_setup import chromium_page, require_chromium
from conftest import free_port, wait_for_port

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import DEMO_SOURCE, demo_deltas

PARTITION = "Order Day=1995-04-04"
ASSET = ["customer_order_status", "compacted"]


def _shown_row_count(page) -> int:
    """The 'Row count' tag of the asset page's Status section (the latest materialization's dagster/row_count)."""
    label = page.get_by_text("Row count", exact=True)
    label.wait_for(state="visible")
    text = label.locator("xpath=..").inner_text()          # "Row count\n3"
    m = re.fullmatch(r"Row count\s+([\d,]+)", text.strip())
    assert m, f"unexpected Row count block: {text!r}"
    return int(m.group(1).replace(",", ""))


def _dismiss_newsletter(page) -> None:
    """dagster dev greets a new browser profile with a 'Join the Dagster community' modal; it only hides the page."""
    skip = page.get_by_role("button", name="Skip")
    if skip.is_visible():
        skip.click()


def test_dagster_dev_ui_shows_the_row_count_of_a_launched_compaction(tmp_path: Path) -> None:
    require_chromium()  # fail before starting anything if the browser is missing
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
        # the compacted-stream asset the UI lists, and its compaction job
        nodes = g("{ assetNodes { assetKey { path } jobNames partitionDefinition { name } } }")["assetNodes"]
        compacted = next(n for n in nodes if n["assetKey"]["path"] == ASSET)
        assert "compact_customer_order_status" in compacted["jobNames"]

        with chromium_page(tmp_path / "chromium-profile") as page:
            page.goto(f"{base}/assets/{'/'.join(ASSET)}")
            # the UI rendered the asset: its key in the breadcrumb, its description, and no materialization yet
            page.get_by_text("customer_order_status", exact=True).first.wait_for(state="visible")
            page.get_by_text("compacted", exact=True).first.wait_for(state="visible")
            page.get_by_text("The compacted stream AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1").wait_for(state="visible")
            page.get_by_text("Never materialized").wait_for(state="visible")
            assert page.get_by_role("button", name="Materialize…").is_visible()
            assert not page.get_by_text("Row count", exact=True).is_visible()

            g.add_partition("assets", "customer_order_status__streams", PARTITION)
            run_id = g.launch("assets", "compact_customer_order_status", PARTITION)
            assert g.wait(run_id, timeout=300) == "SUCCESS", (tmp_path / "dagster-dev.log").read_text()[-3000:]
            meta = g.materialization_metadata(ASSET, PARTITION)
            # the paper's 1995-04-04 partition: 8 rows in, 3 orders out (5 older statuses dropped)
            assert meta["dagster/row_count"] == 3 and meta["rows in"] == 8 and meta["duplicates dropped"] == 5
            assert g.check_results(ASSET) == {"primary_keys_unique": "SUCCEEDED", "files_intact": "SUCCEEDED"}
            assert set(g.check_results(["customer_order_status", "pk_index"]).values()) == {"SUCCEEDED"}

            page.reload()
            shown = _shown_row_count(page)
            _dismiss_newsletter(page)
            page.get_by_text(PARTITION).first.wait_for(state="visible")   # latest materialization's partition
            page.screenshot(path=str(tmp_path / "asset-page.png"))
            assert shown == meta["dagster/row_count"] == 3
            assert "Never materialized" not in page.inner_text("body")
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
