"""The new-delta sensor: cursor, no duplicate runs, new partition streams registered, trigger policies, scale."""

import json
import time

import pytest
from dagster_helpers import rows, run_requests, streams_of, tick, write_config
from dagster import DagsterInstance

from flash_pipeline.triggers import TriggerPolicy, decide
from resources.config import load_config, parse_trigger, pending_trigger_stats
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from sensors.new_deltas import scan_table


TABLES_YAML_BATCH = """
tables:
  - name: orders
    source: T.ORDERS
    primary_keys: [id]
    trigger: {policy: immediate}
    batch: {streams: 3, bytes: 10000}
"""


@pytest.fixture
def setup(tmp_path):
    cfg = write_config(tmp_path)
    lake = str(tmp_path / "lake")
    return build_definitions(cfg, lake), DagsterInstance.ephemeral(), Catalog(lake), load_config(cfg)


def test_due_streams_batch_into_one_run_and_none_twice_for_the_same_deltas(setup) -> None:
    defs, instance, cat, _ = setup
    result, cursor = tick(defs, instance, None)
    assert not run_requests(result)  # empty lake: nothing to do
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([2, 3])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([4], day="d2")])
    result, cursor = tick(defs, instance, cursor)
    (req,) = run_requests(result)  # one run for both due streams
    assert req.job_name == "compact_orders_batch" and streams_of(req) == ["day=d1", "day=d2"]
    assert req.tags["flash/streams"] == "2" and req.tags["flash/trigger_rule"] == "immediate"
    # new partition streams are registered as dynamic partitions
    assert sorted(instance.get_dynamic_partitions("orders__streams")) == ["day=d1", "day=d2"]
    # the same deltas never launch a second run; a tick evaluated again from the same cursor asks for the same run
    result, cursor = tick(defs, instance, cursor)
    assert not run_requests(result)
    # a new delta: one new run for its stream only, with a new run key
    cat.append("T.ORDERS", {"day": "d2"}, "delete", [rows([4], day="d2").select(["id"])])
    result, cursor = tick(defs, instance, cursor)
    (req2,) = run_requests(result)
    assert streams_of(req2) == ["day=d2"] and req2.run_key != req.run_key
    # a brand-new partition appears: registered and requested
    cat.append("T.ORDERS", {"day": "d,3/x"}, "upsert", [rows([5], day="d3")])
    result, cursor = tick(defs, instance, cursor)
    (req3,) = run_requests(result)
    assert streams_of(req3) == ["day=d%2C3%2Fx"]
    assert "day=d%2C3%2Fx" in instance.get_dynamic_partitions("orders__streams")


def test_a_tick_redone_from_the_same_cursor_asks_for_the_same_runs(setup) -> None:
    """The daemon may evaluate a tick again from the cursor before it (it died before saving the new one): the fold
    is idempotent and the run keys name the streams and positions, so the same runs are asked for (and Dagster
    launches each run key once)."""
    defs, instance, cat, _ = setup
    _, cursor = tick(defs, instance, None)
    for day in ("d1", "d2", "d3"):
        cat.append("T.ORDERS", {"day": day}, "upsert", [rows([1], day=day)])
    first, _ = tick(defs, instance, cursor)
    second, _ = tick(defs, instance, cursor)
    assert [r.run_key for r in run_requests(first)] == [r.run_key for r in run_requests(second)] != []


def test_batches_hold_at_most_the_configured_streams_and_bytes(tmp_path) -> None:
    from sensors.new_deltas import batches

    text = TABLES_YAML_BATCH
    cfg = write_config(tmp_path, text)
    table = load_config(cfg).table("orders")
    assert (table.batch.streams, table.batch.bytes) == (3, 10_000)
    cat = Catalog(tmp_path / "lake")
    sizes = {}
    for i in range(8):
        d = cat.append("T.ORDERS", {"day": f"d{i}"}, "upsert", [rows(list(range(i * 300 if i == 5 else 1)), day=f"d{i}")])
        sizes[f"day=d{i}"] = d.bytes
    res = scan_table(cat, table, {})
    runs = batches(table, res)
    assert sorted(r[0] for run in runs for r in run) == sorted(sizes)  # every due stream, once
    for run in runs:
        assert len(run) <= 3
        assert len(run) == 1 or sum(sizes[r[0]] for r in run) <= 10_000
    assert [r[0] for r in runs[[i for i, run in enumerate(runs) if "day=d5" in [r[0] for r in run]][0]]] == ["day=d5"] or sizes["day=d5"] <= 10_000


