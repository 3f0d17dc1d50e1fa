"""The primary key check reads what changed since the version it last passed on (assets/check_scope.py), and
still finds every duplicate the full check finds: against a plain Python model, on planted duplicates and on a
recorded key range that lies; through Dagster, the proof comes from the instance's own record of the check."""

from dataclasses import replace

import pyarrow as pa
import pytest
from dagster import DagsterEventType, DagsterInstance
from dagster_helpers import ONE_TABLE, write_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assets.check_scope import scope_since
from assets.checks import check_primary_keys_unique
from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.key_ranges import KeyRange
from flash_pipeline.compactor.job import compact

TABLE = "T.ORDERS"


def _rows(ids: list[int], ts: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array([ts] * len(ids), pa.int64()),
                     "v": [f"v{i}@{ts}" for i in ids]})


def _compact(cat: Catalog):
    result = compact(TABLE, ["id"], [("ts", "ascending")], catalog=cat, rows_per_compacted_file=50, hash_bucket_count=2, rows_per_primary_key_index_file=30,
                     executor="in-process", deletion_vectors=False)
    (pres,) = result.partitions
    return cat.compacted_version(TABLE, (), pres.compacted_version)


@pytest.fixture
def two_versions(tmp_path):
    """Version 1: ids 0-399 in files of 50 rows (narrow id ranges); version 2: 20 updates among ids 100-119."""
    cat = Catalog(tmp_path / "lake")
    cat.append(TABLE, (), "upsert", [_rows(list(range(400)), ts=1)])
    v1 = _compact(cat)
    cat.append(TABLE, (), "upsert", [_rows(list(range(100, 120)), ts=2)])
    return cat, v1, _compact(cat)


def test_a_change_is_checked_against_the_unchanged_files_its_keys_may_meet(two_versions) -> None:
    cat, v1, v2 = two_versions
    full_ok, full = check_primary_keys_unique(cat, v2)
    inc_ok, inc = check_primary_keys_unique(cat, v2, proven=v1)
    assert full_ok and inc_ok
    assert full["rows read"] == v2.rows == 400 and full["proven version"] == "none: every file read"
    assert inc["proven version"] == 1 and inc["rows read"] < full["rows read"] / 2
    scope = scope_since(v2, v1)
    assert {f.key for f in scope.unchanged} == {f.key for f in v1.files} & {f.key for f in v2.files}
    assert scope.changed and all(f.key not in {g.key for g in v1.files} for f in scope.changed)


def test_a_duplicate_between_a_changed_and_an_unchanged_file_is_found(two_versions) -> None:
    """Version 2 with the replaced file of version 1 put back: its rows (ids 100-119 among them) sit in an
    unchanged file (the same as in version 1) while version 2 holds every one of those ids again."""
    cat, v1, v2 = two_versions
    replaced = [f for f in v1.files if f.key not in {g.key for g in v2.files}]
    assert sum(f.rows for f in replaced) == 50
    planted = replace(v2, files=[*v2.files, *replaced])
    for proven in (None, v1):
        ok, meta = check_primary_keys_unique(cat, planted, proven=proven)
        assert not ok and meta["duplicates"] == 50, meta


def test_a_changed_file_whose_recorded_range_misses_its_keys_fails_the_check(two_versions) -> None:
    cat, v1, v2 = two_versions
    changed = scope_since(v2, v1).changed[0]
    narrow = replace(changed, key_range=KeyRange("id", changed.key_range.low, changed.key_range.low))
    lying = replace(v2, files=[narrow if f.key == changed.key else f for f in v2.files])
    ok, meta = check_primary_keys_unique(cat, lying, proven=v1)
    assert not ok and "outside its recorded range" in meta["key range problems"]


def test_a_proof_from_a_later_or_differently_keyed_version_is_not_used(two_versions) -> None:
    cat, v1, v2 = two_versions
    assert scope_since(v1, v2).proven is None  # a "proof" newer than the version checked
    assert scope_since(v2, replace(v1, primary_keys=["v"])).proven is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.integers(0, 299), min_size=1, max_size=60), min_size=1, max_size=3),
       plant=st.booleans())
def test_incremental_and_full_checks_agree_with_a_python_model(tmp_path_factory, batches, plant) -> None:
    """Random upserts compacted one batch at a time: each version checked against its predecessor agrees with
    the full check and with a set of ids; a planted copy of a predecessor's file is found either way."""
    cat = Catalog(tmp_path_factory.mktemp("scope") / "lake")
    cat.append(TABLE, (), "upsert", [_rows(list(range(0, 300, 3)), ts=0)])
    versions = [_compact(cat)]
    live = set(range(0, 300, 3))
    for ts, ids in enumerate(batches, start=1):
        cat.append(TABLE, (), "upsert", [_rows(ids, ts)])
        versions.append(_compact(cat))
        live |= set(ids)
        current, before = versions[-1], versions[-2]
        full_ok, full = check_primary_keys_unique(cat, current)
        inc_ok, inc = check_primary_keys_unique(cat, current, proven=before)
        assert full_ok and inc_ok and full["rows read"] == len(live) == current.rows
        assert inc["rows read"] <= full["rows read"]
        if plant:
            gone = [f for f in before.files if f.key not in {g.key for g in current.files}]
            planted = replace(current, files=[*current.files, *gone])
            dup_ids = set()
            for f in gone:
                dup_ids |= set(cat.read_live(f, ["id"]).column("id").to_pylist())
            expected = len(dup_ids)  # every id of a replaced file lives on in the current version
            assert check_primary_keys_unique(cat, planted)[1]["duplicates"] == expected
            assert check_primary_keys_unique(cat, planted, proven=before)[1]["duplicates"] == expected


