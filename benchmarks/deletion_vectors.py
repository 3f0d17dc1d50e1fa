"""Spread updates with and without deletion vectors (issue 16), beside the copy floor, DuckDB, Polars and Spark.

    .venv/bin/python -m benchmarks.deletion_vectors                       # 5M base rows, 3 runs: ~15 min on 2 cores
    .venv/bin/python -m benchmarks.deletion_vectors --rows 200000 --runs 1 --out benchmarks/.runs/dv-small

The base table (N rows of benchmarks/generate.py's ``orders``) is compacted once into ten files of N/10 rows
(not timed). Each scenario then appends one upsert delta that updates a fraction of the keys chosen uniformly at
random (1% is issue 15/16's spread scenario; the larger fractions are for choosing the cost model's thresholds)
and is compacted, each run on its own hard-linked copy of the base lake, in a fresh subprocess, engines
alternating run by run:

- flash, vectors off: every base file lost rows, so every base file is rewritten (copy-on-write);
  like the peers, whose imports happen before their timer, the flash runs have the engine loaded (a tiny
  warm-up compaction in the same process first: modules, numba's cached kernels); the first fraction also
  times vectors on in a fresh process (imports and kernel loading inside the timed call);
- flash, vectors on: each base file is carried with a deletion vector while at most MAX_DEAD_FRACTION of its rows
  are dead, else rewritten (compactor/kernels/layout.py);
- the copy floor (read every input once, write the result once, PyArrow), DuckDB and Polars: the same
  compaction of the base files and the delta, from the files (benchmarks/engines.py, the same semantics).

Reading the table afterwards is timed too, in fresh subprocesses: ``polars.read_delta``, deltalake's
``QueryBuilder``, DuckDB's ``delta_scan`` and DuckDB's ``iceberg_scan`` of the Iceberg table (all apply deletion
vectors, the Iceberg one as position delete files) on the lakes the flash runs left, vectors on and off:

    .venv/bin/python -m benchmarks.deletion_vectors --fractions 0.01 --engines flash_vectors_off,flash_vectors_on,copy \
        --name results_deletion_vector_reads
Every output -- each engine's files, flash's live rows (its deletion vectors applied by the catalog), and each
read -- is checked equal to the others (rows, then a hash of the rows sorted by primary key).
Writes results_deletion_vectors.{md,json} under ``--out`` (default benchmarks/). The threshold study that chose
MAX_DEAD_FRACTION forces vectors at every fraction:

    FLASH_DV_MAX_DEAD_FRACTION=1 .venv/bin/python -m benchmarks.deletion_vectors --name results_deletion_vectors_forced
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.bench_data import append_all
from benchmarks.generate import Generator, write_delta
from benchmarks.measure import machine, run_worker
from benchmarks.outputs import Verifier, digest_tables
from flash_pipeline.catalog.deletion_vectors import max_dead_fraction

HERE = Path(__file__).resolve().parent
ENGINES = ["flash_vectors_off", "flash_vectors_on", "flash_vectors_on_fresh", "flash_vectors_on_command", "copy", "copy_strict",
           "arrow_peer", "duckdb", "polars", "spark"]
READERS = ["read_polars", "read_deltalake", "read_duckdb_delta", "read_duckdb_iceberg"]
READER_LABELS = {"read_polars": "polars.read_delta", "read_deltalake": "deltalake QueryBuilder select *",
                 "read_duckdb_delta": "DuckDB delta_scan (duckdb-extension-delta)",
                 "read_duckdb_iceberg": "DuckDB iceberg_scan of the Iceberg table (duckdb-extension-iceberg)"}
LABELS = {
    "flash_vectors_off": "flash, vectors off (in-process, engine loaded)",
    "flash_vectors_on": "flash, vectors on (in-process, engine loaded)",
    "flash_vectors_on_fresh": "flash, vectors on (in-process, a fresh process: imports and numba's kernel loading timed)",
    "flash_vectors_on_command": "flash, vectors on (a fresh `flash-compactor compact` process, launch to exit)",
    "copy": "copy floor (PyArrow, in memory)",
    "copy_strict": "strict copy floor (benchmarks/strict_floor.py, a fresh process)",
    "arrow_peer": "hand-written PyArrow peer (benchmarks/arrow_peer.py, a fresh process)",
    "duckdb": "DuckDB",
    "polars": "Polars (lazy)",
    "spark": "Spark local[2] (the paper's compactor; JVM start included)",
}


def prepare(rows: int, fractions: list[float], seed: int, data: Path, log: Any) -> dict[str, Any]:
    """The base lake (compacted, not timed) and one update delta per fraction (cached while the key matches)."""
    stamp = data / "ready.json"
    key = {"rows": rows, "fractions": fractions, "seed": seed, "version": 1}
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        return json.loads(stamp.read_text())
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    t = time.perf_counter()
    base_lake = data / "lakes" / "base"
    info: dict[str, Any] = {"key": key, "scenarios": {}}
    gen = Generator(seed, capacity=int(rows * 1.2) + 1000)
    base = write_delta(gen.base(rows, 10), data / "files" / "base", "base")
    append_all(base_lake, "orders", [{"op": "upsert", "files": base}])
    res = run_worker({"engine": "ours_inprocess", "jobs": [{"lake": str(base_lake), "rows_per_compacted_file": rows // 10, "label": "base"}]},
                     data / "tmp")
    if res.get("error"):
        raise RuntimeError(f"base compaction failed: {res['error']}\n{res.get('traceback', '')}")
    from flash_pipeline import Catalog

    cat = Catalog(base_lake)
    latest = cat.latest_compacted("orders", ())
    compacted = [{"path": cat.storage.arrow_source(f.key), "position": 0, "file": f.file_number, "op": "upsert"} for f in latest.files]
    log(f"  base: {rows:,} rows compacted into {len(compacted)} files ({time.perf_counter() - t:.0f} s)")
    for fraction in fractions:
        g = Generator(seed, capacity=int(rows * 1.2) + 1000)
        g.base(rows, 10)
        name = f"spread_{fraction:g}"
        delta = write_delta(g.upsert(int(rows * fraction), 0, 1, dup_frac=0.0), data / "files" / name, name)
        lake = data / "lakes" / name
        subprocess.run(["cp", "-al", str(base_lake), str(lake)], check=True)
        append_all(lake, "orders", [{"op": "upsert", "files": delta}])
        info["scenarios"][name] = {
            "fraction": fraction, "lake": str(lake), "expected_rows": g.live_rows,
            "inputs": compacted + [{"path": p, "position": 1, "file": i, "op": "upsert"} for i, p in enumerate(delta, 1)],
            "delta_rows": sum(pq.read_metadata(p).num_rows for p in delta),
            "input_bytes_disk": sum(os.path.getsize(f["path"]) for f in compacted) + sum(os.path.getsize(p) for p in delta),
        }
    info["prepare_seconds"] = round(time.perf_counter() - t, 1)
    stamp.write_text(json.dumps(info))
    return info


def warmup_lake(data: Path, seed: int) -> str:
    """The tiny table a loaded engine compacts before its timed run (made once)."""
    warm = data / "lakes" / "warmup"
    if not (warm / "tables").exists():
        wg = Generator(seed + 99, capacity=5000)
        append_all(warm, "warmup", [{"op": "upsert", "files": write_delta(wg.base(2000, 2), data / "files" / "warmup", "base")},
                                    {"op": "upsert", "files": write_delta(wg.upsert(200, 20, 1), data / "files" / "warmup", "up")}])
    return str(warm)


def live_table(lake: Path) -> pa.Table:
    """The latest compacted version's live rows, deletion vectors applied by the catalog (this project's reader)."""
    from flash_pipeline import Catalog

    cat = Catalog(lake)
    latest = cat.latest_compacted("orders", ())
    return pa.concat_tables([cat.read_live(f) for f in latest.files], promote_options="permissive")


def _spec(engine: str, s: dict[str, Any], run_dir: Path, rows: int, warmup: str) -> dict[str, Any]:
    if engine.startswith("flash"):
        lake = run_dir / "lake"
        subprocess.run(["cp", "-al", s["lake"], str(lake)], check=True)
        job = {"lake": str(lake), "label": engine, "rows_per_compacted_file": rows // 10,
               "deletion_vectors": engine.startswith("flash_vectors_on")}
        if engine.endswith("_command"):  # the user's path: Python start, imports, kernels, the executor it picks
            return {"engine": "ours_command", "jobs": [job]}
        spec: dict[str, Any] = {"engine": "ours_inprocess", "jobs": [job]}
        if not engine.endswith("_fresh"):  # a tiny compaction first (its own lake copy), like the warm Ray engine's
            warm = run_dir / "warmup"
            subprocess.run(["cp", "-al", warmup, str(warm)], check=True)
            spec["warm_in_process"] = {"lake": str(warm), "table": "warmup"}
        return spec
    return {"engine": engine, "inputs": s["inputs"], "columns": COLUMNS, "expected_rows": s["expected_rows"]}


def _written(lake: Path, index_bytes_written: int | None) -> dict[str, int]:
    """What the timed compaction wrote: data files and deletion vector files (its attempt folder), index bytes."""
    from flash_pipeline import Catalog

    cat = Catalog(lake)
    latest = cat.latest_compacted("orders", ())
    attempt = max((f.key.rsplit("/", 1)[0] for f in latest.files), default="")  # attempt folders sort by time
    new = [f for f in latest.files if f.key.startswith(attempt + "/")]
    vector_files = {f.deletion_vector.key for f in latest.files if f.deletion_vector is not None and f.deletion_vector.key.startswith(attempt + "/")}
    return {
        "data": sum(f.bytes for f in new), "files_written": len(new),
        "carried_with_vector": sum(f.deletion_vector is not None for f in latest.files),
        "vectors": sum(cat.storage.size(k) for k in vector_files),
        # the index files under the same attempt (a command reports no statistics: read from the version)
        "index": index_bytes_written if index_bytes_written is not None else sum(
            f.bytes for files in latest.index.buckets for f in files if f"/index/{attempt.rsplit('/', 1)[-1]}/" in f.key),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {msg}", flush=True)

    fractions = [float(f) for f in args.fractions.split(",")]
    data = Path(args.data) if args.data else HERE / "data" / f"dv-{args.rows}"
    out = Path(args.out) if args.out else HERE
    work = out / ".runs" / "deletion_vectors"
    log(f"preparing data (N={args.rows:,}, fractions {fractions})")
    info = prepare(args.rows, fractions, args.seed, data, log)
    info["warmup_lake"] = warmup_lake(data, args.seed)
    results: dict[str, Any] = {}
    verifier = Verifier()
    for name, s in info["scenarios"].items():
        engines = ENGINES if s["fraction"] == fractions[0] or args.peers_everywhere else ["flash_vectors_off", "flash_vectors_on", "copy"]
        if args.engines:
            engines = [e for e in engines if e in args.engines.split(",")]
        res: dict[str, list[dict[str, Any]]] = {e: [] for e in engines + READERS + [f"{r}_vectors_off" for r in READERS]}
        for r in range(args.runs):
            order = engines[r % len(engines):] + engines[: r % len(engines)]  # who goes first alternates
            for engine in order:
                run_dir = work / name / f"{engine}-{r}"
                shutil.rmtree(run_dir, ignore_errors=True)
                run_dir.mkdir(parents=True)
                spec = {**_spec(engine, s, run_dir, args.rows, info["warmup_lake"]), "out_dir": str(run_dir / "out")}
                rec = run_worker(spec, run_dir)
                if rec.get("error"):
                    raise RuntimeError(f"{name} {engine}: {rec['error']}\n{rec.get('traceback', '')}")
                entry: dict[str, Any] = {"seconds": rec["seconds"], "peak_rss": rec["peak_rss"]}
                if engine.startswith("flash"):
                    lake = run_dir / "lake"
                    c = rec["compactions"][0]
                    entry.update({k: c.get(k) for k in ("files_written", "files_carried", "bytes_written", "bytes_carried", "index_bytes_written", "step_seconds")})
                    entry["written"] = _written(lake, c.get("index_bytes_written"))
                    rows, h = digest_tables([live_table(lake)])
                    verifier.check_digest(name, engine, rows, h, s["expected_rows"])
                    for reader in READERS if not engine.endswith(("_fresh", "_command")) else []:  # reading the table afterwards
                        label = reader if engine == "flash_vectors_on" else f"{reader}_vectors_off"
                        from flash_pipeline import Catalog

                        cat = Catalog(lake)
                        current = cat.iceberg_current_key("orders", ())
                        rspec = {"engine": reader, "location": cat.deltalake_location("orders", ()), "out_dir": str(run_dir / "read"),
                                 "iceberg_metadata": cat.iceberg_uri(current) if current else None}
                        rr = run_worker(rspec, run_dir / "reads")
                        if rr.get("error"):
                            raise RuntimeError(f"{name} {label}: {rr['error']}\n{rr.get('traceback', '')}")
                        verifier.check(name, label, rr["output_files"], s["expected_rows"])
                        res[label].append({"seconds": rr["seconds"], "peak_rss": rr["peak_rss"]})
                        log(f"  {name} run {r} {label}: {rr['seconds']:.2f}s (verified)")
                else:
                    verifier.check(name, engine, rec["output_files"], s["expected_rows"])
                res[engine].append(entry)
                log(f"  {name} run {r} {engine}: {rec['seconds']:.2f}s peak {rec['peak_rss'] / 2**20:.0f} MiB (verified)")
                shutil.rmtree(run_dir, ignore_errors=True)
        results[name] = res
    summary = {name: {e: {"median_s": statistics.median(x["seconds"] for x in runs), "runs_s": [round(x["seconds"], 3) for x in runs],
                          "median_peak_mib": statistics.median(x["peak_rss"] for x in runs) / 2**20}
                      for e, runs in res.items() if runs} for name, res in results.items()}
    payload = {
        "command": " ".join(["python -m benchmarks.deletion_vectors", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": args.rows, "runs": args.runs, "seed": args.seed,
        "machine": machine(), "info": {k: v for k, v in info.items() if k != "scenarios"},
        "scenarios": {n: {k: v for k, v in s.items() if k != "inputs"} for n, s in info["scenarios"].items()},
        "summary": summary, "results": results, "total_seconds": round(time.perf_counter() - started, 1),
        "max_dead_fraction": max_dead_fraction(), "forced": bool(os.environ.get("FLASH_DV_MAX_DEAD_FRACTION")),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(payload, indent=1, default=str))
    (out / f"{args.name}.md").write_text(report(payload))
    log(f"wrote {out / args.name}.md")
    return payload


def report(p: dict[str, Any]) -> str:
    m = p["machine"]
    lines = [
        "# Spread updates with and without deletion vectors",
        "",
        f"`{p['command']}` on {m.get('cpu', '?')} ({m.get('cores', '?')} cores, {m.get('ram_gib', '?')} GiB), {p['date']}; "
        f"N = {p['rows']:,} base rows in 10 compacted files; medians of {p['runs']} runs, each a fresh subprocess, engines "
        "alternating; every output verified equal (flash's live rows with its vectors applied, each reader's rows). "
        "Ratios are to the copy floors of the same scenario in the same run: the in-memory one (`copy`) and, where it ran, "
        "the strict one (issue 58's yardstick: ../shared/bench/copy_floor.py's method, a fresh process).",
        "",
        f"Cost model: a base file is carried with a vector while at most {p['max_dead_fraction']:.0%} of its rows are dead"
        + (" (forced with FLASH_DV_MAX_DEAD_FRACTION: a threshold study)" if p.get("forced") else " (MAX_DEAD_FRACTION, the default)")
        + ", else rewritten.",
        "",
    ]
    for name, s in p["summary"].items():
        scen = p["scenarios"][name]
        floor = s["copy"]["median_s"]
        strict = s["copy_strict"]["median_s"] if "copy_strict" in s else None
        lines += [f"## {scen['fraction']:.0%} of the keys updated, spread uniformly ({scen['delta_rows']:,} rows in the delta)", "",
                  "| engine | median s | × copy floor | × strict floor | runs (s) | peak RSS MiB | files written / carried with a vector | bytes written (data + vectors + index) |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in ENGINES:
            if e not in s:
                continue
            written = ""
            if e.startswith("flash"):
                w = statistics.median_high([(x["written"]["data"] + x["written"]["vectors"] + x["written"]["index"]) for x in p["results"][name][e]])
                x0 = p["results"][name][e][0]["written"]
                written = f"{x0['files_written']} / {x0['carried_with_vector']} | {w / 2**20:.1f} MiB"
            else:
                written = "- | -"
            vs_strict = f"{s[e]['median_s'] / strict:.2f}×" if strict else "-"
            lines.append(f"| {LABELS[e]} | {s[e]['median_s']:.2f} | {s[e]['median_s'] / floor:.2f}× | {vs_strict} | {', '.join(f'{v:.2f}' for v in s[e]['runs_s'])} "
                         f"| {s[e]['median_peak_mib']:.0f} | {written} |")
        lines += ["", "Reading the compacted table afterwards (a fresh process, all rows into memory):", "",
                  "| reader | vectors on: median s | vectors off: median s |", "|---|---|---|"]
        for r in READERS:
            on, off = s.get(r), s.get(f"{r}_vectors_off")
            if on and off:
                lines.append(f"| {READER_LABELS[r]} | {on['median_s']:.2f} | {off['median_s']:.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


COLUMNS = ["order_id", "region", "last_updated", "customer_id", "status", "amount", "quantity", "sku", "comment"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fractions", default="0.01,0.05,0.2", help="fractions of the keys updated (the first gets every peer)")
    ap.add_argument("--peers-everywhere", action="store_true", help="run DuckDB and Polars on every fraction, not only the first")
    ap.add_argument("--engines", help="only these engines (comma-separated names of ENGINES; the copy floor is needed "
                    "for the ratios), e.g. flash_vectors_off,flash_vectors_on,copy for the readers' table alone")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", help="data directory (default benchmarks/data/dv-<rows>, ignored by git)")
    ap.add_argument("--out", help="where the results go (default benchmarks/)")
    ap.add_argument("--name", default="results_deletion_vectors", help="file name of the results (.md and .json)")
    run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
