"""Compaction runs on Ray through Dagster: metadata, round observations, asset checks, rehash backfill.

One module-scoped lake and Dagster instance: the sensor requests the runs, the jobs execute in-process.
"""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster_helpers import request_for, rows, run_requests, streams_of, tick, write_config
from dagster import AssetKey, DagsterEventType, DagsterInstance

from assets.checks import check_index_pointers, check_primary_keys_unique
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from resources import RayResource

D1, D2 = "day=d1", "day=d2"


@pytest.fixture
def env(tmp_path_factory):
    """A lake and an instance of its own for each test (no test builds on another's leftovers or damage)."""
    tmp = tmp_path_factory.mktemp("dagster_compaction")
    lake = str(tmp / "lake")
    cat = Catalog(lake)
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2, 3, 4], ts=[1, 1, 1, 1]), rows([2, 5], ts=[5, 1])])
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 6, 7], ts=[0, 2, 2])])  # 1 arrives late: loses
    cat.append("T.ORDERS", {"day": "d1"}, "delete", [rows([3]).select(["id"])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([10, 11, 12], day="d2")])
    defs = build_definitions(write_config(tmp), lake, ray=RayResource(num_cpus=2))
    return defs, DagsterInstance.ephemeral(), cat


def _compact_all(defs, instance) -> None:
    """One sensor tick and every run it asks for, as the daemon would: both streams compacted."""
    result, _ = tick(defs, instance, None)
    for req in run_requests(result):
        assert _run(defs, instance, req).success


def _run(defs, instance, req):
    job = defs.resolve_job_def(req.job_name)
    return job.execute_in_process(partition_key=req.partition_key, instance=instance, run_config=req.run_config or None)


def _materialization(result, leaf, partition=None):
    for e in result.get_asset_materialization_events():
        m = e.event_specific_data.materialization
        if m.asset_key.path[-1] == leaf and (partition is None or m.partition == partition):
            return m.metadata
    raise AssertionError(f"no materialization of {leaf} {partition or ''}")


def _checks(result, partition=None):
    return {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
            if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
            and (partition is None or e.event_specific_data.partition == partition)}


