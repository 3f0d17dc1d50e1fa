"""Inside one compaction job each version manifest is fetched once, and a present Delta commit is asked for
once (Catalog.immutable_facts_read_once); the memory ends with the job, so a lake recreated at the same address
is read afresh."""

from __future__ import annotations

import shutil
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.storage import LocalStorage

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.float64())])
COLUMNS = ["k", "ts", "v"]


def _delta(rng: np.random.Generator, step: int) -> pa.Table:
    n = int(rng.integers(3, 12))
    return pa.table({"k": rng.integers(0, 30, n), "ts": np.full(n, step), "v": rng.random(n)}, schema=SCHEMA)


def _counting(monkeypatch: Any) -> Counter:
    """Reads and existence checks of the local storage, by key (the real methods, counted on the way)."""
    calls: Counter = Counter()
    read, exists = LocalStorage.read, LocalStorage.exists

    def counted_read(self: LocalStorage, key: str) -> bytes:
        calls[("read", key)] += 1
        return read(self, key)

    def counted_exists(self: LocalStorage, key: str) -> bool:
        calls[("exists", key)] += 1
        return exists(self, key)

    monkeypatch.setattr(LocalStorage, "read", counted_read)
    monkeypatch.setattr(LocalStorage, "exists", counted_exists)
    return calls