def test_deltas_of_any_writer_materialize_the_partitioned_deltas_asset_once(setup) -> None:
    """For a table without a PySpark load, the sensor reports the deltas it sees first as one materialization of
    <name>/deltas per partition stream (positions and rows of those deltas), never the same deltas twice."""
    defs, instance, cat, _ = setup

    def deltas_events(result) -> dict:
        return {(e.asset_key.path[0], e.partition): e.metadata for e in (getattr(result, "asset_events", None) or [])
                if e.asset_key.path[-1] == "deltas"}

    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    cat.append("T.ORDERS", {"day": "d1"}, "delete", [rows([2]).select(["id"])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([4, 5, 6], day="d2")])
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([7])])
    result, cursor = tick(defs, instance, None)
    got = deltas_events(result)
    assert set(got) == {("orders", "day=d1"), ("orders", "day=d2"), ("batched", "day=d1")}
    d1 = got[("orders", "day=d1")]
    assert d1["last position"].value == 2 and d1["deltas"].value == 2
    assert d1["upsert rows"].value == 2 and d1["delete rows"].value == 1
    assert got[("orders", "day=d2")]["upsert rows"].value == 3
    result, cursor = tick(defs, instance, cursor)
    assert not deltas_events(result)  # nothing new: nothing reported
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([8], day="d2")])
    result, cursor = tick(defs, instance, cursor)
    got = deltas_events(result)
    assert set(got) == {("orders", "day=d2")}
    assert got[("orders", "day=d2")]["last position"].value == 2 and got[("orders", "day=d2")]["upsert rows"].value == 1


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
    assert [streams_of(r) for r in run_requests(result)] == [["day=d1"]]


def _stream(res, pkey: str) -> dict:
    """The pending state of one partition stream after a scan."""
    (found,) = [s for s in res.entries["streams"].values() if s["key"] == pkey]
    return found


def _newest(res, pkey: str) -> float:
    return max(item[3] for item in _stream(res, pkey)["items"].values())


def _rules(res) -> list[tuple[str, str]]:
    return [(r[0], res.decisions[r[0]].rule) for r in res.requests]


def test_upsolver_trigger_rules(setup) -> None:
    _, _, cat, project = setup
    table = project.table("batched")  # min_files 3, quiet 100s, max_files 6, stale 10000s, more than 50 pending rows
    entries: dict = {}
    t0 = time.time()
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([1]), rows([2])])
    res = scan_table(cat, table, entries, now=t0 + 1)
    assert not res.requests and res.waiting and res.new_partition_keys == ["day=d1"]
    assert "fewer than 3 files" in res.decisions["day=d1"].reason
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([3])])  # 3 files now, but the last one is fresh
    res = scan_table(cat, table, res.entries, now=time.time() + 1)
    assert not res.requests and res.records_read == 1
    last = _newest(res, "day=d1")
    # rule 1's age is strict (flash_pipeline.triggers): exactly quiet_seconds old waits, a bit older fires
    at_quiet = scan_table(cat, table, res.entries, now=last + 100)
    assert not at_quiet.requests and "not older than" in at_quiet.decisions["day=d1"].reason
    res_quiet = scan_table(cat, table, res.entries, now=last + 100.5)
    assert _rules(res_quiet) == [("day=d1", "rule1")] and res_quiet.requests[0][3].startswith("rule 1:")
    # rule 2: many small files (6 = max_files, inclusive), however fresh
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([4]), rows([5]), rows([6])])
    res2 = scan_table(cat, table, res.entries, now=time.time())
    assert _rules(res2) == [("day=d1", "rule2")]
    assert res2.requests[0][2] == 3 and _stream(res2, "day=d1")["req"] == 3
    # rule 3: one stale small file (strict age)
    cat.append("T.BATCHED", {"day": "d2"}, "upsert", [rows([7], day="d2")])
    res3 = scan_table(cat, table, res2.entries, now=time.time())
    t_d2 = _newest(res3, "day=d2")
    assert not scan_table(cat, table, res3.entries, now=t_d2 + 10000).requests
    res3 = scan_table(cat, table, res3.entries, now=t_d2 + 10000.5)
    assert _rules(res3) == [("day=d2", "rule3")]
    # pending rows rule: exceeding max_pending_rows (50) fires, exactly 50 waits
    cat.append("T.BATCHED", {"day": "d3"}, "upsert", [rows(list(range(100, 150)), day="d3")])
    res4 = scan_table(cat, table, res3.entries, now=time.time())
    assert not res4.requests and "50 pending rows do not exceed 50" in res4.decisions["day=d3"].reason
    cat.append("T.BATCHED", {"day": "d3"}, "upsert", [rows([150], day="d3")])
    res4 = scan_table(cat, table, res4.entries, now=time.time())
    assert _rules(res4) == [("day=d3", "pending_rows")] and res4.requests[0][2] == 2
    # big files never trigger the size rules (average == small_file_bytes is not small)
    policy = TriggerPolicy.from_mapping({"policy": "upsolver", "min_files": 1, "max_files": 1, "small_file_bytes": 1000,
                                         "stale_seconds": 1, "quiet_seconds": 1})
    assert not decide(pending_trigger_stats(1, 5, 5000, 5, 10**6), policy).compact
    assert decide(pending_trigger_stats(1, 5, 4995, 5, 10**6), policy).reason.startswith("rule 1")
    assert decide(pending_trigger_stats(1, 1, 1, 1, 0), TriggerPolicy.immediate()).compact
    assert parse_trigger({"policy": "immediate", "max_pending_rows": 0}, "t").max_pending_rows is None  # tables.yaml: 0 is off