def test_sensor_runs_compact_each_stream_with_metadata_and_checks(env) -> None:
    defs, instance, cat = env
    result, cursor = tick(defs, instance, None)
    (batch,) = run_requests(result)  # one run compacts both streams; each records its own partition
    assert batch.job_name == "compact_orders_batch" and streams_of(batch) == [D1, D2]
    run = _run(defs, instance, batch)
    assert run.success
    meta = _materialization(run, "compacted", D1)
    assert meta["dagster/row_count"].value == 6  # ids 1, 2, 4, 5, 6, 7: 3 deleted, late 1 and older 2 dropped
    assert meta["rows in"].value == 9 and meta["rows out"].value == 6
    assert meta["duplicates dropped"].value == 2 and meta["deletes applied"].value == 1
    assert meta["files written"].value >= 2 and meta["hash buckets"].value == 2  # at most 3 rows per file
    # the Delta table the run published, as consumers read it
    import deltalake
    import pyarrow as pa

    delta = deltalake.DeltaTable(meta["Delta table"].value, version=meta["Delta version"].value)
    assert pa.table(deltalake.QueryBuilder().register("t", delta).execute("select count(*) as n from t").read_all())["n"][0].as_py() == 6
    # and the Iceberg table: its identifier in the lake's embedded catalog, its metadata file, the same rows
    import lake_readers

    assert meta["Iceberg snapshot"].value == meta["Delta version"].value
    assert lake_readers.iceberg_scan(meta["Iceberg metadata"].value).num_rows == 6
    table = meta["Iceberg table"].data
    iceberg = lake_readers.pyiceberg_table(table["catalog_uri"], [table["namespace"], table["name"]])
    assert iceberg.current_snapshot().snapshot_id == meta["Iceberg snapshot"].value
    assert iceberg.scan().to_arrow().num_rows == 6
    assert meta["expected seconds"].value is not None and meta["actual seconds"].value > 0
    # typed numbers the Plots tab draws: per step, and the run's wall time split into engine and start-up
    steps = [meta[f"seconds: {s}"].value for s in ("hash bucket", "dedupe", "materialize", "commit")]
    assert all(isinstance(v, float) and v >= 0 for v in steps) and sum(steps) <= meta["engine seconds"].value + 1e-3
    assert abs(meta["engine seconds"].value + meta["start-up seconds"].value - meta["actual seconds"].value) < 1e-3
    rounds = meta["rounds table"].records
    assert [r.data["round"] for r in rounds] == [1] and rounds[0].data["state"] == "committed"
    assert rounds[0].data["rows"] == 6 and rounds[0].data["files written"] == meta["files written"].value
    assert [c.name for c in meta["dagster/column_schema"].schema.columns] == ["id", "day", "ts", "v"]
    assert "rows out" in meta["summary"].value and "**6**" in meta["summary"].value
    index_meta = _materialization(run, "pk_index", D1)
    assert index_meta["dagster/row_count"].value == 6 and index_meta["hash buckets"].value == 2
    checks = _checks(run, D1)
    assert set(checks) == {"primary_keys_unique", "index_rows_match_compacted", "index_pointers_resolve", "files_intact"}
    assert all(c.passed for c in checks.values())
    assert checks["files_intact"].metadata["problems"].value == 0
    # a round checkpoint was observed while the run was in progress
    obs = [e.event_specific_data.asset_observation for e in run.all_events if e.event_type == DagsterEventType.ASSET_OBSERVATION]
    assert sorted(o.partition for o in obs) == [D1, D2] and {o.metadata["round"].value for o in obs} == {1}
    # the rows themselves
    got = {r["id"]: r["ts"] for f in cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d1"),)).files for r in cat.read_live(f).to_pylist()}
    assert got == {1: 1, 2: 5, 4: 1, 5: 1, 6: 2, 7: 2}
    assert _materialization(run, "compacted", D2)["dagster/row_count"].value == 3 and set(_checks(run, D2)) == set(checks)
    # no duplicate runs on the next tick; an incremental compaction after a new delta
    result, cursor = tick(defs, instance, cursor)
    assert not run_requests(result)
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([10, 13], ts=[9, 9], day="d2")])
    result, cursor = tick(defs, instance, cursor)
    (req,) = run_requests(result)
    run = _run(defs, instance, req)
    meta = _materialization(run, "compacted")
    assert meta["dagster/row_count"].value == 4 and meta["prior rows"].value == 3 and meta["duplicates dropped"].value == 1
    mats = instance.fetch_materializations(AssetKey(["orders", "compacted"]), limit=10).records
    assert sorted({m.partition_key for m in mats}) == [D1, D2]


def test_the_sensor_and_checks_carry_on_across_an_added_and_a_renamed_column(env) -> None:
    """Schema evolution through Dagster: a delta adding ``channel``, then ``evolve --rename v=value``: the sensor
    asks for a run after each (the rename's empty delta is a delta like any other), each materialization says
    what changed and carries the new column schema, and every check passes on the evolved versions."""
    from flash_pipeline.catalog.schema_edits import rename_and_drop

    defs, instance, cat = env
    _compact_all(defs, instance)
    _, cursor = tick(defs, instance, None)
    added = rows([20], ts=[9]).append_column("channel", pa.array(["web"]))
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [added])
    for change, columns in [("added 'channel'", ["id", "day", "ts", "v", "channel"]),
                            ("renamed 'v' to 'value'", ["id", "day", "ts", "value", "channel"])]:
        result, cursor = tick(defs, instance, cursor)
        (req,) = run_requests(result)
        assert streams_of(req) == [D1] if req.job_name.endswith("_batch") else req.partition_key == D1
        run = _run(defs, instance, req)
        assert run.success
        meta = _materialization(run, "compacted", D1)
        assert meta["schema changes"].value == change
        assert [c.name for c in meta["dagster/column_schema"].schema.columns] == columns
        checks = _checks(run, D1)
        assert len(checks) == 4 and all(c.passed for c in checks.values()), checks
        if change.startswith("added"):
            rename_and_drop(cat, "T.ORDERS", {"v": "value"}, partitions=[{"day": "d1"}])
    got = {r["id"]: (r["value"], r["channel"]) for f in cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d1"),)).files
           for r in cat.read_live(f).to_pylist()}
    assert got[20][1] == "web" and got[1][1] is None and len(got) == 7


