"""The change feed (flash_pipeline/catalog/changes.py): every commit that creates work or changes what a reader
shows leaves one record, in order, with no gaps; a reader from any position gets exactly what followed it, in a
number of requests that follows what changed, not the table's size; concurrent writers never share or skip a
number; a crash between a commit and its record leaves the commit without a record, never the reverse."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import catalog_env
from benchmarks.storage_requests import count_requests
from flash_pipeline.catalog import changes as changes_module
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import CompactedVersion


def _rows(keys: list[int], day: str = "d1") -> pa.Table:
    return pa.table({"id": pa.array(keys, pa.int64()), "day": [day] * len(keys), "ts": pa.array(keys, pa.int64())})


def _compacted(table: str, part: tuple, version: int, source: str, last: int) -> CompactedVersion:
    return CompactedVersion(table, part, version, source, 1, last, ("id",), (("ts", "ascending"),), ContentType.PARQUET,
                            (), None, (), f"c{version}", time.time())


def test_every_commit_leaves_one_record_in_order(any_lake: Catalog) -> None:
    cat = any_lake
    d1 = cat.append("F.T", {"day": "d1"}, "upsert", [_rows([1, 2])])
    d2 = cat.append("F.T", {"day": "d2"}, "upsert", [_rows([3], "d2"), _rows([4], "d2")])
    d3 = cat.append("F.T", {"day": "d1"}, "delete", [_rows([1]).select(["id"])])
    cat.commit_compacted(_compacted("F.T", (("day", "d1"),), 1, "F.T", 2))
    d4 = cat.append("F.T", {"day": "d1"}, "upsert", [_rows([5])])
    assert cat.skip_delta("F.T", {"day": "d1"}, d4.position)
    cat.unskip_delta("F.T", {"day": "d1"}, d4.position)
    cat.commit_compacted(_compacted("F.OUT", (("day", "d2"),), 1, "F.T", 1))  # into another table: its own feed

    records = cat.changes.read("F.T")
    assert [r.seq for r in records] == list(range(1, 8))
    assert [(r.kind, r.partition, r.position) for r in records] == [
        ("delta", (("day", "d1"),), d1.position), ("delta", (("day", "d2"),), d2.position),
        ("delta", (("day", "d1"),), d3.position), ("compacted", (("day", "d1"),), 2),
        ("delta", (("day", "d1"),), d4.position), ("skip", (("day", "d1"),), d4.position),
        ("unskip", (("day", "d1"),), d4.position),
    ]
    assert records[1].details["files"] == 2 and records[1].details["rows"] == 2 and records[1].details["bytes"] == d2.bytes
    assert records[2].details["operation"] == "delete" and records[2].details["commit_id"] == d3.commit_id
    assert records[3].details["version"] == 1 and records[3].details["source_table_id"] == "F.T"
    (out,) = cat.changes.read("F.OUT")
    assert out.kind == "compacted" and out.details["source_table_id"] == "F.T" and out.position == 1
    # a reader from any position gets exactly the rest; the head is the last number
    for after in range(0, 8):
        assert [r.seq for r in cat.changes.read("F.T", after)] == list(range(after + 1, 8))
    assert cat.changes.head("F.T") == 7 and cat.changes.head("F.NONE") == 0
    assert cat.table_metadata("F.T")["changes_recorded"] is True


def test_a_refused_append_and_a_lost_commit_race_leave_no_record(lake: Catalog) -> None:
    from flash_pipeline.errors import FlashError

    lake.append("F.T", {}, "upsert", [_rows([1])])
    with pytest.raises(FlashError):
        lake.append("F.T", {}, "upsert", [pa.table({"id": ["not a number"]})])  # a string into an integer column
    assert lake.commit_compacted(_compacted("F.T", (), 1, "F.T", 1))
    assert not lake.commit_compacted(_compacted("F.T", (), 1, "F.T", 1).replace(commit_id="loser"))
    assert [r.kind for r in lake.changes.read("F.T")] == ["delta", "compacted"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segment=st.integers(2, 7), hint_every=st.integers(1, 5), records=st.integers(1, 40), data=st.data())
def test_segments_and_hints_never_change_what_a_reader_gets(tmp_path_factory, monkeypatch, segment, hint_every, records, data) -> None:
    """Records cross segment folders and the writers' hint lags behind: a reader from any position still gets
    every later record exactly once, in order (against a plain list of what was written)."""
    monkeypatch.setattr(changes_module, "SEGMENT_SIZE", segment)
    monkeypatch.setattr(changes_module, "HINT_EVERY", hint_every)
    cat = Catalog(tmp_path_factory.mktemp("feed"))
    written = [cat.changes.append("F.T", "delta", (("p", str(i % 3)),), 1, i + 1, files=1) for i in range(records)]
    assert written == list(range(1, records + 1))
    after = data.draw(st.integers(0, records))
    limit = data.draw(st.integers(1, records + 2))
    got = cat.changes.read("F.T", after, limit)
    assert [r.seq for r in got] == list(range(after + 1, min(records, after + limit) + 1))
    assert [r.position for r in got] == [s for s in range(after + 1, min(records, after + limit) + 1)]
    assert cat.changes.head("F.T") == records


def test_concurrent_writers_take_distinct_consecutive_numbers(any_lake: Catalog) -> None:
    """Threads appending to many partitions of one table at once: one record per delta, numbers 1..N."""
    cat = any_lake
    n_threads, per_thread = 6, 5
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(per_thread):
                cat.append("F.T", {"day": f"d{t}-{i % 2}"}, "upsert", [_rows([t * 100 + i])])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    records = cat.changes.read("F.T")
    assert [r.seq for r in records] == list(range(1, n_threads * per_thread + 1))
    committed = {(p, d.position) for p in cat.partitions("F.T") for d in cat.deltas("F.T", p)}
    assert {(r.partition, r.position) for r in records} == committed
    assert len(committed) == n_threads * per_thread


def test_an_idle_read_costs_one_request_whatever_the_table_holds(any_lake: Catalog) -> None:
    """On S3 a reader lists what follows its position (StartAfter); on a local disk it looks for the next key
    (a stat, where a listing would read the whole segment folder)."""
    cat = any_lake
    for i in range(30):
        cat.append("F.T", {"day": f"d{i}"}, "upsert", [_rows([i])])
    head = cat.changes.head("F.T")
    with count_requests() as calls:
        assert cat.changes.read("F.T", head) == []
    assert sum(calls.values()) == 1, calls
    cat.append("F.T", {"day": "d3"}, "upsert", [_rows([99])])
    with count_requests() as calls:
        (new,) = cat.changes.read("F.T", head)
    assert new.partition == (("day", "d3"),)
    local = cat.storage.probes_are_cheap
    if local:
        assert dict(calls) == {"exists": 2, "read": 1}, calls
    else:  # one listing, one GET of the record
        assert calls["list_objects_v2"] == 1 and sum(calls.values()) == 2, calls


def test_a_crash_between_the_commit_and_its_record_leaves_the_commit_and_no_record(any_lake: Catalog, tmp_path) -> None:
    """kill -9 at ``feed:before_record``: the delta is committed (the lake's truth) and unrecorded; the next writer's
    record is written at the next number, as usual (the sensors' reconciliation finds the unrecorded one)."""
    cat = any_lake
    cat.append("F.T", {"day": "d1"}, "upsert", [_rows([1])])
    data = tmp_path / "rows.parquet"
    import pyarrow.parquet as pq

    pq.write_table(_rows([2]), data)
    env = catalog_env(cat) | {"FLASH_CRASH_AT": "feed:before_record"}
    code = ("import sys; from flash_pipeline.catalog.catalog import Catalog; "
            "Catalog(sys.argv[1]).append('F.T', {'day': 'd1'}, 'upsert', [sys.argv[2]])")
    proc = subprocess.run([sys.executable, "-c", code, cat.uri, str(data)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert [d.position for d in cat.deltas("F.T", (("day", "d1"),))] == [1, 2]
    assert [r.position for r in cat.changes.read("F.T")] == [1]
    cat.append("F.T", {"day": "d1"}, "upsert", [_rows([3])])
    assert [(r.seq, r.position) for r in cat.changes.read("F.T")] == [(1, 1), (2, 3)]
