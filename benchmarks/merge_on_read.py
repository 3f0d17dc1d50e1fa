"""Merge-on-read latency versus compaction latency for a small pending delta on a large table.

A table of N rows (default 2M, the benchmark generator's `orders`: primary key (order_id, region), sort key
last_updated) is compacted once; then a delta of 1% of N (updates of existing keys, a few inserts and in-delta
duplicates) plus a small delete delta are appended. Timed, median of `--runs` runs each:

* merge-on-read: `flash_pipeline.merge_on_read.read()` of the table (compacted version + pending deltas), in
  process, nothing written;
* compaction: `compact()` of the pending deltas on a warm Ray (each run on a fresh copy of the lake), and the
  scan of the compacted result afterwards (compaction + scan = time to the same answer through the lake);
* scan: reading the compacted version alone (the floor of any read).

The merge-on-read result is checked equal to the compacted result (rows sorted by primary key).

    .venv/bin/python -m benchmarks.merge_on_read [--rows 2000000] [--delta-frac 0.01] [--runs 3] [--num-cpus 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.generate import Generator
from flash_pipeline import Catalog, compact
from flash_pipeline.merge_on_read import read

TABLE = "BENCH.ORDERS.V1"
PKS = ["order_id", "region"]
SORT = [("last_updated", "ascending")]


def quiet(_m: str) -> None:
    pass


def canonical(t: pa.Table) -> pa.Table:
    return t.sort_by([("order_id", "ascending"), ("region", "ascending")]).combine_chunks()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--delta-frac", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="flash-mor-"))
    try:
        lake = work / "lake"
        cat = Catalog(lake)
        gen = Generator(seed=7, capacity=args.rows * 2 + 100)
        t = time.perf_counter()
        cat.append(TABLE, None, "upsert", gen.base(args.rows, args.files))
        compact(TABLE, PKS, sort_keys=SORT, catalog=cat, num_cpus=args.num_cpus, progress=quiet)
        setup = time.perf_counter() - t
        n_delta = max(1, int(args.rows * args.delta_frac))
        inserts = max(1, n_delta // 20)
        cat.append(TABLE, None, "upsert", gen.upsert(n_delta - inserts, inserts, files=1))
        cat.append(TABLE, None, "delete", gen.delete(max(1, n_delta // 100)))
        pending = cat.deltas(TABLE, (), after_position=cat.latest_compacted(TABLE, ()).last_position)
        pending_rows = sum(d.rows for d in pending)

        mor, comp, scan_after, scan = [], [], [], []
        result = read(cat, TABLE)  # warm-up (compaction is timed on a warm Ray too)
        for _ in range(args.runs):
            t = time.perf_counter()
            result = read(cat, TABLE)
            mor.append(time.perf_counter() - t)
        for i in range(args.runs):
            copy = work / f"copy-{i}"
            shutil.copytree(lake, copy)
            c = Catalog(copy)
            t = time.perf_counter()
            compact(TABLE, None, catalog=c, num_cpus=args.num_cpus, progress=quiet)
            comp.append(time.perf_counter() - t)
            t = time.perf_counter()
            after = read(c, TABLE)
            scan_after.append(time.perf_counter() - t)
            if i == 0:
                assert result is not None
                if not canonical(after).equals(canonical(result)):
                    raise SystemExit("MISMATCH: merge-on-read differs from compaction")
            shutil.rmtree(copy)
        # the scan floor: the compacted version without pending deltas
        for _ in range(args.runs):
            t = time.perf_counter()
            for f in sorted(cat.latest_compacted(TABLE, ()).files, key=lambda f: f.file_number):
                cat.read_file(f)
            scan.append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in (("merge_on_read", mor), ("compaction", comp), ("scan_after_compaction", scan_after), ("scan_only", scan))}
        out = {
            "rows": args.rows,
            "pending_rows": pending_rows,
            "result_rows": result.num_rows if result is not None else 0,
            "runs": args.runs,
            "num_cpus": args.num_cpus,
            "setup_seconds": round(setup, 2),
            "median_seconds": {k: round(v, 3) for k, v in med.items()},
            "all_seconds": {"merge_on_read": mor, "compaction": comp, "scan_after_compaction": scan_after, "scan_only": scan},
        }
        print(json.dumps(out, indent=1))
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
        print()
        print(f"| {args.rows:,} rows, pending {pending_rows:,} delta rows | median of {args.runs} (s) |")
        print("|---|---|")
        print(f"| merge-on-read (`read()`, in process) | {med['merge_on_read']:.2f} |")
        print(f"| compaction (`compact()`, warm Ray, {args.num_cpus} CPUs) | {med['compaction']:.2f} |")
        print(f"| compaction + scan of the result | {med['compaction'] + med['scan_after_compaction']:.2f} |")
        print(f"| scan of the compacted version alone (floor) | {med['scan_only']:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