def test_rehash_backfill_materializes_each_partitions_index_and_runs_its_checks(env) -> None:
    """A rehash backfill is one run per partition stream: each reports its own partition's index row count,
    materializes the new primary key index version of that partition and evaluates the index checks on it."""
    defs, instance, cat = env
    if cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d2"),)) is None:  # alone: compact as the sensor would
        result, _ = tick(defs, instance, None)
        for req in run_requests(result):
            assert _run(defs, instance, req).success
    job = defs.resolve_job_def("rehash_orders")
    before = {d: cat.latest_compacted("T.ORDERS_COMPACTED", (("day", d),)) for d in ("d1", "d2")}
    assert before["d1"].index.live_rows != before["d2"].index.live_rows  # so that a range total could not pass for either
    for d in ("d1", "d2"):
        run = job.execute_in_process(instance=instance, partition_key=f"day={d}",
                                     run_config={"ops": {"orders__index_rehash": {"config": {"hash_bucket_count": 5}}}})
        assert run.success
        after = cat.latest_compacted("T.ORDERS_COMPACTED", (("day", d),))
        assert after.index.hash_bucket_count == 5 and after.version == before[d].version + 1
        assert after.files == before[d].files and after.index.live_rows == before[d].index.live_rows
        assert check_index_pointers(cat, after)[0]
        meta = _materialization(run, "index_rehash")
        assert meta["hash buckets"].value == 5 and meta["dagster/row_count"].value == after.index.live_rows
        index_meta = _materialization(run, "pk_index")
        assert index_meta["compacted version"].value == after.version and index_meta["hash buckets"].value == 5
        assert index_meta["index version"].value == after.index.version
        checks = _checks(run)
        assert set(checks) == {"index_rows_match_compacted", "index_pointers_resolve"}
        assert all(c.passed and c.partition == f"day={d}" for c in checks.values())
        record = instance.fetch_materializations(AssetKey(["orders", "pk_index"]), limit=1).records[0]
        assert record.partition_key == f"day={d}"
    # the default target comes from tables.yaml (rehash_buckets: 3), for one chosen partition
    run = job.execute_in_process(instance=instance, partition_key=D2)
    assert run.success and cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d2"),)).index.hash_bucket_count == 3
    mats = instance.fetch_materializations(AssetKey(["orders", "index_rehash"]), limit=10).records
    assert {m.partition_key for m in mats} == {D1, D2}


def test_a_rehash_backfill_runs_many_partitions_per_run(env) -> None:
    """BackfillPolicy.multi_run: a backfill over a partition range is one run that rehashes each partition and
    records each one's index materialization and checks, with the range's totals on the rehash asset."""
    defs, instance, cat = env
    for d in ("d1", "d2"):
        if cat.latest_compacted("T.ORDERS_COMPACTED", (("day", d),)) is None:  # alone: compact as the sensor would
            result, _ = tick(defs, instance, None)
            for req in run_requests(result):
                assert _run(defs, instance, req).success
    before = {d: cat.latest_compacted("T.ORDERS_COMPACTED", (("day", d),)) for d in ("d1", "d2")}
    run = defs.resolve_job_def("rehash_orders").execute_in_process(
        instance=instance, tags={"dagster/asset_partition_range_start": D1, "dagster/asset_partition_range_end": D2},
        run_config={"ops": {"orders__index_rehash": {"config": {"hash_bucket_count": 7}}}})
    assert run.success
    for d in ("d1", "d2"):
        after = cat.latest_compacted("T.ORDERS_COMPACTED", (("day", d),))
        assert after.index.hash_bucket_count == 7 and after.version == before[d].version + 1 and check_index_pointers(cat, after)[0]
        assert _materialization(run, "pk_index", f"day={d}")["hash buckets"].value == 7
        assert set(_checks(run, f"day={d}")) == {"index_rows_match_compacted", "index_pointers_resolve"}
    rehash_meta = _materialization(run, "index_rehash")
    assert rehash_meta["partitions"].value == 2
    assert rehash_meta["dagster/row_count"].value == sum(before[d].index.live_rows for d in ("d1", "d2"))