def test_sensor_and_auto_share_the_trigger_rules(setup) -> None:
    """The sensor's decision from its cursor equals flash_pipeline.triggers.evaluate (what `flash-compactor auto` uses)."""
    from flash_pipeline.triggers import evaluate

    _, _, cat, project = setup
    table = project.table("batched")
    policy = table.trigger
    assert (policy.mode, policy.many_files, policy.too_many_files, policy.small_file_bytes, policy.many_files_min_age,
            policy.stale_age, policy.max_pending_rows) == ("upsolver", 3, 6, 1000000, 100.0, 10000.0, 50)
    cat.append("T.BATCHED", {"day": "e1"}, "upsert", [rows([1], day="e1"), rows([2], day="e1")])
    cat.append("T.BATCHED", {"day": "e1"}, "upsert", [rows([3], day="e1")])
    cat.append("T.BATCHED", {"day": "e2"}, "upsert", [rows([4], day="e2")])
    base = time.time()
    for offset in (0, 150, 20000):
        now = base + offset
        res = scan_table(cat, table, {}, now=now)
        assert set(res.decisions) == {"day=e1", "day=e2"}
        for pkey, decision in res.decisions.items():
            engine = evaluate(cat, "T.BATCHED", {"day": pkey.split("=")[1]}, policy, now=now, compacted_table_id=table.destination)
            assert (decision.compact, decision.rule, decision.reason) == (engine.compact, engine.rule, engine.reason), offset
    # 0 s: both wait; 150 s: e1 (3 files, quiet) fires rule 1, e2 waits; 20000 s: e2 is stale (rule 3)
    assert {k: d.rule for k, d in scan_table(cat, table, {}, now=base + 150).decisions.items()} == {"day=e1": "rule1", "day=e2": None}
    assert scan_table(cat, table, {}, now=base + 20000).decisions["day=e2"].rule == "rule3"


def test_ticks_stay_cheap_with_many_partitions(setup) -> None:
    """Hundreds of partition streams: the first tick reads each change record once; a tick without new commits
    makes one listing per feed and reads nothing, whatever the lake holds; a tick after one new delta reads that
    record alone. The part of the state shipped every tick (the cursor without the pending streams) stays O(1)."""
    from benchmarks.storage_requests import count_requests

    _, _, cat, project = setup
    table = project.table("orders")
    n = 400
    for i in range(n):
        cat.append("T.ORDERS", {"day": f"d{i:04d}"}, "upsert", [rows([i])])
    with count_requests() as calls:
        res = scan_table(cat, table, {})
    assert len(res.requests) == n and len(res.new_partition_keys) == n and res.records_read == n
    assert calls["read"] <= n + 2, calls  # the records and table.json: no partition, stream or delta document
    with count_requests() as calls:
        res = scan_table(cat, table, res.entries)
    assert not res.requests and res.records_read == 0
    assert dict(calls) == {"exists": 2}, calls  # one look at each feed (source and destination) for its next record
    cat.append("T.ORDERS", {"day": "d0200"}, "upsert", [rows([9])])
    with count_requests() as calls:
        res = scan_table(cat, table, res.entries)
    assert [(r[0], r[2]) for r in res.requests] == [("day=d0200", 2)] and res.records_read == 1
    assert dict(calls) == {"exists": 3, "read": 1}, calls  # the new record, found and read, and the two looks after it
    shipped = {k: v for k, v in res.entries.items() if k != "streams"}
    assert len(json.dumps(shipped)) < 200, shipped


