"""The optimistic commit of compacted versions (flash_pipeline/catalog/commits.py, Catalog.commit_compacted).

* a version number, once taken, is never free again (retention expires versions but keeps their manifests);
* a commit's outcome is decided by reading back, not by the exception: a create whose response was lost after
  the store applied it counts as committed, and its files stay;
* a commit whose outcome cannot be told keeps every file of its attempt (exit 1); a later run that takes the
  version number removes them;
* two sessions planned on the same base: the second commits after re-planning on the first, never over it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.storage import LocalStorage
from flash_pipeline.retention import retain
from flash_pipeline.errors import CommitOutcomeUnknown

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.float64())])
COLUMNS = ["k", "ts", "v"]


def _delta(rng: np.random.Generator, rows: int = 30) -> pa.Table:
    return pa.table({"k": rng.integers(0, 40, rows), "ts": rng.integers(0, 9, rows), "v": rng.random(rows)}, schema=SCHEMA)


def _equal_to_oracle(lake: Catalog, table: str, log: DeltaLog) -> None:
    got = rows_of(read_compacted(lake, table, ()), COLUMNS)
    assert got == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)


def test_an_expired_version_number_can_never_be_committed_again(lake: Catalog) -> None:
    rng = np.random.default_rng(1)
    log = DeltaLog(lake, "C.EXP", (), SCHEMA)
    for _ in range(4):
        log.append("upsert", [_delta(rng)])
        run_compact(lake, "C.EXP", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    first = lake.compacted_version("C.EXP", (), 1)
    (res,) = retain(lake, "C.EXP", keep_last=2)
    assert res.deleted_versions == [1, 2] and lake.compacted_versions("C.EXP", ()) == [3, 4]
    assert lake.taken_versions("C.EXP", ()) == [1, 2, 3, 4]
    # a writer that read version 0 as its base long ago tries to commit version 1 now: refused
    assert not lake.commit_compacted(first.replace(commit_id="stale-writer"))
    assert lake.latest_compacted("C.EXP", ()).version == 4
    _equal_to_oracle(lake, "C.EXP", log)


def test_a_commit_whose_response_was_lost_is_decided_by_reading_back(lake: Catalog, monkeypatch: Any) -> None:
    rng = np.random.default_rng(2)
    log = DeltaLog(lake, "C.LOST", (), SCHEMA)
    log.append("upsert", [_delta(rng)])
    original = LocalStorage.create
    lost: list[str] = []

    def create_then_lose_the_answer(self: LocalStorage, key: str, data: bytes) -> bool:
        created = original(self, key, data)
        if "/compacted/versions/" in key and not lost:
            lost.append(key)
            raise ConnectionResetError("connection reset by peer (the store applied the request)")
        return created

    monkeypatch.setattr(LocalStorage, "create", create_then_lose_the_answer)
    result = run_compact(lake, "C.LOST", ["k"], [("ts", "ascending")], hash_bucket_count=2, rows_per_compacted_file=7)
    assert lost and result.partitions[0].compacted_version == 1
    cv = lake.latest_compacted("C.LOST", ())
    for f in list(cv.files) + [f for b in cv.index.buckets for f in b]:
        assert lake.storage.exists(f.key), f"the committed version's file {f.key} was deleted"
    _equal_to_oracle(lake, "C.LOST", log)


def test_a_commit_of_unknown_outcome_keeps_its_files_until_the_number_is_taken(lake: Catalog, monkeypatch: Any) -> None:
    rng = np.random.default_rng(3)
    log = DeltaLog(lake, "C.UNK", (), SCHEMA)
    log.append("upsert", [_delta(rng)])
    original = LocalStorage.create

    def create_without_an_answer(self: LocalStorage, key: str, data: bytes) -> bool:
        if "/compacted/versions/" in key:
            raise TimeoutError("read timeout: no answer from the store")
        return original(self, key, data)

    monkeypatch.setattr(LocalStorage, "create", create_without_an_answer)
    with pytest.raises(CommitOutcomeUnknown, match="its files are kept") as err:
        run_compact(lake, "C.UNK", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    assert err.value.exit_code == 1
    kept = [k for k in lake.listing() if "/compacted/data/" in k or "/compacted/index/" in k]
    assert kept, "the attempt's files must stay: the commit may still land"
    assert lake.compacted_versions("C.UNK", ()) == []
    monkeypatch.setattr(LocalStorage, "create", original)
    run_compact(lake, "C.UNK", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    # version 1 is now taken by the rerun: the earlier attempt can never commit, so its folder is gone
    assert not set(kept) & set(lake.listing())
    _equal_to_oracle(lake, "C.UNK", log)


def test_a_session_whose_base_moved_replans_and_commits_after_the_winner(lake: Catalog, monkeypatch: Any) -> None:
    rng = np.random.default_rng(4)
    log = DeltaLog(lake, "C.MOVE", (), SCHEMA)
    log.append("upsert", [_delta(rng)])
    run_compact(lake, "C.MOVE", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    log.append("upsert", [_delta(rng)])
    original = Catalog.commit_compacted
    rival: list[int] = []
    racing: list[bool] = []

    def rival_first(self: Catalog, version: Any, **kw: Any) -> bool:
        if not racing:  # another compaction (with one more delta) commits just before this session does
            racing.append(True)
            log.append("upsert", [_delta(rng)])
            rival.append(run_compact(self, "C.MOVE", None, None).partitions[0].compacted_version)
        return original(self, version, **kw)

    lines: list[str] = []
    monkeypatch.setattr(Catalog, "commit_compacted", rival_first)
    result = run_compact(lake, "C.MOVE", None, None, progress=lines.append)
    # the rival compacted every delta: re-planned on it, this session found nothing left to do
    assert rival == [2] and result.partitions[0].status == "up-to-date"
    assert any("re-planning on version 2" in line for line in lines), lines
    assert lake.compacted_versions("C.MOVE", ()) == [1, 2]
    _equal_to_oracle(lake, "C.MOVE", log)


def test_retain_vacuums_dead_attempts_only_once_their_version_number_is_taken(lake: Catalog) -> None:
    rng = np.random.default_rng(5)
    log = DeltaLog(lake, "C.VAC", (), SCHEMA)
    log.append("upsert", [_delta(rng)])
    run_compact(lake, "C.VAC", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    base = lake.compacted_prefix("C.VAC", ())
    dead = f"{base}/data/0000000001-deadbeef0001/000001.parquet"  # a writer that lost version 1 and died
    in_flight = f"{base}/data/0000000002-cafe00000002/000001.parquet"  # version 2 is still free: maybe in flight
    for key in (dead, in_flight):
        lake.storage.write(key, b"not yet referenced")
    before = set(lake.listing())
    (res,) = retain(lake, "C.VAC", keep_last=5)
    assert res.deleted_versions == [] and res.removed_attempts == ["data/0000000001-deadbeef0001"]
    assert set(lake.listing()) == before - {dead}
    _equal_to_oracle(lake, "C.VAC", log)


def test_an_append_whose_manifest_create_lands_late_keeps_its_files(lake: Catalog, monkeypatch: Any) -> None:
    """An append's manifest create fails without an answer and the read-back finds nothing yet; the request lands
    afterwards (a delayed request, as a commit of unknown outcome may). The append must not have deleted its
    files: the late delta is then a whole one that verify accepts and compaction merges (its files were deleted
    before, so every compaction of the partition failed)."""
    from flash_pipeline.verify import verify

    rng = np.random.default_rng(4)
    log = DeltaLog(lake, "C.LATE", (), SCHEMA)
    log.append("upsert", [_delta(rng)])
    original = LocalStorage.create
    in_flight: list[tuple[str, bytes]] = []

    def lose_the_request_for_now(self: LocalStorage, key: str, data: bytes) -> bool:
        if "/deltas/" in key and not in_flight:
            in_flight.append((key, data))
            raise ConnectionResetError("connection reset by peer (the request is still on its way)")
        return original(self, key, data)

    monkeypatch.setattr(LocalStorage, "create", lose_the_request_for_now)
    late = _delta(rng)
    with pytest.raises(ConnectionResetError):
        lake.append("C.LATE", (), "upsert", [late])
    monkeypatch.setattr(LocalStorage, "create", original)
    (key, data), = in_flight
    assert original(lake.storage, key, data)  # the request lands now
    from compaction_helpers import FILE, OP, POS, ROW

    log.records += [{**row, POS: 2, FILE: 1, ROW: i, OP: "upsert"} for i, row in enumerate(late.to_pylist())]
    assert lake.delta_positions("C.LATE", (), 1) == [1, 2]
    assert verify(lake, "C.LATE").ok
    run_compact(lake, "C.LATE", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    _equal_to_oracle(lake, "C.LATE", log)


def test_a_commit_whose_iceberg_publication_fails_is_published_once_and_recorded_in_the_feed(
        lake: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The create and the publication shared one try: a publication failing after the create counted as a failed
    create, so the version was read back, published a second time, and its change record was never written (the
    sensor and ``auto --changes-since`` missed the commit; found by a review). The version is committed: exit 1
    with the line saying so, one publication attempt, the feed records it, and the next commit publishes it."""
    from flash_pipeline.catalog.iceberg_table import IcebergPublicationPending

    rng = np.random.default_rng(5)
    log = DeltaLog(lake, "C.PUB", (), SCHEMA)
    log.append("upsert", [_delta(rng)])
    calls: list[int] = []

    def failing(self: Catalog, version: Any) -> None:
        calls.append(version.version)
        raise ValueError("catalog unreachable")

    monkeypatch.setattr(Catalog, "publish_iceberg", failing)
    with pytest.raises(IcebergPublicationPending, match="is committed but its Iceberg snapshot failed"):
        run_compact(lake, "C.PUB", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    assert calls == [1] and lake.compacted_versions("C.PUB", ()) == [1]
    assert [c.kind for c in lake.changes.read("C.PUB")].count("compacted") == 1
    monkeypatch.undo()
    log.append("upsert", [_delta(rng)])
    run_compact(lake, "C.PUB", None, None)
    assert lake.iceberg_versions("C.PUB", ()) == [1, 2]