def test_asset_check_fails_on_a_corrupted_compacted_file(env) -> None:
    defs, instance, cat = env
    _compact_all(defs, instance)
    part = (("day", "d1"),)
    compacted = cat.latest_compacted("T.ORDERS_COMPACTED", part)
    f = compacted.files[0]
    path = cat.storage.root / f.key  # a local lake
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), path)  # one row twice
    assert not check_primary_keys_unique(cat, compacted)[0]
    # re-materializing the partition (nothing new to compact) evaluates the checks on the corrupted version
    # the checks are blocking: the run fails (nothing downstream builds on the bad version), each check's result
    # is recorded for the run's partition stream
    run = defs.resolve_job_def("compact_orders").execute_in_process(partition_key=D1, instance=instance, raise_on_error=False)
    assert not run.success
    failure = next(e for e in run.all_events if e.event_type == DagsterEventType.STEP_FAILURE).event_specific_data
    assert failure.error.cls_name == "DagsterAssetCheckFailedError" and "primary_keys_unique" in failure.error.message
    assert _materialization(run, "compacted")["status"].value == "up-to-date"
    checks = _checks(run)
    assert {c.partition for c in checks.values()} == {D1}
    assert not checks["primary_keys_unique"].passed
    assert checks["primary_keys_unique"].metadata["duplicates"].value == 1
    assert checks["index_rows_match_compacted"].passed  # manifest counts agree; the file does not
    # the rewritten file no longer matches its recorded checksum, size and rows: one problem line names it
    intact = checks["files_intact"]
    assert not intact.passed and intact.severity.value == "ERROR"
    assert intact.metadata["problems"].value == 1 and f.key in intact.metadata["first problem"].value


