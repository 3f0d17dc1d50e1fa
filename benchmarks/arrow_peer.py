"""The hand-written PyArrow + NumPy compactor peer (issue 58): what a user could write in an afternoon for this
one table, the bar the engine must beat on every scenario while staying general.

    python benchmarks/arrow_peer.py SPEC.json

For the benchmark's key ``order_id, region`` and sort key ``last_updated`` (engines.py's semantics: per key, the
latest delete's position D; among upserts after D the greatest by last_updated, position, file, row):

1. read the key and sort columns of every input on two threads (deletes: the key columns);
2. one key per row, ``order_id * regions + region code`` (int64; a lexsort on both when that could overflow),
   one stable sort by it (rows come in (position, file, row) order, so a row's index is its ordinal and stays
   in order inside a key's group); per group (``np.maximum.reduceat``) the latest delete, then the greatest
   last_updated among the upserts after it, then the latest of the upserts that hold it;
3. two threads stream the files with winners: read all columns, keep the winning rows, append to their own
   rolling ParquetWriter (snappy, at most 4M rows a file).

Timed by the caller as a whole process, like the strict floor and a fresh ``flash-compactor compact``; run by path.
"""

from __future__ import annotations

import time

T_START = time.time()

import json  # noqa: E402 - imports are inside the measured process time on purpose
import os  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

KEYS = ["order_id", "region"]
SORT = "last_updated"
MAX_ROWS_PER_FILE = 4_000_000
THREADS = 2


def read_keys(f: dict[str, Any]) -> pa.Table:
    return pq.read_table(f["path"], columns=KEYS + ([SORT] if f["op"] == "upsert" else []), use_threads=False)


def winners(inputs: list[dict[str, Any]], tables: list[pa.Table]) -> list[np.ndarray]:
    """Per input file, the row numbers of its rows that survive (empty for delete files)."""
    sizes = np.array([t.num_rows for t in tables], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    regions = pa.chunked_array([c for t in tables for c in t.column("region").chunks], type=tables[0].schema.field("region").type)
    codes = pc.dictionary_encode(regions.combine_chunks())
    region = np.asarray(codes.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    order_id = np.concatenate([t.column("order_id").to_numpy() for t in tables]).astype(np.int64)
    n_regions = max(len(codes.dictionary), 1)
    lo, hi = (int(order_id.min()), int(order_id.max())) if len(order_id) else (0, 0)
    is_delete = np.repeat(np.array([f["op"] == "delete" for f in inputs]), sizes)
    sort = np.concatenate([t.column(SORT).to_numpy() if f["op"] == "upsert" else np.zeros(t.num_rows, dtype=np.int64)
                           for f, t in zip(inputs, tables)]).astype(np.int64)
    # rows are in (position, file, row) order, so a row's index is its ordinal; a stable sort by key keeps it
    if (hi - lo + 1) * n_regions < 2**62:
        key = (order_id - lo) * n_regions + region
        order = np.argsort(key, kind="stable")
        k = key[order]
        new_group = np.concatenate([[True], k[1:] != k[:-1]]) if len(k) else np.zeros(0, dtype=bool)
    else:  # keys too far apart to pack in 64 bits: sort on both columns
        order = np.lexsort((region, order_id))
        o, r = order_id[order], region[order]
        new_group = np.concatenate([[True], (o[1:] != o[:-1]) | (r[1:] != r[:-1])]) if len(o) else np.zeros(0, dtype=bool)
    if not len(order):
        return [np.zeros(0, dtype=np.int64) for _ in inputs]
    firsts = np.flatnonzero(new_group)
    group = np.cumsum(new_group) - 1
    dele = is_delete[order]
    last_delete = np.maximum.reduceat(np.where(dele, order, -1), firsts)  # a key's latest delete (ordinal)
    valid = ~dele & (order > last_delete[group])  # upserts after it (a delta holds one operation)
    low = np.iinfo(np.int64).min
    best = np.maximum.reduceat(np.where(valid, sort[order], low), firsts)  # the greatest sort key among them
    chosen = np.maximum.reduceat(np.where(valid & (sort[order] == best[group]), order, -1), firsts)  # latest on a tie
    kept = np.sort(chosen[chosen >= 0])
    file_of = np.searchsorted(starts, kept, side="right") - 1
    bounds = np.searchsorted(file_of, np.arange(len(inputs) + 1))
    return [kept[bounds[i]:bounds[i + 1]] - starts[i] for i in range(len(inputs))]


def stream(share: list[int], inputs: list[dict[str, Any]], rows: list[np.ndarray], columns: list[str], out_dir: str, w: int) -> int:
    writer: pq.ParquetWriter | None = None
    files = in_file = written = 0
    for i in share:
        table = pq.read_table(inputs[i]["path"], columns=columns, use_threads=False).take(pa.array(rows[i]))
        if writer is None or in_file + table.num_rows > MAX_ROWS_PER_FILE:
            if writer is not None:
                writer.close()
            writer = pq.ParquetWriter(os.path.join(out_dir, f"peer-{w}-{files:05d}.parquet"), table.schema, compression="snappy")
            files, in_file = files + 1, 0
        writer.write_table(table, row_group_size=1 << 20)
        in_file, written = in_file + table.num_rows, written + table.num_rows
    if writer is not None:
        writer.close()
    return written


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path, encoding="utf-8").read())
    inputs = sorted(spec["inputs"], key=lambda f: (f["position"], f["file"]))
    os.makedirs(spec["out_dir"], exist_ok=True)
    with ThreadPoolExecutor(THREADS) as pool:
        tables = list(pool.map(read_keys, inputs))
    rows = winners(inputs, tables)
    busy = sorted((i for i in range(len(inputs)) if len(rows[i])), key=lambda i: -len(rows[i]))
    shares: list[list[int]] = [[] for _ in range(THREADS)]
    load = [0] * THREADS
    for i in busy:
        w = load.index(min(load))
        shares[w].append(i)
        load[w] += len(rows[i])
    with ThreadPoolExecutor(THREADS) as pool:
        written = sum(pool.map(lambda w: stream(sorted(shares[w]), inputs, rows, spec["columns"], spec["out_dir"], w), range(THREADS)))
    print("PEER_TIMING " + json.dumps({"t_total_in_process": round(time.time() - T_START, 3), "rows_out": int(written)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
