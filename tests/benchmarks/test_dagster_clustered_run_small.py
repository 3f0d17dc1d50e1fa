"""`python -m benchmarks.dagster_clustered_run` at small scale: on scenario 3's data as benchmarks.run prepares it
(5,000 rows), it starts the README's deployment (`flash-compactor dev`), compacts the clustered delta by a fresh
command and by a daemon-launched run of `compact_orders` (a warm-up, then one counted repetition with the delta
appended again), checks every result's rows, and writes its report with the run's phases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_data import prepare
from benchmarks.config import SCALES

REPO = Path(__file__).resolve().parents[2]


def test_the_dagster_clustered_run_benchmark_runs_at_small_scale(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = dict(SCALES["small"], rows=5_000, small_deltas=20)
    spec = prepare("small", cfg, 42, data, log=lambda message: None)["scenarios"]["s3_clustered"]
    out = tmp_path / "clustered"
    done = subprocess.run([sys.executable, "-m", "benchmarks.dagster_clustered_run", "--data", str(data), "--runs", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "repetition 0" in done.stdout and "repetition 1" in done.stdout  # the warm-up, then the counted one
    record = json.loads(out.with_suffix(".json").read_text())
    assert len(record["commands"]) == 1 and len(record["dagster"]) == 1
    run = record["dagster"][0]
    assert 0 < run["queued"] < run["commit"] <= run["end"] and run["worker_start"] > 0
    # the run's phases add up to its commit: queue, then the run worker's start, then the step
    assert abs(run["queued"] + run["worker_start"] + run["step_to_commit"] - run["commit"]) < 0.01
    report = out.read_text()
    assert f"{spec['input_rows']:,} rows considered, {spec['expected_rows']:,} out" in report
    assert "Launch -> commit minus the command" in report
