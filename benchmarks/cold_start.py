"""The user's path: a fresh ``flash-compactor compact`` process, in this process vs on a cold local Ray.

In process twice: by default (a few rows' kernels run as Python, kernels/jit.py) and with Numba loaded from the
first kernel call (FLASH_KERNELS=compiled).

For each input size (the paper's example, then synthetic tables of growing size) the same lake is copied
fresh before every run, and the whole command is timed from outside (start-up, imports, Ray if any, the
compaction, exit). Runs alternate between executors (in-process, ray) so drift hits both alike; the median
of ``--runs`` is reported with the ratio. The size where the two meet is the planner's in-process threshold
(runtime/executor.py IN_PROCESS_MAX_BYTES).

    python -m benchmarks.cold_start --runs 3 --out benchmarks/results_cold_start.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
TABLE = "BENCH.COLD.V1"


def paper_lake(lake: Path) -> tuple[str, list[str]]:
    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.cli.demo import DEMO_SOURCE, demo_deltas

    cat = Catalog(str(lake))
    for partition, files in demo_deltas():
        cat.append(DEMO_SOURCE, partition, "upsert", files)
    return DEMO_SOURCE, ["--primary-key", "Order ID", "--sort-key", "Last Updated"]


def synthetic_lake(lake: Path, rows: int, work: Path) -> tuple[str, list[str]]:
    """One partition, two upsert deltas (the second updates 10% of the first's keys), ~60 B a row at rest."""
    from flash_pipeline.catalog.catalog import Catalog

    rng = np.random.default_rng(rows)
    cat = Catalog(str(lake))

    def table(keys: np.ndarray, version: int) -> pa.Table:
        n = len(keys)
        return pa.table({
            "id": pa.array(keys, pa.int64()),
            "version": pa.array(np.full(n, version), pa.int64()),
            "amount": pa.array(rng.random(n)),
            "note": pa.array(np.char.add("note-", rng.integers(0, 1 << 30, n).astype(str))),
        })

    keys = np.arange(rows, dtype=np.int64)
    for version, part in ((1, keys), (2, rng.choice(keys, max(1, rows // 10), replace=False))):
        path = work / f"d{rows}-{version}.parquet"
        pq.write_table(table(part, version), path)
        cat.append(TABLE, {}, "upsert", [str(path)])
    return TABLE, ["--primary-key", "id", "--sort-key", "version"]


def input_bytes(lake: Path) -> int:
    return sum(p.stat().st_size for p in lake.rglob("*") if p.is_file() and p.suffix in (".parquet", ".feather", ".orc", ".csv"))


# what each timed command runs: its executor, and how its kernels load (kernels/jit.py: "auto" runs a few rows'
# kernels as their Python source, "compiled" loads Numba from the first call, as every command did before)
MODES = {"in-process": ("in-process", "auto"), "in-process, Numba from the start": ("in-process", "compiled"), "ray": ("ray", "auto")}


def time_command(template: Path, table: str, keys: list[str], mode: str, scratch: Path, expected_rows: int) -> float:
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(template, scratch)
    executor, kernels = MODES[mode]
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_EXECUTOR", "FLASH_RAY_ADDRESS", "RAY_ADDRESS")}
    env["FLASH_KERNELS"] = kernels
    cmd = [str(Path(sys.executable).with_name("flash-compactor")), "compact", "--catalog", str(scratch), "--table", table,
           *keys, "--executor", executor]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr[-2000:]}")
    from flash_pipeline.catalog.catalog import Catalog

    cat = Catalog(str(scratch))
    rows = sum(cat.latest_compacted(table, p).rows for p in cat.partitions(table))
    if rows != expected_rows:  # every key once: the paper's 8 orders, or every synthetic key
        raise SystemExit(f"{' '.join(cmd)}: {rows} rows compacted, expected {expected_rows}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="100000,500000,1000000,2000000,4000000", help="rows of the synthetic tables")
    ap.add_argument("--work", default="/tmp/flash-cold-start")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results_cold_start.md"))
    args = ap.parse_args(argv)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cases: list[tuple[str, Path, int, str, list[str]]] = []
    lake = work / "paper"
    cases.append(("the paper's example (16 rows)", lake, 8, *paper_lake(lake)))
    for rows in (int(x) for x in args.sizes.split(",") if x):
        lake = work / f"rows{rows}"
        cases.append((f"{rows:,} + {max(1, rows // 10):,} rows", lake, rows, *synthetic_lake(lake, rows, work)))
    lines = []
    summary: list[dict[str, object]] = []
    for name, template, expected, table, keys in cases:
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.runs):
            for mode in times:
                times[mode].append(time_command(template, table, keys, mode, work / "scratch", expected))
        med = {k: statistics.median(v) for k, v in times.items()}
        size = input_bytes(template)
        cells = " | ".join(f"{med[m]:.2f} ({', '.join(f'{t:.2f}' for t in times[m])})" for m in MODES)
        line = f"| {name} | {size / 2**20:.2f} | {cells} | {med['in-process'] / med['ray']:.2f} |"
        print(line, flush=True)
        lines.append(line)
        summary.append({"case": name, "input_bytes": size, "in_process_s": med["in-process"],
                        "in_process_numba_from_start_s": med["in-process, Numba from the start"], "ray_s": med["ray"], "runs": times})
    head = [
        "# A fresh `flash-compactor compact`: in this process vs a cold local Ray",
        "",
        f"Generated by `python -m benchmarks.cold_start --runs {args.runs} --sizes {args.sizes}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} cores, "
        f"{platform.platform()}, Python {platform.python_version()}.",
        "",
        "Each cell: the median wall seconds of the whole command (process start to exit, a fresh copy of the lake each "
        "run, modes alternating), the runs in brackets; every run's compacted row count is checked. Input MiB: "
        "delta files at rest. *In-process* is the default: a command whose kernels see few rows runs their Python "
        "source and never loads Numba (flash_pipeline/compactor/kernels/jit.py); *Numba from the start* "
        "(`FLASH_KERNELS=compiled`) loads it on the first kernel call, as every command did before.",
        "",
        "| input | input MiB | in-process s | in-process, Numba from the start s | cold Ray s | in-process / Ray |",
        "|---|---|---|---|---|---|",
    ]
    Path(args.out).write_text("\n".join(head + lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps({"runs": args.runs, "cases": summary}, indent=1))
    print(f"wrote {args.out} and its .json (read by benchmarks/run.py's issue 15 scorecard)")


if __name__ == "__main__":
    main()
