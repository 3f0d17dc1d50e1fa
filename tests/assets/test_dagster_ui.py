"""The README's Dagster deployment end to end in a real browser: `flash-compactor dev` (dg dev plus one Ray for
the deployment) on 127.0.0.1, headless Chromium (Debian's package, driven by Playwright; see `browser_setup.py`)
on its pages, runs launched through the GraphQL API (what the UI's buttons call), and stopped at the end.

One deployment, the stories a data engineer goes through:

1. start-up is quiet (no warning) and the shared Ray is up before the UI; a compaction joins that Ray (no Ray
   of its own) and the asset page shows its row count;
2. a partition stream blocked by a bad delta: the failed run's page shows the engine's one-line description,
   and the failure's metadata gives the repair job's config;
3. the repair job, launched with that config, unblocks the stream: the next compaction succeeds;
4. a rehash backfill materializes the new primary key index version and its checks;
5. a compaction committed by the CLI appears in the UI once the lake observation sensor runs;
6. with 10,000 partition streams registered, the compacted asset's partitions page still opens.

Launches go through GraphQL rather than clicks on *Materialize…*: for this dynamically partitioned multi-asset
the button opens two dialogs and a partition picker, which would test Dagster's widgets more than this project.
Screenshots of each story go to the test's tmp_path, and to $FLASH_UI_SCREENSHOTS when set (docs/ui/ holds
the ones the README shows: `FLASH_UI_SCREENSHOTS=docs/ui pytest tests/assets/test_dagster_ui.py`).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import yaml
from dagster_graphql import GraphQL
from dagster_helpers import REPO
from browser_setup import chromium_page, require_chromium
from conftest import free_port, stop_process, wait_for_port

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import DEMO_DESTINATION, DEMO_SOURCE, demo_deltas

LOCATION = "assets"
TABLE = "customer_order_status"
ASSET = [TABLE, "compacted"]
INDEX = [TABLE, "pk_index"]
PARTITION = "Order Day=1995-04-04"
BLOCKED = "Order Day=1995-04-05"
BY_CLI = "Order Day=1995-04-03"
MANY_PARTITIONS = 10_000
# the one warning the test itself causes: it gives the deployment its own DAGSTER_HOME while the repository
# root, where dg dev runs, holds the dagster.yaml that README users get
OWN_HOME_WARNING = "Found a dagster instance configuration value (dagster.yaml) in the current folder"


def _shown_row_count(page) -> int:
    """The 'Row count' tag of the asset page's Status section (the latest materialization's dagster/row_count)."""
    label = page.get_by_text("Row count", exact=True)
    label.wait_for(state="visible")
    text = label.locator("xpath=..").inner_text()          # "Row count\n3"
    m = re.fullmatch(r"Row count\s+([\d,]+)", text.strip())
    assert m, f"unexpected Row count block: {text!r}"
    return int(m.group(1).replace(",", ""))


def _dismiss_newsletter(page) -> None:
    """dg dev greets a new browser profile with a 'Join the Dagster community' modal; it only hides the page."""
    skip = page.get_by_role("button", name="Skip")
    if skip.is_visible():
        skip.click()


def _screenshot(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name))
    target = os.environ.get("FLASH_UI_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


def _seed_lake(lake: Path) -> None:
    """The paper's example (two order days) and a third day whose delete delta lacks the primary key column:
    appended before any compaction recorded the keys, it blocks that partition stream's compaction."""
    cat = Catalog(lake)
    for part, files in demo_deltas():
        cat.append(DEMO_SOURCE, part, "upsert", files)
    first = demo_deltas()[0][1][0]
    day = (("Order Day", "1995-04-05"),)
    cat.append(DEMO_SOURCE, day, "upsert", [first.set_column(1, "Order Day", pa.array(["1995-04-05"] * first.num_rows))])
    cat.append(DEMO_SOURCE, day, "delete", [first.select(["Last Updated"])])


def _head_answers(ray_tmp: str) -> str | None:
    """The address of the Ray head recorded under ``ray_tmp`` if it still accepts connections."""
    record = Path(ray_tmp) / "ray" / "ray_current_cluster"
    if not record.exists():
        return None
    address = record.read_text().strip()
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return address
    except OSError:
        return None