def test_one_job_fetches_each_manifest_and_delta_commit_once(lake: Catalog, monkeypatch: Any) -> None:
    rng = np.random.default_rng(5)
    log = DeltaLog(lake, "M.T", (), SCHEMA)
    for step in range(3):
        log.append("upsert", [_delta(rng, step)])
        run_compact(lake, "M.T", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    log.append("upsert", [_delta(rng, 3)])
    calls = _counting(monkeypatch)
    run_compact(lake, "M.T", None, None)
    manifests = {key: n for (op, key), n in calls.items() if op == "read" and "/compacted/versions/" in key}
    assert manifests and max(manifests.values()) == 1, manifests
    present = {key: n for (op, key), n in calls.items() if op == "exists" and "/_delta_log/" in key and lake.storage.exists(key)}
    assert present and max(present.values()) == 1, present
    assert lake._immutable_memo is None, "the memory must end with the job"
    assert rows_of(read_compacted(lake, "M.T", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)


def test_a_lake_recreated_at_the_same_address_is_read_afresh(lake: Catalog) -> None:
    """One long-lived catalog (a Dagster resource holds one): the lake is deleted and rebuilt with other rows
    between two jobs; the second job must plan on the new lake's manifests, not remembered ones."""
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        log = DeltaLog(lake, "M.R", (), SCHEMA)
        for step in range(2):
            log.append("upsert", [_delta(rng, step)])
            run_compact(lake, "M.R", ["k"], [("ts", "ascending")], hash_bucket_count=2)
        want = rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)
        assert rows_of(read_compacted(lake, "M.R", ()), COLUMNS) == want
        shutil.rmtree(lake.storage.root)


def _counting_listings(monkeypatch: Any) -> list[str]:
    """Prefixes the local storage listed (the real method, recorded on the way)."""
    listed: list[str] = []
    list_children = LocalStorage.list_children

    def counted(self: LocalStorage, prefix: str, *args: Any, **kwargs: Any) -> Any:
        listed.append(prefix)
        return list_children(self, prefix, *args, **kwargs)

    monkeypatch.setattr(LocalStorage, "list_children", counted)
    return listed


def test_planning_lists_the_destination_versions_once(lake: Catalog, monkeypatch: Any) -> None:
    """plan_session reads the number it commits after and the newest version to plan on from one listing
    (Catalog.versions_listed_once): one LIST request on S3 instead of two; the result is unchanged."""
    import flash_pipeline.compactor.job as job

    rng = np.random.default_rng(9)
    log = DeltaLog(lake, "M.L", (), SCHEMA)
    for step in range(2):
        log.append("upsert", [_delta(rng, step)])
        run_compact(lake, "M.L", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    log.append("upsert", [_delta(rng, 2)])
    listed = _counting_listings(monkeypatch)
    during: list[list[str]] = []
    plan = job.plan_session

    def planning(*args: Any, **kwargs: Any) -> Any:
        first = len(listed)
        try:
            return plan(*args, **kwargs)
        finally:
            during.append(listed[first:])

    monkeypatch.setattr(job, "plan_session", planning)
    run_compact(lake, "M.L", None, None)
    assert len(during) == 1
    versions = [p for p in during[0] if p.endswith("/compacted/versions")]
    assert len(versions) == 1, during[0]
    assert lake.compacted_versions("M.L", ()) == [1, 2, 3]
    assert rows_of(read_compacted(lake, "M.L", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)


def test_a_listing_snapshot_belongs_to_its_thread(lake: Catalog) -> None:
    """A snapshot taken on one thread must not answer another thread's planner: here a compaction on another
    thread commits after this thread's snapshot, and a third one, later, must plan on that commit (a shared
    snapshot would make it commit on a taken number and re-plan on the same stale answer)."""
    import threading

    rng = np.random.default_rng(11)
    log = DeltaLog(lake, "M.S", (), SCHEMA)
    log.append("upsert", [_delta(rng, 0)])
    run_compact(lake, "M.S", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    errors: list[BaseException] = []
    seen: list[list[int]] = []

    def compact_on_a_thread(step: int) -> None:
        try:
            log.append("upsert", [_delta(rng, step)])
            run_compact(lake, "M.S", None, None)
            seen.append(lake.compacted_versions("M.S", ()))  # outside any block on this thread: listed afresh
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with lake.versions_listed_once():
        assert lake.compacted_versions("M.S", ()) == [1]
        for step in (1, 2):
            t = threading.Thread(target=compact_on_a_thread, args=(step,))
            t.start()
            t.join()
        assert not errors, errors
        assert seen == [[1, 2], [1, 2, 3]]
        assert lake.compacted_versions("M.S", ()) == [1]  # this thread's snapshot
    assert lake.compacted_versions("M.S", ()) == [1, 2, 3]  # the block's end: listed afresh
    assert rows_of(read_compacted(lake, "M.S", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)


def test_the_attempt_sweep_lists_the_versions_once_and_spares_a_number_taken_during_it(lake: Catalog, monkeypatch: Any) -> None:
    """Retention's sweep (remove_orphan_attempts) reads the taken numbers and the live versions from one listing.
    A compaction that commits while the sweep reads manifests takes a number the listing did not show: the sweep
    must leave that commit's folders alone (and the old orphan it came for is still removed)."""
    from flash_pipeline.catalog.commits import attempt_roots, remove_orphan_attempts
    from flash_pipeline.catalog.validation import VERSION_DIGITS

    rng = np.random.default_rng(5)
    log = DeltaLog(lake, "M.O", (), SCHEMA)
    for step in range(3):
        log.append("upsert", [_delta(rng, step)])
        run_compact(lake, "M.O", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    orphan = f"{attempt_roots(lake, 'M.O', ())['data']}/{2:0{VERSION_DIGITS}d}-{'d' * 12}"
    lake.storage.write(f"{orphan}/000001.parquet", b"never committed")
    log.append("upsert", [_delta(rng, 3)])
    listed = _counting_listings(monkeypatch)
    real = Catalog.compacted_version
    raced: list[int] = []  # the listings the compaction inside made

    def read_while_another_commits(self: Catalog, table_id: str, partition: Any, version: int) -> Any:
        if not raced:  # the first manifest the sweep reads: a compaction commits version 4 meanwhile
            raced.append(len(listed))
            monkeypatch.setattr(Catalog, "compacted_version", real)  # the compaction reads as usual
            run_compact(lake, "M.O", None, None)
            raced[0] = len([p for p in listed[raced[0]:] if p.endswith("/compacted/versions")])
        return real(self, table_id, partition, version)

    monkeypatch.setattr(Catalog, "compacted_version", read_while_another_commits)
    first = len(listed)
    removed = remove_orphan_attempts(lake, "M.O", ())
    sweep_listings = [p for p in listed[first:] if p.endswith("/compacted/versions")]
    monkeypatch.setattr(Catalog, "compacted_version", real)
    assert lake.compacted_versions("M.O", ()) == [1, 2, 3, 4]
    # the compaction inside lists on its own thread's terms; the sweep itself listed once
    assert raced and len(sweep_listings) - raced[0] == 1, listed[first:]
    assert removed == [f"data/{orphan.rsplit('/', 1)[1]}"]
    for f in real(lake, "M.O", (), 4).files:  # the commit made during the sweep lost nothing
        assert lake.storage.exists(f.key), f.key
    assert rows_of(read_compacted(lake, "M.O", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)