UPSOLVER_3 = """
tables:
  - name: batched
    source: T.BATCHED
    primary_keys: [id]
    trigger: {policy: upsolver, min_files: 3, quiet_seconds: 100, max_files: 60, small_file_bytes: 1000000, stale_seconds: 100000, max_pending_rows: 0}
"""


@pytest.mark.parametrize("after_request", ["run failed", "run failed, two deltas skipped", "run committed", "run in flight"])
def test_a_requested_runs_deltas_stay_pending_until_a_commit_covers_them(tmp_path, after_request: str) -> None:
    """The pending counts are what no compacted version covers: after a failed run the next delta is judged with
    the deltas that run was to compact (as ``triggers.evaluate`` judges the lake), after a committed one alone,
    and while the run is in flight its deltas are not counted twice."""
    from flash_pipeline import compact
    from flash_pipeline.triggers import evaluate

    table = load_config(write_config(tmp_path, UPSOLVER_3)).table("batched")
    cat = Catalog(tmp_path / "lake")
    import pyarrow as pa

    for i in range(3):
        cat.append("T.BATCHED", {"day": "d1"}, "upsert", [pa.table({"id": [i]})])
    now = time.time() + 200  # every delta older than quiet_seconds
    first = scan_table(cat, table, {}, now=now)
    assert [r[0] for r in first.requests] == ["day=d1"]  # rule 1: 3 files
    if after_request == "run committed":
        compact("T.BATCHED", ["id"], catalog=cat, destination_compacted_table_id=table.destination, progress=lambda m: None)
    if after_request == "run failed, two deltas skipped":  # as the failed run's line says: skip-delta
        assert cat.skip_delta("T.BATCHED", {"day": "d1"}, 1) and cat.skip_delta("T.BATCHED", {"day": "d1"}, 2)
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [pa.table({"id": [10]})])
    second = scan_table(cat, table, first.entries, now=now, in_flight=lambda key: after_request == "run in flight")
    lake = evaluate(cat, "T.BATCHED", {"day": "d1"}, table.trigger, now=now, compacted_table_id=table.destination)
    if after_request == "run failed":
        assert lake.compact and [r[0] for r in second.requests] == ["day=d1"], second.decisions["day=d1"].reason
        assert "4 pending files" in second.decisions["day=d1"].reason
    elif after_request == "run failed, two deltas skipped":  # the lake has 2 pending deltas, skipped ones left out
        assert not lake.compact and not second.requests and "2 pending file" in second.decisions["day=d1"].reason
    else:
        assert not second.requests and "1 pending file" in second.decisions["day=d1"].reason
        if after_request == "run committed":
            assert not lake.compact and _stream(second, "day=d1")["req"] == 0


@pytest.mark.parametrize("case", ["the run took a later delta", "a later commit took some", "the API compacted unrequested deltas"])
def test_deltas_a_commit_already_covers_start_no_run_and_fire_no_rule(tmp_path, case: str) -> None:
    """The cursor counts deltas as they are seen; a commit may cover more than the sensor asked for (a run takes
    the deltas appended after its request, or the CLI or API compacts). Such deltas once started a second run
    that found nothing to do, or made a rule fire on rows already compacted. The sensor now agrees with
    ``triggers.evaluate`` of the lake."""
    import pyarrow as pa

    from flash_pipeline import compact
    from flash_pipeline.triggers import evaluate

    table = load_config(write_config(tmp_path, UPSOLVER_3)).table("batched")
    cat = Catalog(tmp_path / "lake")
    part = {"day": "d1"}

    def append(i: int) -> None:
        cat.append("T.BATCHED", part, "upsert", [pa.table({"id": [i]})])

    def compact_all() -> None:
        compact("T.BATCHED", ["id"], catalog=cat, destination_compacted_table_id=table.destination, progress=lambda m: None)

    now = time.time() + 200  # every delta older than quiet_seconds
    if case == "the API compacted unrequested deltas":
        append(0)
        entries = scan_table(cat, table, {}, now=now).entries  # 1 file: waits (rule 1 needs 3)
        append(1), append(2)
        compact_all()
    else:
        for i in range(3):
            append(i)
        first = scan_table(cat, table, {}, now=now)
        assert [r[0] for r in first.requests] == ["day=d1"]
        entries = first.entries
        append(3)
        if case == "a later commit took some":
            append(4)
        compact_all()  # the requested run, taking every delta there is
        if case == "a later commit took some":
            append(5)
    res = scan_table(cat, table, entries, now=now)
    lake = evaluate(cat, "T.BATCHED", part, table.trigger, now=now, compacted_table_id=table.destination)
    assert not lake.compact and not res.requests, res.decisions
    if case == "a later commit took some":  # one delta pending, as the lake says: not three
        assert "1 pending file" in res.decisions["day=d1"].reason
    append(6), append(7)
    res = scan_table(cat, table, res.entries, now=now)  # the counts go on from what the commit left
    want = 3 if case == "a later commit took some" else 2
    assert bool(res.requests) == (want >= 3) and f"{want} pending file" in res.decisions["day=d1"].reason


