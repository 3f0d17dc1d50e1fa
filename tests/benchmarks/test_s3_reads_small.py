"""`python -m benchmarks.s3_reads` at small scale: it starts its moto server, runs both sources in fresh
processes (150k-row deltas: over source_io's 4 MiB small-file bound, so that they take the ranged path), checks
that both write the same rows, that ranged reads fetch less in more GETs, and that the results file is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_s3_reads_benchmark_runs_both_sources_on_verified_output(tmp_path: Path) -> None:
    out = tmp_path / "s3_reads"
    done = subprocess.run([sys.executable, "-m", "benchmarks.s3_reads", "--rows", "300000", "--runs", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads((tmp_path / "s3_reads.json").read_text())["runs"]
    assert sorted(r["mode"] for r in runs) == ["ranged", "whole"]
    assert len({r["rows_out"] for r in runs}) == 1 and runs[0]["rows_out"] > 0
    by = {r["mode"]: r for r in runs}
    assert by["ranged"]["gets"] > by["whole"]["gets"] > 0 and by["ranged"]["mib"] < by["whole"]["mib"]
    report = (tmp_path / "s3_reads.md").read_text()
    assert "| ranged GETs" in report and "| whole objects (before)" in report