def test_the_dagster_deployment_in_a_browser(tmp_path: Path) -> None:
    require_chromium()  # fail before starting anything if the browser is missing
    lake = tmp_path / "lake"
    _seed_lake(lake)
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_RAY_ADDRESS", "RAY_ADDRESS")}
    # every compaction takes the Ray path (none is small enough to stay in its run process), so that the test
    # shows each one joining the deployment's Ray rather than starting its own
    env.update(DAGSTER_HOME=str(home), FLASH_SENSORS="0", FLASH_DEMO_LOADS="0", RAY_TMPDIR=ray_tmp,
               FLASH_IN_PROCESS_MAX_BYTES="0")
    cli = os.path.join(os.path.dirname(sys.executable), "flash-compactor")
    log_path = tmp_path / "flash-compactor-dev.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([cli, "dev", "--lake", str(lake), "--host", "127.0.0.1", "--port", str(port), "--ray-cpus", "2"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    head = None
    try:
        wait_for_port(port, timeout=240, proc=proc)
        head = _head_answers(ray_tmp)
        assert head and head.startswith("127.0.0.1:"), log_path.read_text()[-3000:]
        base = f"http://127.0.0.1:{port}"
        g = GraphQL(base)
        started = log_path.read_text()
        assert "starting the deployment's Ray" in started and "Ray ready in" in started
        warnings = [line for line in started.splitlines() if re.search(r"warn", line, re.I) and OWN_HOME_WARNING not in line]
        assert not warnings, "start-up warnings:\n" + "\n".join(warnings)

        with chromium_page(tmp_path / "chromium-profile") as page:
            # 1. a compaction on the deployment's Ray; the asset page shows its row count
            page.goto(f"{base}/assets/{'/'.join(ASSET)}")
            page.get_by_text("The compacted stream AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1").wait_for(state="visible")
            page.get_by_text("Never materialized").wait_for(state="visible")
            for key in (PARTITION, BLOCKED, BY_CLI):
                g.add_partition(LOCATION, f"{TABLE}__streams", key)
            run_id = g.launch(LOCATION, f"compact_{TABLE}", PARTITION)
            assert g.wait(run_id, timeout=300) == "SUCCESS", log_path.read_text()[-3000:]
            assert any(f"joining the Ray at {head}" in m for m in g.messages(run_id)), "the run did not join the deployment's Ray"
            meta = g.materialization_metadata(ASSET, PARTITION)
            # the paper's 1995-04-04 partition: 8 rows in, 3 orders out (5 older statuses dropped)
            assert meta["dagster/row_count"] == 3 and meta["rows in"] == 8 and meta["duplicates dropped"] == 5
            assert set(g.check_results(ASSET).values()) == {"SUCCEEDED"}
            page.reload()
            _dismiss_newsletter(page)
            assert _shown_row_count(page) == 3
            _screenshot(page, tmp_path, "compacted-asset.png")

            # 2. a blocked stream: the run page shows the engine's one line; the failure names the repair
            failed_id = g.launch(LOCATION, f"compact_{TABLE}", BLOCKED)
            assert g.wait(failed_id, timeout=300) == "FAILURE"
            failure = g.step_failure(failed_id)
            line = failure["description"]
            assert "missing from the delete delta at position 2" in line and "skip-delta" in line and "\n" not in line
            assert failure["metadata"]["delta position"] == 2 and failure["metadata"]["partition"] == BLOCKED
            page.goto(f"{base}/runs/{failed_id}")
            page.get_by_text("missing from the delete delta at position 2").first.wait_for(state="visible")
            _screenshot(page, tmp_path, "failed-run.png")

            # 3. the repair job with the config the failure gives; then the stream compacts again
            fix = failure["metadata"]["fix (UI)"]
            repair_config = yaml.safe_load(fix.split("```yaml")[1].split("```")[0])
            repair_id = g.launch(LOCATION, f"repair_{TABLE}", BLOCKED, run_config=repair_config)
            assert g.wait(repair_id, timeout=300) == "SUCCESS"
            assert any("skipped" in m for m in g.messages(repair_id))
            page.goto(f"{base}/runs/{repair_id}")
            page.get_by_text("position 2: skipped").first.wait_for(state="visible")
            _screenshot(page, tmp_path, "repair-run.png")
            again = g.launch(LOCATION, f"compact_{TABLE}", BLOCKED)
            assert g.wait(again, timeout=300) == "SUCCESS"
            assert g.materialization_metadata(ASSET, BLOCKED)["dagster/row_count"] == 2

            # 4. a rehash backfill: the new index version of the partition is materialized, its checks run
            before = g.materialization_metadata(INDEX, PARTITION)
            backfill = g.backfill([[TABLE, "index_rehash"]], [PARTITION])
            assert g.wait_backfill(backfill, timeout=300).startswith("COMPLETED"), log_path.read_text()[-3000:]
            after = g.materialization_metadata(INDEX, PARTITION)
            assert after["hash buckets"] == 8 and after["compacted version"] == before["compacted version"] + 1
            assert g.materialization_metadata([TABLE, "index_rehash"], PARTITION)["dagster/row_count"] == 3
            assert g.check_results(INDEX) == {"index_rows_match_compacted": "SUCCEEDED", "index_pointers_resolve": "SUCCEEDED"}
            page.goto(f"{base}/assets/{'/'.join(INDEX)}?view=checks")
            page.get_by_text("index_pointers_resolve").first.wait_for(state="visible")
            _screenshot(page, tmp_path, "rehash-index-checks.png")

            # 5. a compaction by the CLI shows up once the lake observation sensor runs
            cli_env = {k: v for k, v in env.items() if k != "FLASH_IN_PROCESS_MAX_BYTES"}
            out = subprocess.run([cli, "compact", "--catalog", str(lake), "--table", DEMO_SOURCE, "--primary-key", "Order ID",
                                  "--sort-key", "Last Updated", "--partition", BY_CLI, "--destination", DEMO_DESTINATION, "--json"],
                                 env=cli_env, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stderr[-2000:]
            rows = json.loads(out.stdout)["partitions"][0]["rows_out"]
            g.start_sensor(LOCATION, "lake_observation_sensor")
            deadline = time.monotonic() + 180
            while True:
                try:
                    seen = g.materialization_metadata(ASSET, BY_CLI)
                    break
                except AssertionError:
                    assert time.monotonic() < deadline, "the CLI compaction never appeared"
                    time.sleep(1)
            assert seen["dagster/row_count"] == rows
            stats = g("""query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {
                  partitionStats { numMaterialized numPartitions } } } }""", key={"path": ASSET})["assetNodeOrError"]["partitionStats"]
            assert stats == {"numMaterialized": 3, "numPartitions": 3}  # no compacted partition shows as Missing
            page.goto(f"{base}/assets/{'/'.join(ASSET)}?view=partitions")
            page.get_by_text(BY_CLI).filter(visible=True).first.wait_for(state="visible")
            _screenshot(page, tmp_path, "cli-compaction-partitions.png")

            # 6. a lake of 10,000 partition streams: the partitions page still opens (the sensor registers new keys
            # in batches of 1,000, as here; docs/dagster.md)
            from dagster import DagsterInstance

            many = [f"Order Day=2000-{i:05d}" for i in range(MANY_PARTITIONS - 3)]
            instance = DagsterInstance.from_config(str(home))
            for i in range(0, len(many), 1000):
                instance.add_dynamic_partitions(f"{TABLE}__streams", many[i:i + 1000])
            stats = g("""query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {
                  partitionStats { numMaterialized numPartitions } } } }""", key={"path": ASSET})["assetNodeOrError"]["partitionStats"]
            assert stats == {"numMaterialized": 3, "numPartitions": MANY_PARTITIONS}
            opened = time.monotonic()
            page.goto(f"{base}/assets/{'/'.join(ASSET)}?view=partitions")
            page.get_by_text(f"{MANY_PARTITIONS:,}").filter(visible=True).first.wait_for(state="visible", timeout=120_000)
            page.get_by_text(BY_CLI).filter(visible=True).first.wait_for(state="visible", timeout=120_000)
            print(f"the partitions page of {MANY_PARTITIONS} partitions opened in {time.monotonic() - opened:.1f} s")
            _screenshot(page, tmp_path, "partitions-10000.png")
    finally:
        # Ctrl-C for the whole group (as in a terminal); flash-compactor dev then stops its Ray head
        stop_process(proc, timeout=90, group_signal=signal.SIGINT)
        log.close()
    # Ray's warnings in the runs that joined the deployment's Ray are filtered (runtime/cluster.py)
    ray_warnings = [line for line in log_path.read_text().splitlines() if re.search(r"WARNING (worker|services|node)\.py", line)]
    assert not ray_warnings, "\n".join(ray_warnings)
    deadline = time.monotonic() + 30
    while head and _head_answers(ray_tmp):
        assert time.monotonic() < deadline, "the deployment's Ray head still runs after the UI stopped"
        time.sleep(0.5)