@pytest.mark.parametrize("sensor_name", ["new_delta_sensor", "lake_observation_sensor"])
def test_a_missing_or_foreign_lake_is_named_not_taken_for_an_idle_one(tmp_path, sensor_name: str) -> None:
    """A mistyped lake path (FLASH_LAKE) made both sensors skip with "no new deltas" / "already in the history"
    forever; the skip reason now says the directory does not exist, or that no configured table is in it."""
    from dagster import SkipReason

    import pyarrow as pa

    cfg = write_config(tmp_path)
    missing = tmp_path / "no-such-lake"
    result, _ = tick(build_definitions(cfg, str(missing)), DagsterInstance.ephemeral(), None, sensor_name)
    assert isinstance(result, SkipReason) and f"the lake directory {missing} does not exist" in result.skip_message
    assert not missing.exists()
    other = Catalog(tmp_path / "other")
    other.append("T.ELSE", {"day": "d1"}, "upsert", [pa.table({"id": [1]})])
    result, _ = tick(build_definitions(cfg, str(tmp_path / "other")), DagsterInstance.ephemeral(), None, sensor_name)
    assert isinstance(result, SkipReason) and "exists in the lake" in result.skip_message and "FLASH_LAKE" in result.skip_message


@pytest.mark.parametrize("storage", ["sqlite", "in-memory"])
def test_pending_streams_accumulate_across_ticks_on_every_instance_storage(tmp_path, storage: str) -> None:
    """The waiting streams live in snapshots in the instance's key-value store; each tick writes the next one and
    blanks one two back. On SQLite (``dg dev``'s default) both once went in one ``set_cursor_values`` call, which
    Dagster runs as one insert that, when a key exists, only updates the existing keys: from the third snapshot on
    the new one was dropped, so the sensor forgot the rows already waiting and never fired the pending-rows rule."""
    cfg = write_config(tmp_path)
    lake = str(tmp_path / "lake")
    defs, cat = build_definitions(cfg, lake), Catalog(lake)
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home")) if storage == "sqlite" else DagsterInstance.ephemeral()
    cursor = None
    fired_at = None
    for step in range(1, 7):  # 12 rows a tick: more than max_pending_rows (50) at the fifth
        cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows(list(range(step * 100, step * 100 + 12)))])
        result, cursor = tick(defs, instance, cursor)
        requests = [r for r in run_requests(result) if r.tags.get("flash/table") == "batched"]
        if requests:
            fired_at = step
            assert requests[0].tags["flash/trigger"] == "60 pending delta rows exceed 50", requests[0].tags
            break
    assert fired_at == 5, fired_at


def test_a_configured_source_missing_from_a_lake_with_others_is_named(setup) -> None:
    """A mistyped ``source:`` in one entry read as "no new deltas" forever while another table existed; the skip
    names the missing source."""
    defs, instance, cat, _ = setup
    cat.append("T.BATCHED", {"day": "d1"}, "upsert", [rows([1])])  # the upsolver table waits for more files
    result, _ = tick(defs, instance, None)
    assert not run_requests(result)
    result, _ = tick(defs, instance, getattr(result, "cursor", None))
    assert "not in the lake yet: T.ORDERS" in result.skip_message, result.skip_message


def test_headless_reports_a_bad_table_config_in_one_line(tmp_path, capsys) -> None:
    from assets.headless import main

    bad = write_config(tmp_path, "tabels:\n  - {name: a, source: A, primary_keys: [k]}\n")
    assert main(["--lake", str(tmp_path / "lake"), "--skip-loads", "--tables", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown top-level field(s) ['tabels']" in err, err
