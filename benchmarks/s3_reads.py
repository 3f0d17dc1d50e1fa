"""Bytes, GETs, time and peak memory of a compaction on S3 (a local moto server), large sources read by ranges
(catalog/ranged_objects.py) against read whole (the S3 source before 2026-11-30, reproduced by raising
``WHOLE_OBJECT_BYTES`` above every object's size), in alternating runs of one process each.

    .venv/bin/python -m benchmarks.s3_reads [--rows 1000000] [--runs 3] [--whole-object-bytes N]

Two upsert deltas of ``rows / 2`` rows each (s1's columns, one 500k-row group per file as a Spark task writes
them); every GET the storage makes is counted. Writes benchmarks/results_s3_reads.md. moto answers from memory
on this machine, so a GET costs a few milliseconds and bytes cost nothing: the time column is not what a real
network gives.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _table(rows: int, seed: int):  # type: ignore[no-untyped-def]
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    keys = rng.permutation(rows * 4)[:rows]
    return pa.table({
        "order_id": pa.array(keys, pa.int64()),
        "region": pa.array(np.array(["n", "s", "e", "w"])[keys % 4]),
        "last_updated": pa.array(rng.integers(0, 10**15, rows), pa.int64()),
        "customer_id": pa.array(rng.integers(0, 10**6, rows), pa.int64()),
        "status": pa.array(np.array(["SUBMITTED", "PACKED", "SHIPPED"])[rng.integers(0, 3, rows)]),
        "amount": pa.array(rng.random(rows) * 1000),
        "quantity": pa.array(rng.integers(1, 20, rows), pa.int32()),
        "sku": pa.array(np.char.add("sku-", rng.integers(0, 10**6, rows).astype(str))),
        "comment": pa.array(np.char.add("comment number ", rng.integers(0, 10**12, rows).astype(str))),
    })


def one_run(endpoint: str, files: list[str], mode: str, whole_object_bytes: int) -> dict:
    """In this (fresh) process: append ``files`` to a new lake, compact it, count the storage's GETs."""
    from flash_pipeline import Catalog, CompactOptions, compact
    from flash_pipeline.catalog import s3 as s3_module

    s3_module.WHOLE_OBJECT_BYTES = 1 << 40 if mode == "whole" else whole_object_bytes
    import boto3

    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    cat = Catalog(f"s3://{bucket}/lake", endpoint_url=endpoint)
    cat.append("orders", None, "upsert", files)
    gets: list[int] = []
    storage = cat.storage
    read, read_range, read_tail = storage.read, storage.read_range, storage.read_tail

    def counted(fn):  # type: ignore[no-untyped-def]
        def call(*a):  # type: ignore[no-untyped-def]
            out = fn(*a)
            gets.append(len(out[0]) if isinstance(out, tuple) else len(out))
            return out
        return call

    storage.read, storage.read_range, storage.read_tail = counted(read), counted(read_range), counted(read_tail)
    t0 = time.perf_counter()
    result = compact("orders", CompactOptions(primary_keys=("order_id", "region"),
                                              sort_keys=(("last_updated", "ascending"),), executor="in-process"),
                     catalog=cat, progress=lambda _: None)
    seconds = time.perf_counter() - t0
    return {"mode": mode, "seconds": seconds, "gets": len(gets), "mib": sum(gets) / 2**20,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rows_out": result.partitions[0].rows_out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results_s3_reads"))
    ap.add_argument("--whole-object-bytes", type=int, default=None,
                    help="objects up to this size are read whole (default: catalog/ranged_objects.py's)")
    ap.add_argument("--one", nargs=4, metavar=("ENDPOINT", "FILES_JSON", "MODE", "BYTES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        endpoint, files_json, mode, limit = args.one
        print("RUN " + json.dumps(one_run(endpoint, json.loads(files_json), mode, int(limit))), flush=True)
        return
    from flash_pipeline.catalog.ranged_objects import WHOLE_OBJECT_BYTES

    limit = args.whole_object_bytes if args.whole_object_bytes is not None else WHOLE_OBJECT_BYTES
    import pyarrow.parquet as pq

    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "_moto_server.py"), "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="flash-s3-reads-") as tmp:
            files = []
            for i in range(2):
                path = Path(tmp) / f"delta-{i}.parquet"
                pq.write_table(_table(args.rows // 2, i), path, row_group_size=args.rows // 2)
                files.append(str(path))
            time.sleep(1.0)  # the server's start
            runs = []
            for _ in range(args.runs):
                for mode in ("ranged", "whole"):
                    done = subprocess.run([sys.executable, "-m", "benchmarks.s3_reads", "--one", endpoint,
                                           json.dumps(files), mode, str(limit)], cwd=REPO, env=env, capture_output=True,
                                          text=True, check=True)
                    runs.append(json.loads(done.stdout.split("RUN ", 1)[1]))
                    print(runs[-1], flush=True)
    finally:
        server.terminate()
    lines = ["# S3 reads of a compaction: large sources by ranged GETs against read whole", "",
             f"Generated by `python -m benchmarks.s3_reads --rows {args.rows} --runs {args.runs}` on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores): two upsert deltas of {args.rows // 2:,} rows (one row group each) on a local "
             "moto server, compacted in process; alternating runs, a fresh process each; medians. The time is "
             "moto's (a GET costs milliseconds, bytes nothing), not a real network's.", "",
             "| source | GETs | MiB fetched | seconds | peak RSS MiB | runs (s) |", "|---|---|---|---|---|---|"]
    for mode, label in (("ranged", "ranged GETs (catalog/ranged_objects.py)"), ("whole", "whole objects (before)")):
        mine = [r for r in runs if r["mode"] == mode]
        assert len({r["rows_out"] for r in runs}) == 1, "both modes write the same rows"
        med = {k: statistics.median(r[k] for r in mine) for k in ("gets", "mib", "seconds", "peak_mib")}
        lines.append(f"| {label} | {med['gets']:.0f} | {med['mib']:.1f} | {med['seconds']:.2f} | "
                     f"{med['peak_mib']:.0f} | {', '.join(format(r['seconds'], '.2f') for r in mine)} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(json.dumps({"runs": runs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
