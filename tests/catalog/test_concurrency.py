"""Several processes appending to the same partition stream at once get distinct positions and lose nothing."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import catalog_env
from flash_pipeline.catalog.catalog import Catalog

import _workers

PART = [("Order Day", "1995-04-03")]


def check_stream(catalog: Catalog, table: str, expected: set[tuple[int, int]]) -> None:
    deltas = catalog.deltas(table, tuple(PART))
    assert [d.position for d in deltas] == list(range(1, len(expected) + 1))
    assert len({d.commit_id for d in deltas}) == len(deltas)
    seen = []
    for d in deltas:
        assert len(d.files) == 1
        rows = catalog.read_file(d.files[0]).to_pylist()
        seen.extend((r["writer"], r["seq"]) for r in rows)
    assert sorted(seen) == sorted(expected)
    # no orphan files: every stored data file belongs to a committed delta
    referenced = {f.key for d in deltas for f in d.files}
    stored = {k for k in catalog.listing() if "/files/" in k}
    assert stored == referenced


def test_concurrent_processes_append(any_lake: Catalog) -> None:
    writers, per_writer = 4, 4
    endpoint = getattr(any_lake.storage, "endpoint_url", None)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(writers)
    procs = [
        ctx.Process(target=_workers.append_worker, args=(any_lake.uri, endpoint, "ACME.CONCURRENT.V1", PART, w, per_writer, barrier))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * writers
    check_stream(any_lake, "ACME.CONCURRENT.V1", {(w, s) for w in range(writers) for s in range(per_writer)})


def test_concurrent_cli_appends(any_lake: Catalog, tmp_path: Path) -> None:
    n = 4
    files = []
    for w in range(n):
        path = tmp_path / f"w{w}.parquet"
        pq.write_table(pa.table({"writer": pa.array([w], pa.int64()), "seq": pa.array([0], pa.int64())}), path)
        files.append(path)
    env = catalog_env(any_lake)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "flash_pipeline.cli", "append", "--catalog", any_lake.uri, "--table", "ACME.CLI.V1",
             "--partition", "Order Day=1995-04-03", "--op", "upsert", str(f)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for f in files
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, outs
    positions = sorted(int(out.strip()) for out, _ in outs)
    assert positions == list(range(1, n + 1))
    check_stream(any_lake, "ACME.CLI.V1", {(w, 0) for w in range(n)})
