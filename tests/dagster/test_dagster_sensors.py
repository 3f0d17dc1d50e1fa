"""The new-delta sensor: cursor, no duplicate runs, new partition streams registered, trigger policies, scale."""

import json
import time

import pytest
from _helpers import cursor_entries, rows, run_requests, tick, write_config
from dagster import DagsterInstance

from assets.config import TriggerPolicy, load_config
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from sensors.new_deltas import scan_table


@pytest.fixture
def setup(tmp_path):
    cfg = write_config(tmp_path)
    lake = str(tmp_path / "lake")
    return build_definitions(cfg, lake), DagsterInstance.ephemeral(), Catalog(lake), load_config(cfg)


def test_one_run_per_stream_and_none_twice_for_the_same_deltas(setup) -> None:
    defs, instance, cat, _ = setup
    result, cursor = tick(defs, instance, None)
    assert not run_requests(result)  # empty lake: nothing to do
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([2, 3])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([4], day="d2")])
    result, cursor = tick(defs, instance, cursor)
    reqs = run_requests(result)
    assert sorted((r.partition_key, r.run_key) for r in reqs) == [
        ("day=d1", "orders|day=d1|v1|2"),
        ("day=d2", "orders|day=d2|v1|1"),
    ]
    assert all(r.job_name == "compact_orders" for r in reqs)
    # new partition streams are registered as dynamic partitions
    assert sorted(instance.get_dynamic_partitions("orders__streams")) == ["day=d1", "day=d2"]
    # the same deltas never launch a second run
    result, cursor = tick(defs, instance, cursor)
    assert not run_requests(result)
    # a new delta: one new run for its stream only, with a new run key
    cat.append("T.ORDERS", {"day": "d2"}, "delete", [rows([4], day="d2").select(["id"])])
    result, cursor = tick(defs, instance, cursor)
    assert [(r.partition_key, r.run_key) for r in run_requests(result)] == [("day=d2", "orders|day=d2|v1|2")]
    # a brand-new partition appears: registered and requested
    cat.append("T.ORDERS", {"day": "d,3/x"}, "upsert", [rows([5], day="d3")])
    result, cursor = tick(defs, instance, cursor)
    (req,) = run_requests(result)
    assert req.partition_key == "day=d%2C3%2Fx"
    assert "day=d%2C3%2Fx" in instance.get_dynamic_partitions("orders__streams")


def test_a_fresh_cursor_skips_streams_already_compacted(setup) -> None:
    """Deltas compacted by another process (the CLI) before the sensor first saw them launch nothing."""
    from flash_pipeline.catalog.model import CompactedVersion
    from flash_pipeline.catalog.files import ContentType

    defs, instance, cat, _ = setup
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1])])
    cat.commit_compacted(CompactedVersion("T.ORDERS_COMPACTED", (("day", "d1"),), 1, "T.ORDERS", 1, 1, ("id",), (("ts", "ascending"),),
                                          ContentType.PARQUET, (), None, (), "c", time.time()))
    result, cursor = tick(defs, instance, None)
    assert not run_requests(result)
    assert instance.get_dynamic_partitions("orders__streams") == ["day=d1"]
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([2])])
    result, cursor = tick(defs, instance, cursor)
    assert [r.run_key for r in run_requests(result)] == ["orders|day=d1|v1|2"]


def test_upsolver_trigger_rules(setup) -> None:
    _, _, cat, project = setup
    table = project.table("batched")  # min_files 3, quiet 100s, max_files 6, stale 10000s, 50 pending rows
    entries: dict = {}
    t0 = time.time()
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([1]), rows([2])])
    res = scan_table(cat, table, entries, now=t0 + 1)
    assert not res.requests and res.waiting and res.new_partition_keys == ["day=d1"]
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([3])])  # 3 files now, but the last one is fresh
    res = scan_table(cat, table, res.entries, now=time.time() + 1)
    assert not res.requests and res.manifests_read == 1
    res_quiet = scan_table(cat, table, res.entries, now=time.time() + 200)  # rule 1: quiet long enough
    assert [r[3].split(":")[0] for r in res_quiet.requests] == ["rule 1"]
    # rule 2: many small files, however fresh
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([4]), rows([5]), rows([6])])
    res2 = scan_table(cat, table, res.entries, now=time.time())
    assert [r[3].split(":")[0] for r in res2.requests] == ["rule 2"]
    assert res2.requests[0][2] == 3 and res2.entries[next(iter(res2.entries))]["f"] == 0
    # rule 3: one stale small file
    cat.append("T.BATCHED", {"day": "d2"}, "upsert", [rows([7], day="d2")])
    res3 = scan_table(cat, table, res2.entries, now=time.time() + 20000)
    assert [(r[0], r[3].split(":")[0]) for r in res3.requests] == [("day=d2", "rule 3")]
    # pending rows rule
    cat.append("T.BATCHED", {"day": "d3"}, "upsert", [rows(list(range(100, 160)), day="d3")])
    res4 = scan_table(cat, table, res3.entries, now=time.time())
    assert [(r[0], r[3].split(":")[0]) for r in res4.requests] == [("day=d3", "rows rule")]
    # big files never trigger the size rules
    policy = TriggerPolicy("upsolver", min_files=1, max_files=1, small_file_bytes=10, stale_seconds=1, quiet_seconds=1)
    assert policy.decide(files=5, bytes_=5000, rows=5, last_file_age=10**6) is None
    assert TriggerPolicy("immediate").decide(1, 1, 1, 0)


def test_ticks_stay_cheap_with_many_partitions(setup) -> None:
    """Hundreds of partition streams: a tick reads only manifests it has not seen, and is fast without new deltas."""
    _, _, cat, project = setup
    table = project.table("orders")
    n = 400
    for i in range(n):
        cat.append("T.ORDERS", {"day": f"d{i:04d}"}, "upsert", [rows([i])])
    reads = {"n": 0}
    real_read = cat.storage.read

    def counting_read(key):
        reads["n"] += 1
        return real_read(key)

    cat.storage.read = counting_read
    res = scan_table(cat, table, {})
    assert len(res.requests) == n and len(res.new_partition_keys) == n and res.manifests_read == n
    first_reads = reads["n"]
    reads["n"] = 0
    t0 = time.perf_counter()
    res = scan_table(cat, table, res.entries)
    quiet = time.perf_counter() - t0
    assert not res.requests and res.manifests_read == 0
    assert reads["n"] == 0, "a quiet tick must not read partition.json, stream.json or delta manifests again"
    assert first_reads <= 3 * n + 10
    cat.storage.read = real_read
    cat.append("T.ORDERS", {"day": "d0200"}, "upsert", [rows([9])])
    res = scan_table(cat, table, res.entries)
    assert [(r[0], r[2]) for r in res.requests] == [("day=d0200", 2)] and res.manifests_read == 1
    assert len(json.dumps(res.entries)) < 400 * n  # the cursor stays small
    assert quiet < 30, quiet
