"""Configuration shared by the benchmark harness's modules: the engines and their labels, the scenarios, the
scales and their modes, and where the repository is. It lives apart from ``benchmarks.run`` so that the modules
``run`` imports (``measure``, ``report``) can read it without importing ``run`` back; ``benchmarks.run`` and the
scripts beside it (``cpu_budget``) take it from here.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORES = 2
PEERS = ["copy_strict", "copy", "copy_nothp", "arrow_peer", "duckdb", "polars", "spark"]
ENGINES = ["ours_warm", "ours_cold", "ours_inprocess", "ours_command", *PEERS]
LABELS = {
    "ours_warm": "flash (warm Ray)",
    "ours_cold": "flash (cold: Ray started inside)",
    "ours_inprocess": "flash (in-process, no Ray)",
    "ours_command": "flash (a fresh `flash-compactor compact` process)",
    "copy_strict": "strict floor (benchmarks/strict_floor.py: a fresh process, streaming, 2 threads)",
    "copy": "copy floor, in memory (PyArrow, timed inside its process)",
    "copy_nothp": "copy floor, in memory, no transparent huge pages",
    "arrow_peer": "hand-written PyArrow + NumPy compactor (benchmarks/arrow_peer.py, a fresh process)",
    "duckdb": "DuckDB",
    "polars": "Polars (lazy)",
    "spark": "Spark local[2] (paper's compactor)",
}
SCENARIOS = {
    "s1_full": "(1) full compaction: base N + 4 upsert deltas (5% updates, 1% inserts each) + 1 delete delta (1%)",
    "s2_incremental": "(2) incremental: 1% updates spread over all keys of a compacted N-row table (second compaction timed)",
    "s3_clustered": "(3) incremental, clustered: 1% updates all in one of ten compacted files",
    "s4_small_files": "(4) many small files: thousands of deltas of a few hundred rows",
    "s5_over_budget": "(5) input 10x the memory budget (max_round_bytes = budget; base split into 10 deltas)",
}
MODES = {  # defaults per scale: batched mode (see run_batched) and py-spy profiles of missed targets
    "small": {"batch": True, "profile": False},
    "full": {"batch": False, "profile": True},
}
SPARK_BATCHED_DRIVER_MEMORY = "4g"  # batched mode: one JVM, so one driver setting (fresh mode gives scenario 5 a 1g driver)
SCALES = {
    "small": {"rows": 20_000, "small_deltas": 200, "small_rows": 60, "runs": 1, "buckets": [1, 2, 4, 8], "sizes": [2, 5, 10]},
    "full": {"rows": 5_000_000, "small_deltas": 3000, "small_rows": 300, "runs": 3, "buckets": [1, 2, 4, 8, 16, 32], "sizes": [1, 2, 5, 10]},
}
