"""The strict copy floor, the yardstick of the benchmarks' ratios (issue 58; the method of
``../shared/bench/copy_floor.py``): what any compactor must at least do, with no key work at all.

    python benchmarks/strict_floor.py SPEC.json

Reads EVERY input file of SPEC's ``inputs`` fully with PyArrow (upserts: the output columns; deletes: the key
columns) and writes exactly ``expected_rows`` rows: two threads, each streaming its share of the files (balanced
by upsert rows, position order within a share) from read to its own rolling ParquetWriter (snappy, at most 4M
rows a file, 1M-row row groups), writing the first ``quota = expected_rows * its rows / all upsert rows``. The
caller times the whole process, imports included, as it times a fresh ``flash-compactor compact``; the file runs
by path, so that the ``benchmarks`` package is not imported. Prints one ``FLOOR_TIMING {json}`` line.

The benchmarks' older floor (``copy`` in engines.py: every input concatenated in memory, then two files written,
the timer inside the process) stays beside it as a second column.
"""

from __future__ import annotations

import time

T_START = time.time()

import json  # noqa: E402 - imports are inside the measured process time on purpose
import os  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402

KEYS = ["order_id", "region"]
MAX_ROWS_PER_FILE = 4_000_000
ROW_GROUP = 1 << 20
THREADS = 2


def shares(rows: list[int], upsert: list[bool]) -> list[list[int]]:
    """Input indexes per thread: largest first onto the thread with the fewest upsert rows so far."""
    out: list[list[int]] = [[] for _ in range(THREADS)]
    load = [0] * THREADS
    for i in sorted(range(len(rows)), key=lambda i: -rows[i]):
        w = load.index(min(load))
        out[w].append(i)
        load[w] += rows[i] if upsert[i] else 0
    return [sorted(s) for s in out]


def quotas(expected: int, loads: list[int]) -> list[int]:
    """Rows each thread writes: ``expected`` split in proportion to the upsert rows it reads."""
    total = sum(loads)
    q = [expected * load // total if total else 0 for load in loads]
    q[0] += expected - sum(q)
    return q


def stream(share: list[int], inputs: list[dict[str, Any]], columns: list[str], quota: int, out_dir: str, w: int) -> dict[str, int]:
    """One thread: read each file of ``share`` whole, write its first rows until ``quota`` rows are written."""
    writer: pq.ParquetWriter | None = None
    files = in_file = written = read = 0
    for i in share:
        f = inputs[i]
        upsert = f["op"] == "upsert"
        table = pq.read_table(f["path"], columns=columns if upsert else KEYS, use_threads=False)
        read += table.num_rows
        if not upsert:
            continue
        start, limit = 0, min(table.num_rows, quota - written)
        while start < limit:
            if writer is None or in_file >= MAX_ROWS_PER_FILE:
                if writer is not None:
                    writer.close()
                writer = pq.ParquetWriter(os.path.join(out_dir, f"floor-{w}-{files:05d}.parquet"), table.schema, compression="snappy")
                files, in_file = files + 1, 0
            take = min(limit - start, MAX_ROWS_PER_FILE - in_file)
            writer.write_table(table.slice(start, take), row_group_size=ROW_GROUP)
            start, in_file, written = start + take, in_file + take, written + take
    if writer is not None:
        writer.close()
    return {"files": files, "written": written, "read": read}


def main(spec_path: str) -> dict[str, Any]:
    spec = json.loads(open(spec_path, encoding="utf-8").read())
    t_import = time.time() - T_START
    inputs = sorted(spec["inputs"], key=lambda f: (f["position"], f["file"]))
    out_dir = spec["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    rows = [pq.ParquetFile(f["path"]).metadata.num_rows for f in inputs]
    upsert = [f["op"] == "upsert" for f in inputs]
    parts = shares(rows, upsert)
    q = quotas(spec["expected_rows"], [sum(rows[i] for i in s if upsert[i]) for s in parts])
    with ThreadPoolExecutor(THREADS) as pool:
        done = list(pool.map(lambda w: stream(parts[w], inputs, spec["columns"], q[w], out_dir, w), range(THREADS)))
    if sum(d["written"] for d in done) != spec["expected_rows"]:
        raise SystemExit(f"strict floor: wrote {sum(d['written'] for d in done)} rows, expected {spec['expected_rows']}")
    timing = {"t_import": round(t_import, 3), "t_total_in_process": round(time.time() - T_START, 3),
              "rows_in": sum(d["read"] for d in done), "rows_out": spec["expected_rows"], "files_out": sum(d["files"] for d in done)}
    print("FLOOR_TIMING " + json.dumps(timing), flush=True)
    return timing


if __name__ == "__main__":
    main(sys.argv[1])
