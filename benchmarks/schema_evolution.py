"""A table that gains a column in its last delta, against the same compaction without the change (issue 55).

    .venv/bin/python -m benchmarks.schema_evolution                     # 5M rows, 5 runs of each: ~3 min on 2 cores
    .venv/bin/python -m benchmarks.schema_evolution --rows 200000 --runs 1 --out benchmarks/.runs/schema-small

The base table (``--rows`` rows: an int64 key, an int64 sort key, a float and a string column) is appended as ten
deltas and compacted once into ten files (not timed). Each run then appends one upsert delta updating 1% of the
keys, all in the first file's key range (an incremental compaction: one file rewritten, nine carried), either
with the table's columns ("same schema") or with one more string column ("adds a column"), and times a fresh
``flash-compactor compact`` process, as a user types it, on its own hard-linked copy of the base lake; the two
variants alternate run by run. Each output is checked against a plain model of the rows (count and a hash of
the rows sorted by key, the added column null outside the delta) and the files carried are compared. Writes
``results_schema_evolution.{md,json}`` under ``--out`` (default benchmarks/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
TABLE = "BENCH.EVOLVING"
COMMAND = [str(ROOT / ".venv" / "bin" / "flash-compactor"), "compact", "--table", TABLE, "--primary-key", "k",
           "--sort-key", "ts", "--json"]
VARIANTS = ("same schema", "adds a column")


def base_rows(rows: int, start: int, stop: int) -> pa.Table:
    k = np.arange(start, stop, dtype=np.int64)
    return pa.table({"k": k, "ts": np.ones(len(k), dtype=np.int64), "amount": (k % 1000) / 4.0,
                     "note": pa.array([f"n{i % 97}" for i in range(start, stop)])})


def update_delta(rows: int, variant: str) -> pa.Table:
    """1% of the keys, all in the first tenth of the key range (the first compacted file)."""
    k = np.arange(0, rows // 100, dtype=np.int64)
    t = pa.table({"k": k, "ts": np.full(len(k), 2, dtype=np.int64), "amount": np.full(len(k), -1.0),
                  "note": pa.array(["updated"] * len(k))})
    return t.append_column("channel", pa.array(["web"] * len(k))) if variant == "adds a column" else t


def model_hash(rows: int, variant: str) -> tuple[int, str]:
    """(rows, sha256 of the rows sorted by key) of the expected compacted table."""
    base = base_rows(rows, 0, rows)
    upd = update_delta(rows, variant)
    kept = base.filter(pc.invert(pc.is_in(base["k"], upd["k"])))
    if variant == "adds a column":
        kept = kept.append_column("channel", pa.nulls(kept.num_rows, pa.string()))
    return _hash(pa.concat_tables([upd, kept]))


def _hash(table: pa.Table) -> tuple[int, str]:
    table = table.select(sorted(table.column_names)).sort_by("k")
    h = hashlib.sha256()
    for batch in table.to_batches(1 << 16):
        for column in batch.columns:
            for buf in column.buffers():
                if buf is not None:
                    h.update(buf)
    return table.num_rows, h.hexdigest()


def output_hash(lake: Path) -> tuple[int, str, list[tuple[str, ...]]]:
    from flash_pipeline.catalog.catalog import Catalog

    cat = Catalog(lake)
    cv = cat.latest_compacted(TABLE, ())
    assert cv is not None
    schema = cv.pa_schema()
    tables = [cat.read_live(f, None, schema) for f in sorted(cv.files, key=lambda f: f.file_number)]
    table = pa.concat_tables([t.select([n for n in schema.names if not n.startswith("__")]) for t in tables])
    rows, digest = _hash(pa.Table.from_arrays(table.columns, names=table.column_names))  # one chunk layout per column
    return rows, digest, [f.columns for f in cv.files]


def prepare(rows: int, data: Path) -> Path:
    from flash_pipeline.catalog.catalog import Catalog

    base = data / f"base-{rows}"
    if (base / ".built").exists():
        return base / "lake"
    shutil.rmtree(base, ignore_errors=True)
    cat = Catalog(base / "lake")
    step = rows // 10
    for i in range(10):
        cat.append(TABLE, (), "upsert", [base_rows(rows, i * step, rows if i == 9 else (i + 1) * step)])
    # copy-on-write recorded (vectors are on by default): the run rewrites the touched file, as described above
    out = subprocess.run(COMMAND + ["--catalog", str(base / "lake"), "--rows-per-file", str(step), "--deletion-vectors", "off"],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    (base / ".built").touch()
    return base / "lake"


def one_run(base: Path, work: Path, rows: int, variant: str) -> dict[str, Any]:
    from flash_pipeline.catalog.catalog import Catalog

    lake = work / "lake"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, lake, copy_function=os.link)  # committed files are never written again: links suffice
    Catalog(lake).append(TABLE, (), "upsert", [update_delta(rows, variant)])
    t0 = time.perf_counter()
    out = subprocess.run(COMMAND + ["--catalog", str(lake)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(out.stderr)
    (part,) = json.loads(out.stdout)["partitions"]
    got_rows, digest, columns = output_hash(lake)
    return {"seconds": seconds, "files_written": part["files_written"], "files_carried": part["files_carried"],
            "engine_seconds": part["seconds"]["total"], "schema_changes": part.get("schema_changes", []),
            "rows": got_rows, "hash": digest, "carried_file_columns": sorted({",".join(c) for c in columns if c})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.schema_evolution", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--data", default=str(ROOT / "benchmarks" / "data" / "schema_evolution"))
    p.add_argument("--out", default=str(ROOT / "benchmarks"))
    args = p.parse_args(argv)
    data = Path(args.data)
    base = prepare(args.rows, data)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for i in range(args.runs):
        for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):  # alternate which goes first
            r = one_run(base, data / "run", args.rows, variant)
            expected = model_hash(args.rows, variant) if i == 0 else (runs[variant][0]["rows"], runs[variant][0]["hash"])
            assert (r["rows"], r["hash"]) == expected, f"{variant}: output differs from the model"
            runs[variant].append(r)
            print(f"run {i + 1} {variant}: {r['seconds']:.2f} s, {r['files_written']} written, {r['files_carried']} carried", file=sys.stderr)
    summary = {v: {"median seconds": round(statistics.median(r["seconds"] for r in rs), 3),
                   "all seconds": [round(r["seconds"], 3) for r in rs],
                   "median engine seconds": round(statistics.median(r["engine_seconds"] for r in rs), 3),
                   "files written": rs[0]["files_written"], "files carried": rs[0]["files_carried"],
                   "schema changes": rs[0]["schema_changes"], "carried file columns": rs[0]["carried_file_columns"]}
               for v, rs in runs.items()}
    ratio = summary["adds a column"]["median seconds"] / summary["same schema"]["median seconds"]
    from benchmarks.measure import machine

    payload = {"command": "python -m benchmarks.schema_evolution " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": machine(), "rows": args.rows, "runs": args.runs, "summary": summary, "ratio": round(ratio, 3),
               "same files carried": summary["adds a column"]["files carried"] == summary["same schema"]["files carried"],
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "raw": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results_schema_evolution.json").write_text(json.dumps(payload, indent=1, default=str))
    (out / "results_schema_evolution.md").write_text(report(payload))
    print(report(payload))
    return 0


def report(p: dict[str, Any]) -> str:
    s = p["summary"]
    lines = ["# A column added in the last delta, against the same compaction without it", "",
             f"Machine: {p['machine']}", "", f"Command: `{p['command']}` ({p['date']})", "",
             f"Base: {p['rows']:,} rows in ten compacted files; last delta: 1% of the keys, all in the first file's range. "
             "Each run: a fresh `flash-compactor compact` process on its own hard-linked copy of the base lake, the "
             f"two variants alternating; median of {p['runs']} runs; every output checked against a model of the rows.", "",
             "| last delta | median seconds (command) | all runs | engine seconds (median) | files written | files carried | schema changes |",
             "|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        r = s[v]
        lines.append(f"| {v} | {r['median seconds']:.3f} | {', '.join(f'{x:.2f}' for x in r['all seconds'])} | "
                     f"{r['median engine seconds']:.3f} | {r['files written']} | {r['files carried']} | {', '.join(r['schema changes']) or 'none'} |")
    recorded = s["adds a column"]["carried file columns"]
    lines += ["", f"Ratio (adds a column / same schema, medians): **{p['ratio']:.3f}** (target: within 1.10); the same files "
              f"carried: **{p['same files carried']}** (the carried files record the columns they have: {recorded})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