def _pk_check(result, name: str = "primary_keys_unique") -> dict:
    (evaluation,) = [e.event_specific_data for e in result.all_events if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
                     and e.event_specific_data.check_name == name]
    assert evaluation.passed
    return {k: v.value for k, v in evaluation.metadata.items()}


def _run(defs, instance):
    instance.add_dynamic_partitions("orders__streams", ["!"])
    return defs.resolve_job_def("compact_orders").execute_in_process(partition_key="!", instance=instance)


def test_a_run_builds_on_the_check_its_predecessor_passed_but_not_on_another_lakes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("assets.check_scope.PROOF_MIN_BYTES", 0)  # this lake is tiny: look for proofs anyway
    lake = tmp_path / "lake"
    config = ONE_TABLE.replace("    hash_buckets: 2\n", "    hash_buckets: 2\n    rows_per_file: 50\n    rows_per_index_file: 25\n")
    assert "rows_per_file: 50" in config
    defs = build_definitions(write_config(tmp_path, config), str(lake))
    instance = DagsterInstance.ephemeral()
    cat = Catalog(lake)
    cat.append(TABLE, (), "upsert", [_rows(list(range(400)), ts=1)])
    run = _run(defs, instance)
    first, intact = _pk_check(run), _pk_check(run, "files_intact")
    assert first["proven version"] == "none: every file read" and first["rows read"] == 400
    assert intact["proven version"] == "none: every file read" and "not read" not in intact["summary"]
    cat.append(TABLE, (), "upsert", [_rows([5, 6], ts=2)])
    run = _run(defs, instance)
    second, intact = _pk_check(run), _pk_check(run, "files_intact")
    assert second["proven version"] == 1 and second["compacted version"] == 2
    assert intact["proven version"] == 1 and "unchanged since a version verified before: not read" in intact["summary"]
    assert second["version committed at"] == Catalog(lake).latest_compacted("T.ORDERS_COMPACTED", ()).created_at
    # another lake at the same path, two versions made outside Dagster: its version 2 is not the one the
    # instance's record vouches for (another commit time), so the run's version 3 is checked in full
    import shutil

    shutil.rmtree(lake)
    cat = Catalog(lake)
    for ts, ids in ((1, list(range(400))), (3, [7])):
        cat.append(TABLE, (), "upsert", [_rows(ids, ts=ts)])
        compact(TABLE, ["id"], [("ts", "ascending")], catalog=cat, destination_compacted_table_id="T.ORDERS_COMPACTED",
                hash_bucket_count=2, executor="in-process")
    cat.append(TABLE, (), "upsert", [_rows([8], ts=4)])
    run = _run(defs, instance)
    third, intact = _pk_check(run), _pk_check(run, "files_intact")
    assert third["compacted version"] == 3 and third["proven version"] == "none: every file read"
    assert intact["proven version"] == "none: every file read"
    # a small version is read whole without looking: a look-up would cost more than the reading
    monkeypatch.setattr("assets.check_scope.PROOF_MIN_BYTES", 16 << 20)
    cat.append(TABLE, (), "upsert", [_rows([9], ts=5)])
    assert _pk_check(_run(defs, instance))["proven version"] == "none: every file read"


def test_the_pointer_check_reads_the_index_files_a_version_wrote_first_and_finds_a_bad_one(two_versions, monkeypatch) -> None:
    """One index file version 2 wrote, with every digest flipped: found whatever the seed, reading at most 8 of
    its index files."""
    from assets.checks import INDEX_FILES_SAMPLED, check_index_pointers
    from flash_pipeline.compactor.index import pk_index

    monkeypatch.setattr("assets.check_scope.PROOF_MIN_BYTES", 0)  # a tiny lake: look at the previous version anyway
    cat, v1, v2 = two_versions
    assert check_index_pointers(cat, v2)[0]
    old = {f.key for files in v1.index.buckets for f in files}
    flat = [(b, f) for b, files in enumerate(v2.index.buckets) for f in files]
    assert len(flat) > INDEX_FILES_SAMPLED
    b, new_file = next((b, f) for b, f in flat if f.key not in old and f.rows)
    rows = pk_index.file_rows(cat.storage.read(new_file.key), new_file, v2.index.sort_key_width).copy()
    rows["digest"] = [bytes(20 - len(d)) + bytes(x ^ 0xFF for x in d) for d in rows["digest"]]
    bad_key = new_file.key + ".bad"
    cat.storage.write_data(bad_key, rows.tobytes())
    buckets = [list(files) for files in v2.index.buckets]
    buckets[b] = [replace(f, key=bad_key) if f.key == new_file.key else f for f in buckets[b]]
    broken = replace(v2, index=replace(v2.index, buckets=buckets))
    for seed in range(10):
        ok, meta = check_index_pointers(cat, broken, seed=seed)
        assert not ok and "holds another primary key" in meta["first problems"], meta
