"""Ctrl-C during `flash-compactor compact` (a real SIGINT to the real process, sent by the process itself at a
named point: FLASH_CRASH_AT with FLASH_CRASH_SIGNAL=INT, flash_pipeline/faults.py).

Python raises the interrupt in the main thread, while sessions run in threads of their own: the job asks them to
stop (runtime/interrupt.py) and each stops at its next step boundary, before its commit. Before, the job's pool
waited for every session to finish and commit, and only then said "interrupted" (exit 130 with a new version).
A session past its commit keeps its version; one interrupted between rounds keeps its finished rounds, and the
next run resumes after them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog

TABLE = "ACME.ORDERS.V1"


def _lake(tmp_path: Path, deltas: int, rows: int) -> Catalog:
    """``deltas`` upsert deltas of ``rows`` rows each; delta i overwrites keys it shares with delta i-1."""
    cat = Catalog(str(tmp_path / "lake"))
    for i in range(deltas):
        ids = list(range(i * rows // 2, i * rows // 2 + rows))
        path = tmp_path / f"d{i}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "v": [f"d{i}-{k}" for k in ids]}), path)
        cat.append(TABLE, (), "upsert", [str(path)])
    return cat


def _expected(deltas: int, rows: int) -> dict[int, str]:
    """The latest position wins: a plain model of the deltas above."""
    out: dict[int, str] = {}
    for i in range(deltas):
        for k in range(i * rows // 2, i * rows // 2 + rows):
            out[k] = f"d{i}-{k}"
    return out


def _compact(cat: Catalog, *extra: str, crash: str | None = None, signal: str = "INT") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if crash:
        env.update(FLASH_CRASH_AT=crash, FLASH_CRASH_SIGNAL=signal)
    cmd = [sys.executable, "-m", "flash_pipeline.cli", "compact", "--catalog", cat.uri, "--table", TABLE, "--primary-key", "id", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _rows(cat: Catalog) -> dict[int, str]:
    latest = cat.latest_compacted(TABLE, ())
    assert latest is not None
    table = pa.concat_tables([cat.read_live(f) for f in latest.files])
    return dict(zip(table.column("id").to_pylist(), table.column("v").to_pylist()))


def _compacted_files(cat: Catalog) -> list[str]:
    return [k for k in cat.listing() if "/compacted/" in k]


def _assert_interrupted(proc: subprocess.CompletedProcess[str], signal: str = "INT") -> None:
    assert proc.returncode == (130 if signal == "INT" else 143), (proc.returncode, proc.stderr[-2000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("flash-compactor: error: " + ("interrupted" if signal == "INT" else "terminated (SIGTERM")), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# on Ray, SIGTERM alone: the stop request is the same for both signals, and SIGTERM is the one Ray's handlers took
@pytest.mark.parametrize(("executor", "signal"), [("in-process", "INT"), ("in-process", "TERM"), ("ray", "TERM")])
def test_interrupt_before_the_commit_commits_nothing_and_a_rerun_finishes(tmp_path: Path, executor: str, signal: str) -> None:
    """SIGTERM (a scheduler stopping the command) is handled as Ctrl-C: before, it killed the process at once in
    process (exit 143, no line) and, on a Ray joined in the main thread, Ray's handler exited 15 with no line."""
    cat = _lake(tmp_path, deltas=3, rows=400)
    proc = _compact(cat, "--executor", executor, crash="driver:dedupe", signal=signal)
    _assert_interrupted(proc, signal)
    assert "stops at its next step" in proc.stderr
    assert cat.latest_compacted(TABLE, ()) is None, proc.stderr[-2000:]  # the old code committed version 1 here
    assert _compacted_files(cat) == []  # the attempt's files are gone: it never sent its commit
    again = _compact(cat, "--executor", "in-process")
    assert again.returncode == 0, again.stderr[-2000:]
    assert _rows(cat) == _expected(3, 400)


def test_interrupt_after_the_commit_keeps_the_version(tmp_path: Path) -> None:
    cat = _lake(tmp_path, deltas=2, rows=300)
    _assert_interrupted(_compact(cat, crash="driver:after_commit"))
    latest = cat.latest_compacted(TABLE, ())
    assert latest is not None and latest.version == 1
    assert _rows(cat) == _expected(2, 300)
    again = _compact(cat)
    assert again.returncode == 0 and "up-to-date" in again.stdout + again.stderr, again.stderr[-2000:]
    assert cat.latest_compacted(TABLE, ()).version == 1


def test_interrupt_between_rounds_keeps_the_finished_rounds_for_the_next_run(tmp_path: Path) -> None:
    cat = _lake(tmp_path, deltas=4, rows=3000)
    budget = ["--max-round-bytes", "300000", "--executor", "in-process"]
    _assert_interrupted(_compact(cat, *budget, crash="driver:between_rounds"))
    assert cat.latest_compacted(TABLE, ()) is None
    assert any("/compacted/state/" in k for k in _compacted_files(cat))  # round 1's state, kept
    assert not any("/compacted/data/" in k or "/compacted/index/" in k for k in _compacted_files(cat))
    again = _compact(cat, *budget)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming after round 1/4" in again.stderr, again.stderr[-3000:]
    assert _rows(cat) == _expected(4, 3000)
    assert not any("/compacted/state/" in k for k in _compacted_files(cat))  # discarded once committed
