"""Transient S3 faults between the client and the endpoint never lose or half-register a delta.

A small threaded HTTP proxy on 127.0.0.1 sits between boto3 and the moto server. On a deterministic, seeded
schedule it answers some requests itself with 503 SlowDown or 500 InternalError, or closes the connection
without a response, either before forwarding the request or AFTER forwarding it (the write reached the store
but the client never hears so). Conditional creates of delta manifests get a higher fault rate, so a retried
``If-None-Match`` put that finds its own first attempt committed (412) is exercised.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.s3 import S3Storage
from flash_pipeline.compactor.runtime.cluster import ensure_ray
from flash_pipeline.errors import FlashError

from _fault_proxy import ACTIONS, FaultProxy
from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from conftest import BUCKET, REPO, fresh_bucket


@pytest.fixture
def faulty(moto_endpoint: str) -> Iterator[tuple[FaultProxy, str]]:
    with FaultProxy(moto_endpoint, seed=20240611, rate=0.1, conditional_rate=0.5) as proxy:
        yield proxy, f"s3://{fresh_bucket(moto_endpoint)}/faults-{uuid.uuid4().hex[:10]}"


def check_lake(catalog: Catalog, table: str, part: tuple, n_deltas: int, expected: set[tuple[int, int]]) -> None:
    deltas = catalog.deltas(table, part)
    assert [d.position for d in deltas] == list(range(1, n_deltas + 1))
    assert len({d.commit_id for d in deltas}) == len(deltas)
    seen = []
    for d in deltas:
        for f in d.files:
            assert catalog.storage.size(f.key) == f.bytes  # every file of a visible delta is whole
            seen.extend((r["writer"], r["seq"]) for r in catalog.read_file(f).to_pylist())
    assert sorted(seen) == sorted(expected)
    referenced = {f.key for d in deltas for f in d.files}
    assert {k for k in catalog.listing() if "/files/" in k} == referenced


def one_row(writer: int, seq: int) -> pa.Table:
    return pa.table({"writer": pa.array([writer], pa.int64()), "seq": pa.array([seq], pa.int64())})


def test_appends_survive_injected_faults(faulty: tuple[FaultProxy, str], moto_endpoint: str) -> None:
    proxy, uri = faulty
    catalog = Catalog(uri, endpoint_url=proxy.endpoint)
    part = (("Order Day", "1995-04-03"),)
    n = 6
    for seq in range(n):
        delta = catalog.append("ACME.FAULTS.V1", part, "upsert", [one_row(0, seq), one_row(1, seq)])
        assert delta.position == seq + 1

    # faults were really injected, of every kind, including a lost answer to a manifest create
    actions = {e["action"] for e in proxy.log}
    assert set(ACTIONS) <= actions, actions
    manifests = [e for e in proxy.log if e["conditional"] and "/deltas/" in e["path"]]
    lost = [e for e in manifests if e["action"] in ("drop_after", "error_after") and e["status"] == 200]
    assert lost, "no manifest create lost its answer after reaching the store"
    assert any(e["status"] == 412 for e in manifests), "no retried create found its own manifest (412)"
    print(f"{len(proxy.log)} requests, {sum(e['action'] != 'forward' for e in proxy.log)} faults")

    # an independent client straight to moto sees every delta whole, at distinct positions, nothing extra
    direct = Catalog(uri, endpoint_url=moto_endpoint)
    check_lake(direct, "ACME.FAULTS.V1", part, n, {(w, s) for w in (0, 1) for s in range(n)})


def test_concurrent_appends_survive_injected_faults(faulty: tuple[FaultProxy, str], moto_endpoint: str) -> None:
    proxy, uri = faulty
    part = (("Order Day", "1995-04-04"),)
    writers, per_writer = 3, 4
    catalogs = [Catalog(S3Storage(uri, endpoint_url=proxy.endpoint)) for _ in range(writers)]
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            for seq in range(per_writer):
                catalogs[w].append("ACME.FAULTS.V1", part, "upsert", [one_row(w, seq)])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert sum(e["action"] != "forward" for e in proxy.log) > 0
    check_lake(Catalog(uri, endpoint_url=moto_endpoint), "ACME.FAULTS.V1", part, writers * per_writer, {(w, s) for w in range(writers) for s in range(per_writer)})


# ----- lost responses, outages, options and a missing bucket -------------------------------------------------
# The proxy below (tests/_fault_proxy.py) injects exactly one fault per run at a chosen request, so every
# request an operation makes is covered, not a random sample of them.

PART = (("Order Day", "1995-04-03"),)
VERSION_PUT = r"/compacted/versions/\d+\.json"
EXE = Path(sys.executable).parent / "flash-compactor"
CLI = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "flash_pipeline.cli"]


def fresh_uri(endpoint: str) -> str:
    """A lake in a fresh bucket (conftest.fresh_bucket: moto's listings slow down with every key of a bucket)."""
    return f"s3://{fresh_bucket(endpoint)}/faults-{uuid.uuid4().hex[:10]}"


def shape(entry: dict[str, Any]) -> tuple[str, str]:
    """A request with its lake prefix, commit ids and attempt ids blanked, to compare runs on fresh lakes."""
    path = re.sub(r"t-[0-9a-f]{20}", "BUCKET", re.sub(r"faults-[0-9a-f]{10}", "LAKE", entry["path"]))
    return entry["method"], re.sub(r"[0-9a-f]{12,}", "*", path)


def rows(writer: int, seqs: range) -> pa.Table:
    return pa.table({"writer": pa.array([writer] * len(seqs), pa.int64()), "seq": pa.array(list(seqs), pa.int64())})


def cli_env(endpoint: str) -> dict[str, str]:
    """The CLI's environment: the endpoint to talk to, and no S3 retry settings but those a test sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASH_S3_")}
    env["FLASH_S3_ENDPOINT_URL"] = endpoint
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def bucket_keys(moto_endpoint: str, uri: str) -> list[str]:
    return Catalog(uri, endpoint_url=moto_endpoint).listing()


def test_append_survives_losing_the_response_to_each_request(moto_endpoint: str) -> None:
    """For EVERY request of an append (a dry run counts them), the store applies it and the answer is lost once:
    the delta is still committed exactly once, whole, with the appended rows."""
    with FaultProxy(moto_endpoint) as proxy:

        def run(lose: int | None) -> list[dict[str, Any]]:
            uri = fresh_uri(moto_endpoint)
            direct = Catalog(uri, endpoint_url=moto_endpoint)
            direct.append("ACME.LOST.V1", PART, "upsert", [rows(0, range(3))])  # the stream exists already
            via = Catalog(uri, endpoint_url=proxy.endpoint)
            proxy.reset()
            if lose is not None:
                proxy.lose_response(index=lose)
            delta = via.append("ACME.LOST.V1", PART, "upsert", [rows(1, range(4)), rows(2, range(5))])
            assert delta.position == 2
            expected = {(0, s) for s in range(3)} | {(1, s) for s in range(4)} | {(2, s) for s in range(5)}
            check_lake(direct, "ACME.LOST.V1", PART, 2, expected)
            return list(proxy.log)

        dry = run(None)
        assert any(e["method"] == "PUT" and "/files/" in e["path"] for e in dry)
        assert any(e["conditional"] and "/deltas/" in e["path"] for e in dry)
        t0 = time.monotonic()
        for k in range(len(dry)):
            run(k)
            assert [shape(e) for e in proxy.lost] == [shape(dry[k])], (k, proxy.lost)
            assert proxy.lost[0]["status"] is not None  # moto did answer: the request was applied
        print(f"append: {len(dry)} requests, each answer lost once, {time.monotonic() - t0:.1f}s")


# a small keyed table: colliding keys across deltas, a sort key, a delete delta
SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])
PKS, SORT = ["k"], [("ts", "ascending")]
COLUMNS = ["k", "ts", "v"]


def seed_table(cat: Catalog, table: str, seed: int) -> DeltaLog:
    rng = np.random.default_rng(seed)
    log = DeltaLog(cat, table, PART, SCHEMA)

    def upsert(n: int) -> pa.Table:
        keys = rng.integers(0, 24, n)
        return pa.table({"k": keys, "ts": rng.integers(0, 1000, n), "v": [f"v{x}" for x in rng.integers(0, 99, n)]}, schema=SCHEMA)

    log.append("upsert", [upsert(20), upsert(15)])
    log.append("upsert", [upsert(20)])
    log.append("delete", [pa.table({"k": pa.array(rng.choice(24, 5, replace=False), pa.int64())})])
    log.append("upsert", [upsert(10)])
    return log


def check_compacted(direct: Catalog, table: str, log: DeltaLog) -> None:
    """Every file of the latest compacted version (data and index) is in the bucket at its size; rows = oracle."""
    assert direct.compacted_versions(table, PART) == [1]
    cv = direct.latest_compacted(table, PART)
    assert cv is not None and cv.index is not None
    for f in cv.files:
        assert direct.storage.size(f.key) == f.bytes, f.key
    for files in cv.index.buckets:
        for ix in files:
            assert direct.storage.size(ix.key) == ix.bytes, ix.key
    want = oracle(log.log_table(), PKS, SORT, COLUMNS)
    assert rows_of(read_compacted(direct, table, PART), COLUMNS) == rows_of(want, COLUMNS)


def compact_via(cat: Catalog, table: str) -> Any:
    return run_compact(cat, table, PKS, SORT, hash_bucket_count=2, rows_per_compacted_file=8, rows_per_primary_key_index_file=8)


def test_compaction_commit_survives_losing_the_response_to_each_request(moto_endpoint: str) -> None:
    """From the PUT of the version manifest on (its read-back, the round-completion file, orphan cleanup), each
    request's answer is lost once: every file of the committed version exists and the rows equal the oracle."""
    ensure_ray()
    table = "ACME.LOST_COMPACT.V1"
    with FaultProxy(moto_endpoint) as proxy:

        def run(offset: int | None) -> list[dict[str, Any]]:
            uri = fresh_uri(moto_endpoint)
            direct = Catalog(uri, endpoint_url=moto_endpoint)
            log = seed_table(direct, table, seed=7)
            proxy.reset()
            if offset is not None:
                proxy.lose_response(method="PUT", path=VERSION_PUT, offset=offset)
            compact_via(Catalog(uri, endpoint_url=proxy.endpoint), table)
            check_compacted(direct, table, log)
            return list(proxy.log)

        dry = run(None)
        start = next(i for i, e in enumerate(dry) if e["method"] == "PUT" and re.search(VERSION_PUT, e["path"]))
        tail = [shape(e) for e in dry[start:]]
        assert any("/rounds/" in p for _, p in tail), tail  # the round-completion file comes after the commit
        t0 = time.monotonic()
        for j in range(len(tail)):
            run(j)
            assert [shape(e) for e in proxy.lost] == [tail[j]], (j, proxy.lost, tail)
        print(f"compaction commit: {len(tail)} requests from the manifest PUT on, each answer lost once, {time.monotonic() - t0:.1f}s")


def test_append_and_compaction_ride_out_30s_outages(moto_endpoint: str, tmp_path: Path) -> None:
    """Default settings, two separate 30 s outages (connections refused), run at the same time to save wall time,
    each behind its own proxy: one right after the first data-file PUT of an append by the real CLI, one from the
    first compacted file a Ray task writes during an in-process compaction. Both wait it out; the delta is
    committed whole and the compacted rows equal the oracle."""
    ensure_ray()
    files = []
    for i, t in enumerate([rows(1, range(4)), rows(2, range(6))]):
        pq.write_table(t, tmp_path / f"f{i}.parquet")
        files.append(str(tmp_path / f"f{i}.parquet"))
    append_uri, compact_uri = fresh_uri(moto_endpoint), fresh_uri(moto_endpoint)
    table = "ACME.OUTAGE_COMPACT.V1"
    direct = Catalog(compact_uri, endpoint_url=moto_endpoint)
    log = seed_table(direct, table, seed=11)
    with FaultProxy(moto_endpoint) as append_proxy, FaultProxy(moto_endpoint) as compact_proxy:
        append_proxy.refuse_for(30, method="PUT", path=r"/files/")
        t0 = time.monotonic()
        proc = subprocess.Popen(
            CLI + ["append", "--catalog", append_uri, "--table", "ACME.OUTAGE.V1", "--partition", "Order Day=1995-04-03",
                   "--op", "upsert", *files],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(append_proxy.endpoint),
        )
        try:
            compact_proxy.refuse_for(30, method="PUT", path=r"/compacted/(data|index)/")
            t1 = time.monotonic()
            compact_via(Catalog(compact_uri, endpoint_url=compact_proxy.endpoint), table)
            compact_seconds = time.monotonic() - t1
            out, err = proc.communicate(timeout=300)
            append_seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        print(f"append (CLI) with a 30s outage took {append_seconds:.1f}s, compaction {compact_seconds:.1f}s")
        assert proc.returncode == 0, err
        assert out.strip() == "1"
        for proxy, committed in [(append_proxy, r"/deltas/"), (compact_proxy, VERSION_PUT)]:
            assert len(proxy.outages) == 1  # the outage really struck mid-operation ...
            assert any(e["time"] > proxy.outages[0][1] and e["method"] == "PUT" and re.search(committed, e["path"])
                       for e in proxy.log)  # ... and the commit came after it
    assert compact_seconds >= 30
    check_lake(Catalog(append_uri, endpoint_url=moto_endpoint), "ACME.OUTAGE.V1", PART, 1,
               {(1, s) for s in range(4)} | {(2, s) for s in range(6)})
    check_compacted(direct, table, log)


def test_s3_retry_options_from_cli_and_environment_are_honoured(moto_endpoint: str, tmp_path: Path) -> None:
    """The endpoint closes every connection: the number of connections the CLI makes is the attempts asked
    for (environment variable, then the option overriding it); it fails fast with one line; nothing written."""
    pq.write_table(rows(1, range(3)), tmp_path / "f.parquet")
    uri = fresh_uri(moto_endpoint)
    Catalog(uri, endpoint_url=moto_endpoint).append("ACME.OPTS.V1", PART, "upsert", [rows(0, range(2))])
    before = bucket_keys(moto_endpoint, uri)
    argv = ["append", "--catalog", uri, "--table", "ACME.OPTS.V1", "--partition", "Order Day=1995-04-03", "--op", "upsert", str(tmp_path / "f.parquet")]
    with FaultProxy(moto_endpoint) as proxy:
        proxy.refuse_for(600, how="close")
        for extra, env_extra, attempts in [
            ([], {"FLASH_S3_MAX_ATTEMPTS": "3", "FLASH_S3_RETRY_DEADLINE": "0"}, 3),
            (["--s3-max-attempts", "1", "--s3-retry-deadline", "0", "--s3-retry-mode", "legacy"], {"FLASH_S3_MAX_ATTEMPTS": "3"}, 1),
            (["--s3-max-attempts", "2", "--s3-retry-deadline", "0", "--s3-connect-timeout", "2", "--s3-read-timeout", "3"], {}, 2),
        ]:
            seen = proxy.connections
            t0 = time.monotonic()
            proc = subprocess.run(CLI + argv + extra, capture_output=True, text=True, env={**cli_env(proxy.endpoint), **env_extra}, timeout=120)
            elapsed = time.monotonic() - t0
            assert proc.returncode in (1, 2), proc
            lines = proc.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("flash-compactor: error: "), proc.stderr
            assert proxy.connections - seen == attempts, (extra, env_extra, proxy.connections - seen)
            assert elapsed < 60, elapsed
        # the outer deadline: one attempt per call, retried until 2 s have passed
        storage = S3Storage(uri, endpoint_url=proxy.endpoint, max_attempts=1, retry_deadline=2)
        seen, t0 = proxy.connections, time.monotonic()
        with pytest.raises(Exception):
            storage.read("tables/x")
        assert 1.0 <= time.monotonic() - t0 < 10 and proxy.connections - seen >= 3
    assert bucket_keys(moto_endpoint, uri) == before


def test_s3_options_resolve_pickle_and_reject_bad_values(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> None:
    """Keyword > FLASH_S3_* variable > default; the resolved options survive pickling (Ray tasks) and reach
    botocore; a bad value is one FlashError naming the option."""
    for name in ("FLASH_S3_RETRY_MODE", "FLASH_S3_MAX_ATTEMPTS", "FLASH_S3_CONNECT_TIMEOUT", "FLASH_S3_READ_TIMEOUT", "FLASH_S3_RETRY_DEADLINE"):
        monkeypatch.delenv(name, raising=False)
    default = S3Storage(f"s3://{BUCKET}/x", endpoint_url=moto_endpoint)
    assert default.options["retry_mode"] == "standard" and default.options["retry_deadline"] > 30
    monkeypatch.setenv("FLASH_S3_RETRY_MODE", "adaptive")
    monkeypatch.setenv("FLASH_S3_MAX_ATTEMPTS", "4")
    monkeypatch.setenv("FLASH_S3_READ_TIMEOUT", "7.5")
    cat = Catalog(f"s3://{BUCKET}/x", endpoint_url=moto_endpoint, max_attempts=6, connect_timeout=1.5, retry_deadline=9)
    want = {"retry_mode": "adaptive", "max_attempts": 6, "connect_timeout": 1.5, "read_timeout": 7.5, "retry_deadline": 9.0}
    monkeypatch.setenv("FLASH_S3_MAX_ATTEMPTS", "2")  # the worker's environment differs: the pickled values win
    for storage in (cat.storage, pickle.loads(pickle.dumps(cat.storage)), pickle.loads(pickle.dumps(cat)).storage):
        assert storage.options == want
        config = storage.client.meta.config
        assert (config.retries["mode"], config.retries["total_max_attempts"]) == ("adaptive", 6)
        assert (config.connect_timeout, config.read_timeout) == (1.5, 7.5)
    for kwargs, needle in [({"retry_mode": "eager"}, "retry_mode"), ({"max_attempts": 0}, "max_attempts"), ({"read_timeout": "soon"}, "read_timeout")]:
        with pytest.raises(FlashError, match=needle):
            S3Storage(f"s3://{BUCKET}/x", endpoint_url=moto_endpoint, **kwargs)
    monkeypatch.setenv("FLASH_S3_CONNECT_TIMEOUT", "-1")
    with pytest.raises(FlashError, match="FLASH_S3_CONNECT_TIMEOUT"):
        S3Storage(f"s3://{BUCKET}/x", endpoint_url=moto_endpoint)


def test_missing_bucket_is_one_line_exit_2(moto_endpoint: str, tmp_path: Path) -> None:
    import boto3

    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    pq.write_table(rows(1, range(2)), tmp_path / "f.parquet")
    env = cli_env(moto_endpoint)
    for argv in (
        ["show", "--catalog", f"s3://{bucket}/x"],
        ["append", "--catalog", f"s3://{bucket}/x", "--table", "ACME.T.V1", "--op", "upsert", str(tmp_path / "f.parquet")],
        ["export", "--catalog", f"s3://{bucket}/x", "--table", "ACME.T.V1", "--out", str(tmp_path / "out")],
    ):
        proc = subprocess.run(CLI + argv, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2, proc
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("flash-compactor: error: "), proc.stderr
        assert repr(bucket) in lines[0] and "create it" in lines[0] and "--catalog" in lines[0], lines[0]
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    assert bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}


def test_planning_many_partitions_overlaps_its_requests_and_stays_right(moto_endpoint: str) -> None:
    """A compaction plans each partition with a dozen small requests (its stream, versions, deltas, housekeeping
    listings); on an object store each waits a round trip. They now overlap across partitions (up to the
    storage's read-ahead), as do the partition records of ``partitions()``: 2,000 partitions planned one after
    another cost a no-op run 2,000 x a dozen round trips (an adversarial run counted 18,455 opens and 24,073
    listings on a local lake). The results are unchanged: every partition compacted once, then up to date."""
    uri = fresh_uri(moto_endpoint)
    direct = Catalog(uri, endpoint_url=moto_endpoint)
    parts = [{"day": str(d)} for d in range(12)]
    for d, part in enumerate(parts):
        direct.append("ACME.MANY.V1", part, "upsert", [pa.table({"id": [d, d + 100], "v": [1, 2]})])
    with FaultProxy(moto_endpoint, latency=0.02) as proxy:
        catalog = Catalog(uri, endpoint_url=proxy.endpoint)
        first = run_compact(catalog, "ACME.MANY.V1", ["id"], None, executor="in-process")
        assert sorted(p.status for p in first.partitions) == ["compacted"] * 12, [p.status for p in first.partitions]
        proxy.reset()
        again = run_compact(catalog, "ACME.MANY.V1", ["id"], None, executor="in-process")
        assert [p.status for p in again.partitions] == ["up-to-date"] * 12
        assert [p.partition for p in again.partitions] == [(("day", str(d)),) for d in sorted(range(12), key=str)]
        assert proxy.max_in_flight > 1, "a no-op run's planning requests went one after another"
    for d, part in enumerate(parts):
        got = read_compacted(direct, "ACME.MANY.V1", (("day", str(d)),))
        assert sorted(got.column("id").to_pylist()) == [d, d + 100]