def test_a_blocked_stream_fails_the_run_with_the_engines_line_and_the_repair_job_unblocks_it(env) -> None:
    """A delta whose file was damaged after its commit blocks the stream: the run fails with dagster.Failure whose
    description is the CLI's one line, and whose metadata names the table, partition, delta position and the fix
    (command and repair job config; no new stream version for a stream never compacted); the repair job launched
    with that config unblocks the stream and the next compaction succeeds."""
    from pathlib import Path

    import yaml

    defs, instance, cat = env
    cat.append("T.ORDERS", {"day": "d3"}, "upsert", [rows([20, 21], day="d3")])
    cat.append("T.ORDERS", {"day": "d3"}, "upsert", [rows([22], day="d3")])
    bad = cat.append("T.ORDERS", {"day": "d3"}, "upsert", [rows([23], day="d3")])
    damaged = Path(cat.uri) / bad.files[0].key
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    result, _ = tick(defs, instance, None)
    req = request_for(result, "day=d3")
    job = defs.resolve_job_def(req.job_name)
    run = job.execute_in_process(partition_key=req.partition_key, instance=instance, run_config=req.run_config or None,
                                 raise_on_error=False)
    assert not run.success
    failures = [e for e in run.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error = failures[0].event_specific_data.error
    assert error.cls_name == "Failure"
    failure = failures[0].event_specific_data.user_failure_data
    described = failure.description
    assert "the delta at position 3 cannot be read" in described and "flash-compactor skip-delta" in described
    assert "new-stream" not in described  # never compacted: nothing to start a new stream version from
    assert "--position 3" in described and "\n" not in described
    meta = {k: v.value for k, v in failure.metadata.items()}
    assert meta["table"] == "T.ORDERS" and meta["partition"] == "day=d3" and meta["delta position"] == 3
    assert meta["fix (CLI)"].startswith("skip it: flash-compactor skip-delta") and "--position 3" in meta["fix (CLI)"]
    assert cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d3"),)) is None
    # the engine's traceback is a DEBUG line of the run, not chained to the failure the run page shows
    assert error.cause is None
    debug = [e.user_message for e in instance.all_logs(run.run_id) if not e.is_dagster_event and e.level == 10]
    assert any("engine traceback" in m and "StreamBlocked" in m for m in debug)

    # the UI's fix: the repair job, with the launchpad config the metadata shows
    fix_ui = meta["fix (UI)"]
    assert "repair_orders" in fix_ui and "new stream version" not in fix_ui
    skip_config = yaml.safe_load(fix_ui.split("```yaml")[1].split("```")[0])
    repair = defs.resolve_job_def("repair_orders")
    fixed = repair.execute_in_process(partition_key="day=d3", instance=instance, run_config=skip_config)
    assert fixed.success
    assert cat.skipped_positions("T.ORDERS", (("day", "d3"),), cat.active_stream("T.ORDERS", (("day", "d3"),)).version) == {3}
    run = job.execute_in_process(partition_key=req.partition_key, instance=instance, run_config=req.run_config or None)
    assert run.success
    got = {r["id"] for f in cat.latest_compacted("T.ORDERS_COMPACTED", (("day", "d3"),)).files for r in cat.read_live(f).to_pylist()}
    assert got == {20, 21, 22}


def test_the_repair_job_starts_a_new_stream_version_and_refuses_a_skip_without_position(env) -> None:
    """new_stream restarts the partition stream from its latest compacted rows (what the CLI's new-stream does);
    skip_delta without a position fails with a one-line description naming what is missing."""
    defs, instance, cat = env
    _compact_all(defs, instance)
    part = (("day", "d2"),)
    repair = defs.resolve_job_def("repair_orders")
    bad = repair.execute_in_process(partition_key="day=d2", instance=instance, raise_on_error=False,
                                    run_config={"ops": {"orders__unblock_stream": {"config": {"action": "skip_delta"}}}})
    assert not bad.success
    failure = next(e for e in bad.all_events if e.event_type == DagsterEventType.STEP_FAILURE).event_specific_data
    assert "needs the delta's position" in failure.user_failure_data.description
    compacted = cat.latest_compacted("T.ORDERS_COMPACTED", part)
    before = cat.active_stream("T.ORDERS", part).version
    fresh = repair.execute_in_process(partition_key="day=d2", instance=instance,
                                      run_config={"ops": {"orders__unblock_stream": {"config": {"action": "new_stream"}}}})
    assert fresh.success
    stream = cat.active_stream("T.ORDERS", part)
    assert stream.version == before + 1
    (first,) = cat.deltas("T.ORDERS", part)
    carried = sorted(r["id"] for f in first.files for r in cat.read_live(f).to_pylist())
    assert carried == sorted(r["id"] for f in compacted.files for r in cat.read_live(f).to_pylist())


@pytest.mark.parametrize("buckets", [5000, 0])
def test_an_engine_error_in_a_rehash_run_fails_it_with_the_clis_line(env, buckets: int) -> None:
    """Every asset that calls the engine maps its error to dagster.Failure with the one line the CLI prints. A 0
    is refused as the command refuses it (it once meant "the table's rehash_buckets")."""
    from flash_pipeline.cli import main

    defs, instance, cat = env
    _compact_all(defs, instance)
    job = defs.resolve_job_def("rehash_orders")
    run = job.execute_in_process(instance=instance, partition_key=D1, raise_on_error=False,
                                 run_config={"ops": {"orders__index_rehash": {"config": {"hash_bucket_count": buckets}}}})
    assert not run.success
    failure = next(e for e in run.all_events if e.event_type == DagsterEventType.STEP_FAILURE).event_specific_data
    assert failure.error.cls_name == "Failure"
    described = failure.user_failure_data.description
    assert f"hash bucket count {buckets} is out of range" in described and "\n" not in described
    assert failure.user_failure_data.metadata["exit code (CLI)"].value == 2
    # the CLI refuses the same request with the same words
    code = main(["rehash", "--catalog", cat.uri, "--table", "T.ORDERS_COMPACTED", "--hash-buckets", str(buckets)])
    assert code == 2


def test_progress_inside_a_round_reaches_the_run_log(env, monkeypatch) -> None:
    """Each step's tasks done/total are log lines of the run (here every change: FLASH_PROGRESS_SECONDS=0)."""
    defs, instance, cat = env
    monkeypatch.setenv("FLASH_PROGRESS_SECONDS", "0")
    cat.append("T.ORDERS", {"day": "d9"}, "upsert", [rows([90, 91, 92], day="d9")])
    result, _ = tick(defs, instance, None)
    req = request_for(result, "day=d9")
    run = _run(defs, instance, req)
    assert run.success
    messages = [e.user_message for e in instance.all_logs(run.run_id) if not e.is_dagster_event]
    for step in ("hash bucket", "dedupe", "materialize"):
        lines = [m for m in messages if f"round 1/1 {step}: " in m]
        assert lines and lines[-1].split(f"{step}: ")[1].startswith(tuple(f"{n}/{n} tasks done" for n in range(1, 64))), lines
