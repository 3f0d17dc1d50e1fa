"""Benchmarks of the flash compactor against Spark (local[2]), DuckDB, Polars and a PyArrow copy floor.

    .venv/bin/python -m benchmarks.run --scale small      # 20k base rows, batched: ~95 s on 2 cores, fresh data
    .venv/bin/python -m benchmarks.run --scale full       # 5M base rows, a fresh subprocess per run, 3 runs (median)

Full scale (and ``--no-batch``): every measurement runs in a fresh subprocess (``benchmarks.engines``), engines
alternating run by run. Small scale (and ``--batch``) is batched: warm Ray runs every scenario in one subprocess
(one Ray session) and Spark in one JVM (each scenario's seconds = its query + the JVM start measured once), cold
Ray runs scenario 1 only, the copy floor, DuckDB and Polars one fresh subprocess per scenario; the report says
which mode it used. This process samples the RSS of each subprocess and all its descendants (Ray's GCS, raylet
and workers; the Spark JVM) every 50 ms. Every output is checked equal (row count, then a hash of the rows sorted
by primary key) against every other engine's output; a mismatch raises ``MismatchError`` and the run fails.
Writes results.{md,json} and plots/ under ``--out``: by default benchmarks/ at full scale (the committed results)
and benchmarks/.runs/small-results/ (ignored by git) at small scale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.generate import COLUMNS, SCHEMA, Generator, key_columns, write_delta, REGIONS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORES = 2
PEERS = ["copy", "copy_nothp", "duckdb", "polars", "spark"]
ENGINES = ["ours_warm", "ours_cold", "ours_inprocess", "ours_command", *PEERS]
LABELS = {
    "ours_warm": "flash (warm Ray)",
    "ours_cold": "flash (cold: Ray started inside)",
    "ours_inprocess": "flash (in-process, no Ray)",
    "ours_command": "flash (a fresh `flash-compactor compact` process)",
    "copy": "copy floor (PyArrow)",
    "copy_nothp": "copy floor, no transparent huge pages",
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


class MismatchError(AssertionError):
    """Two engines produced different compacted rows."""


# ----- data ---------------------------------------------------------------------------------------------------
def _inputs_from_deltas(deltas: list[dict[str, Any]], first_position: int = 1) -> list[dict[str, Any]]:
    out = []
    for i, d in enumerate(deltas):
        for j, path in enumerate(d["files"], 1):
            out.append({"path": path, "position": first_position + i, "file": j, "op": d["op"]})
    return out


def _append_all(lake: Path, table: str, deltas: list[dict[str, Any]]) -> None:
    from flash_pipeline import Catalog

    cat = Catalog(lake)
    for d in deltas:
        cat.append(table, (), d["op"], d["files"])


def prepare(scale: str, cfg: dict[str, Any], seed: int, data: Path, log: Any = print) -> dict[str, Any]:
    """Generate every scenario's files and template lakes (cached under benchmarks/data/<scale>).

    The base compaction of scenarios 2 and 3 (in a subprocess, in process: a cold Ray would add its start-up to
    the slowest step) runs in the background while the other scenarios' files are generated and appended
    (nothing in this step is timed)."""
    stamp = data / "ready.json"
    # 5: base lakes whose manifests record their files' row groups (DataFile.row_group_rows); 6: and key ranges
    key = {"scale": scale, "cfg": cfg, "seed": seed, "version": 6}
    if stamp.exists():
        got = json.loads(stamp.read_text())
        if got.get("key") == key:
            return got
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    N = cfg["rows"]
    t = time.perf_counter()
    info: dict[str, Any] = {"key": key, "scenarios": {}, "prepare_timings": {}}
    lap_at = [t]

    def lap(step: str) -> None:
        now = time.perf_counter()
        info["prepare_timings"][step] = round(now - lap_at[0], 2)
        log(f"  prepare: {step} {now - lap_at[0]:.1f} s")
        lap_at[0] = now

    # (1) and (5): the same files; (5) appends the ten base files as ten deltas
    g = Generator(seed, capacity=int(N * 1.2) + 1000)
    files = data / "files" / "s1"
    deltas = [{"op": "upsert", "files": write_delta(g.base(N, 10), files, "base")}]
    base_files = list(deltas[0]["files"])

    # (2) and (3) need the base compacted with rows_per_compacted_file = N/10: start it now, in the background,
    # while everything else is generated
    base_lake = data / "lakes" / "s23_base"
    _append_all(base_lake, "orders", [deltas[0]])
    base_job: dict[str, Any] = {}

    def compact_base() -> None:
        try:
            base_job["result"] = run_worker({"engine": "ours_inprocess", "jobs": [{"lake": str(base_lake), "rows_per_compacted_file": N // 10, "label": "base"}]}, data / "tmp")
        except Exception as exc:  # noqa: BLE001 - re-raised in the main thread below
            base_job["result"] = {"error": f"{type(exc).__name__}: {exc}"}

    base_thread = threading.Thread(target=compact_base, daemon=True)
    base_thread.start()

    for i in range(2):
        deltas.append({"op": "upsert", "files": write_delta(g.upsert(N // 20, N // 100, 2), files, f"up{i}")})
    deltas.append({"op": "delete", "files": write_delta(g.delete(N // 100), files, "del")})
    reinsert = g.deleted_recently(max(1, N // 2000))
    deltas.append({"op": "upsert", "files": write_delta(g.upsert(N // 20, N // 100, 2) + g.upsert(len(reinsert), 0, 1, keys=reinsert), files, "up2")})
    deltas.append({"op": "upsert", "files": write_delta(g.upsert(N // 20, N // 100, 2), files, "up3")})
    expected = g.live_rows
    all_paths = [p for d in deltas for p in d["files"]]
    mem_bytes = sum(pq.read_table(p).nbytes for p in all_paths)
    disk_bytes = sum(os.path.getsize(p) for p in all_paths)
    lake1 = data / "lakes" / "s1"
    _append_all(lake1, "orders", deltas)
    info["scenarios"]["s1_full"] = {
        "lake": str(lake1), "inputs": _inputs_from_deltas(deltas), "expected_rows": expected,
        "input_rows": sum(pq.read_metadata(p).num_rows for p in all_paths), "input_bytes_memory": mem_bytes, "input_bytes_disk": disk_bytes,
    }
    d5 = [{"op": "upsert", "files": [p]} for p in base_files] + deltas[1:]
    lake5 = data / "lakes" / "s5"
    _append_all(lake5, "orders", d5)
    budget = mem_bytes // 10
    info["scenarios"]["s5_over_budget"] = {**info["scenarios"]["s1_full"], "lake": str(lake5), "inputs": _inputs_from_deltas(d5), "memory_budget": budget}
    lap("scenarios 1 and 5 (files and lakes)")

    # sweep lake: tables size_k with the first k base files as k deltas (latency/memory vs input size)
    lake_sizes = data / "lakes" / "sizes"
    for k in cfg["sizes"]:
        _append_all(lake_sizes, f"size_{k}", [{"op": "upsert", "files": [p]} for p in base_files[:k]])
    info["sizes_lake"] = str(lake_sizes)
    info["size_rows"] = {str(k): sum(pq.read_metadata(p).num_rows for p in base_files[:k]) for k in cfg["sizes"]}
    info["size_bytes"] = {str(k): sum(pq.read_table(p).nbytes for p in base_files[:k]) for k in cfg["sizes"]}
    info["base_file_bytes"] = os.path.getsize(base_files[0])

    # warm-up lake: a tiny table a warm worker compacts before the timed run
    wg = Generator(seed + 99, capacity=5000)
    warm = data / "lakes" / "warmup"
    _append_all(warm, "warmup", [{"op": "upsert", "files": write_delta(wg.base(2000, 2), data / "files" / "warmup", "base")},
                                 {"op": "upsert", "files": write_delta(wg.upsert(200, 20, 1), data / "files" / "warmup", "up")}])
    info["warmup_lake"] = str(warm)
    lap("sweep and warm-up lakes")

    # (4) thousands of small deltas
    g4 = Generator(seed + 4, capacity=cfg["small_deltas"] * cfg["small_rows"] + 1000)
    R = cfg["small_rows"]
    d4 = []
    f4 = data / "files" / "s4"
    for i in range(cfg["small_deltas"]):
        if i == 0:
            d = {"op": "upsert", "files": write_delta(g4.base(R, 1), f4, f"d{i:05d}")}
        elif i % 25 == 0:
            d = {"op": "delete", "files": write_delta(g4.delete(R // 10, missing=2), f4, f"d{i:05d}")}
        else:
            d = {"op": "upsert", "files": write_delta(g4.upsert(int(R * 0.6), R - int(R * 0.6), 1, dup_frac=0.01), f4, f"d{i:05d}")}
        d4.append(d)
    lake4 = data / "lakes" / "s4"
    _append_all(lake4, "orders", d4)
    p4 = [p for d in d4 for p in d["files"]]
    info["scenarios"]["s4_small_files"] = {
        "lake": str(lake4), "inputs": _inputs_from_deltas(d4), "expected_rows": g4.live_rows,
        "input_rows": sum(pq.read_metadata(p).num_rows for p in p4), "deltas": len(d4),
    }
    lap(f"scenario 4 ({len(d4)} deltas)")

    # (2) and (3): the base compacted (above, in the background), then one 1% update delta
    base_thread.join()
    lap("waiting for the base compaction of scenarios 2 and 3")
    res = base_job["result"]
    if res.get("error"):
        raise RuntimeError(f"base compaction for scenarios 2/3 failed: {res['error']}\n{res.get('traceback', '')}")
    from flash_pipeline import Catalog

    cat = Catalog(base_lake)
    latest = cat.latest_compacted("orders", ())
    compacted = [{"path": cat.storage.arrow_source(f.key), "position": 0, "file": f.file_number, "op": "upsert"} for f in sorted(latest.files, key=lambda f: f.file_number)]
    g2 = Generator(seed, capacity=int(N * 1.2) + 1000)
    g2.base(N, 10)
    spread = write_delta(g2.upsert(N // 100, 0, 1, dup_frac=0.0), data / "files" / "s2", "spread")
    # keys living in the middle compacted file
    target = compacted[len(compacted) // 2]
    ft = pq.read_table(target["path"], columns=["order_id", "region"])
    oid = ft["order_id"].to_numpy()
    ridx = pa.compute.index_in(ft["region"], pa.array(REGIONS)).to_numpy()
    j = oid - 10_000_000
    bit = (ridx - (j * 2654435761 % 8)) % 8
    keys = 2 * j + bit
    assert (bit <= 1).all() and (key_columns(keys)[0] == oid).all()
    g3 = Generator(seed, capacity=int(N * 1.2) + 1000)
    g3.base(N, 10)
    clustered = write_delta(g3.upsert(N // 100, 0, 1, keys=keys, dup_frac=0.0), data / "files" / "s3", "clustered")
    for name, gen, fl in (("s2_incremental", g2, spread), ("s3_clustered", g3, clustered)):
        lake = data / "lakes" / name
        subprocess.run(["cp", "-al", str(base_lake), str(lake)], check=True)
        _append_all(lake, "orders", [{"op": "upsert", "files": fl}])
        inputs = compacted + [{"path": fl[0], "position": 1, "file": 1, "op": "upsert"}]
        info["scenarios"][name] = {
            "lake": str(lake), "inputs": inputs, "expected_rows": gen.live_rows,
            "input_rows": sum(pq.read_metadata(f["path"]).num_rows for f in inputs),
            "delta_rows": pq.read_metadata(fl[0]).num_rows, "compacted_files": len(compacted),
            "rows_per_compacted_file": N // 10, "target_file": target["file"],
        }
    lap("scenarios 2 and 3 (deltas and lakes)")

    info["prepare_seconds"] = round(time.perf_counter() - t, 1)
    stamp.write_text(json.dumps(info))
    return info


# ----- running one measurement ---------------------------------------------------------------------------------
class TreeSampler:
    """Samples the summed RSS of a process and all its descendants every ``interval`` seconds, and their summed
    PSS every ``pss_every``-th sample (0: never).

    The summed RSS counts a page once per process that maps it: shared libraries, and Ray's object store (shared
    memory every worker that reads an object maps), so for a tree of processes it is an upper bound. The summed
    PSS (proportional set size, /proc/PID/smaps_rollup) shares each such page among the processes that map it,
    so it adds up to what the tree costs the machine. Reading it walks each process's page tables under their
    memory map locks: 18 ms for a warm Ray's 10 processes holding 1.2 GiB, against 1.8 ms for their RSS
    (measured on the 2-core VM). That is only ~2% of a core every 500 ms, but it stalls the processes' own page
    faults and mappings: paired on s1 (6 alternating pairs, 2026-11-28), warm Ray took a median 4.24 s without
    and 4.85 s with it, while one in-process engine was unaffected (4.09 vs 4.03 s). Timed runs therefore sample
    RSS only (``pss_every=0``), and PSS comes from separate memory runs (MEMORY_RUNS)."""

    def __init__(self, pid: int, interval: float = 0.05, pss_every: int = 0) -> None:
        self.pid = pid
        self.interval = interval
        self.pss_every = max(0, pss_every)
        self.samples: list[tuple[float, int, int]] = []  # (time, rss sum, process count)
        self.pss_samples: list[tuple[float, int]] = []  # (time, pss sum)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        tick = 0
        while not self._stop.is_set():
            total, count, pss = 0, 0, 0
            with_pss = bool(self.pss_every) and tick % self.pss_every == 0
            tick += 1
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for p in procs:
                try:
                    if with_pss:
                        full = p.memory_full_info()
                        total += full.rss
                        pss += full.pss
                    else:
                        total += p.memory_info().rss
                    count += 1
                except (psutil.Error, AttributeError):  # AttributeError: no PSS on this platform
                    with_pss = False
            now = time.time()
            if count:
                self.samples.append((now, total, count))
                if with_pss:
                    self.pss_samples.append((now, pss))
            self._stop.wait(self.interval)

    def peak(self, t0: float | None = None, t1: float | None = None) -> int:
        vals = [s[1] for s in self.samples if (t0 is None or s[0] >= t0) and (t1 is None or s[0] <= t1)]
        return max(vals) if vals else 0

    def before(self, t0: float) -> int:
        vals = [s[1] for s in self.samples if s[0] < t0]
        return vals[-1] if vals else 0

    def peak_pss(self, t0: float | None = None, t1: float | None = None) -> int | None:
        vals = [s[1] for s in self.pss_samples if (t0 is None or s[0] >= t0) and (t1 is None or s[0] <= t1)]
        return max(vals) if vals else None

    def pss_before(self, t0: float) -> int | None:
        vals = [s[1] for s in self.pss_samples if s[0] < t0]
        return vals[-1] if vals else None


def input_paths(spec: dict[str, Any]) -> list[Path]:
    """The files an engine run reads: a peer's input files, or every file of each of our jobs' lakes."""
    paths = [Path(f["path"]) for f in spec.get("inputs", [])]
    for job in spec.get("jobs", []):
        if job.get("lake"):
            paths += sorted(p for p in Path(job["lake"]).rglob("*") if p.is_file())
    return paths


def prime_page_cache(paths: list[Path]) -> int:
    """Read ``paths`` once, outside every timed region, so each engine's run starts with its inputs in the page
    cache. This VM pages out memory left idle for 60 s (DAMON, ``memory_reclaim``): the copy floor's first s5
    run once took 22.1 s against 3.5 s for the next two, because its inputs (s1's files) had last been read 21
    minutes before; whichever engine read them first paid for the disk. Returns the bytes read."""
    total = 0
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as fh:
                while chunk := fh.read(8 << 20):
                    total += len(chunk)
        except OSError:  # an engine that cannot read it says so itself
            continue
    return total


def run_worker(spec: dict[str, Any], tmp: Path, sampler_out: list[TreeSampler] | None = None, profile_to: Path | None = None,
               pss: bool = False) -> dict[str, Any]:
    """Runs one engine subprocess on ``spec`` while sampling its process tree's RSS (and PSS when ``pss``: a
    memory run, whose times are not reported as timings; see TreeSampler)."""
    tmp.mkdir(parents=True, exist_ok=True)
    tag = f"{spec['engine']}-{time.time_ns()}"
    spec = {**spec, "result_path": str(tmp / f"{tag}.result.json"), "tmp_dir": str(tmp / f"{tag}.tmp")}
    Path(spec["tmp_dir"]).mkdir(parents=True, exist_ok=True)
    spec.setdefault("out_dir", str(tmp / f"{tag}.out"))
    Path(spec["out_dir"]).mkdir(parents=True, exist_ok=True)
    spec_path = tmp / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "POLARS_MAX_THREADS": str(CORES), "OMP_NUM_THREADS": str(CORES), "RAY_DEDUP_LOGS": "0",
           "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    prime_page_cache(input_paths(spec))
    log = open(tmp / f"{tag}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.engines", str(spec_path)], cwd=ROOT, env=env, stdout=log, stderr=log)
    spy = None
    if profile_to is not None and shutil.which("py-spy", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")):
        spy_bin = shutil.which("py-spy", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
        spy = subprocess.Popen([spy_bin, "record", "--pid", str(proc.pid), "--subprocesses", "--format", "raw", "--rate", "100",
                                "--nonblocking", "-o", str(profile_to)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with TreeSampler(proc.pid, pss_every=PSS_EVERY if pss else 0) as sampler:
        proc.wait()
    if spy is not None:
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.terminate()
    log.close()
    rp = Path(spec["result_path"])
    if not rp.exists():
        tail = (tmp / f"{tag}.log").read_text(errors="replace")[-3000:]
        return {"error": f"worker exited with code {proc.returncode} and no result", "traceback": tail, "seconds": None, "intervals": []}
    res = json.loads(rp.read_text())
    ivs = res.get("intervals") or []
    res["peak_rss"] = sampler.peak()
    res["peak_rss_timed"] = [sampler.peak(a, b) for _, a, b in ivs]
    res["rss_before_timed"] = [sampler.before(a) for _, a, b in ivs]
    res["peak_pss"] = sampler.peak_pss()
    res["peak_pss_timed"] = [sampler.peak_pss(a, b) for _, a, b in ivs]
    res["pss_before_timed"] = [sampler.pss_before(a) for _, a, b in ivs]
    res["log"] = str(tmp / f"{tag}.log")
    if sampler_out is not None:
        sampler_out.append(sampler)
    return res


# ----- verification ----------------------------------------------------------------------------------------------
def digest(files: list[str]) -> tuple[int, str]:
    """(rows, hash of the rows sorted by primary key) of parquet files, independent of file split and types."""
    return digest_tables([pq.read_table(f, columns=COLUMNS) for f in files])


def digest_tables(tables: list[pa.Table]) -> tuple[int, str]:
    """``digest`` of tables already read (e.g. a compacted table's live rows, deletion vectors applied)."""
    tables = [t.select(COLUMNS).cast(SCHEMA) for t in tables if t.num_rows]
    if not tables:
        return 0, "empty"
    t = pa.concat_tables(tables)
    t = t.take(pc.sort_indices(t, sort_keys=[("order_id", "ascending"), ("region", "ascending")]))
    h = hashlib.blake2b(digest_size=16)
    for name in COLUMNS:
        col = t[name].combine_chunks()
        h.update(name.encode())
        h.update(np.asarray(col.is_null()).tobytes() if col.null_count else b"no-nulls")
        if pa.types.is_string(col.type):
            col = col.cast(pa.large_string())
            _, offsets, data = col.buffers()
            off = np.frombuffer(offsets, dtype=np.int64)[col.offset : col.offset + len(col) + 1]
            h.update((off - off[0]).tobytes())
            h.update(memoryview(data)[off[0] : off[-1]])
        else:
            h.update(col.to_numpy(zero_copy_only=False).tobytes())
    return t.num_rows, h.hexdigest()


class Verifier:
    def __init__(self) -> None:
        self.reference: dict[str, tuple[int, str, str]] = {}

    def check(self, scenario: str, engine: str, files: list[str], expected_rows: int) -> str:
        rows, h = digest(files)
        return self.check_digest(scenario, engine, rows, h, expected_rows)

    def check_digest(self, scenario: str, engine: str, rows: int, h: str, expected_rows: int) -> str:
        if rows != expected_rows:
            raise MismatchError(f"{scenario}: {engine} wrote {rows} rows, the true result has {expected_rows}")
        if engine.startswith("copy"):  # the floor writes the right number of rows, not the right rows
            return h
        ref = self.reference.get(scenario)
        if ref is None:
            self.reference[scenario] = (rows, h, engine)
        elif ref[1] != h:
            raise MismatchError(f"{scenario}: {engine}'s rows differ from {ref[2]}'s ({rows} rows each; hash {h} != {ref[1]})")
        return h


# ----- scenarios ---------------------------------------------------------------------------------------------------
def _ours_job(scen: str, s: dict[str, Any], run_dir: Path, N: int) -> dict[str, Any]:
    """Our engine's job for one scenario, on its own (hard-linked) copy of the scenario's lake."""
    lake = run_dir / "lake"
    if lake.exists():
        shutil.rmtree(lake)
    subprocess.run(["cp", "-al", s["lake"], str(lake)], check=True)
    job: dict[str, Any] = {"lake": str(lake), "label": scen, "rows_per_compacted_file": N // 10 if scen in ("s2_incremental", "s3_clustered") else 4_000_000}
    if scen == "s5_over_budget":
        job["max_round_bytes"] = s["memory_budget"]
    return job


def engine_spec(engine: str, scen: str, info: dict[str, Any], s: dict[str, Any], run_dir: Path, N: int) -> dict[str, Any]:
    if engine.startswith("ours"):
        spec = {"engine": engine, "jobs": [_ours_job(scen, s, run_dir, N)], "warmup_lake": _warm_copy(info, run_dir)}
        if engine == "ours_warm" and scen == "s5_over_budget":  # the budget's scenario: live memory of every Ray process
            spec["ray_live_memory_dir"] = str(run_dir / "live")
        return spec
    spec = {"engine": engine, "inputs": s["inputs"], "columns": COLUMNS, "expected_rows": s["expected_rows"]}
    if scen == "s5_over_budget":
        spec["memory_budget"] = s["memory_budget"]
        spec["spark_driver_memory"] = "1g"
    return spec


def _warm_copy(info: dict[str, Any], run_dir: Path) -> str:
    dst = run_dir / "warmup"
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run(["cp", "-al", info["warmup_lake"], str(dst)], check=True)
    return str(dst)


def _record(engine: str, res: dict[str, Any], job: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """One run's record and output files from a worker's result: a fresh worker (``job`` None: its only run) or
    job ``job`` of a batched worker (seconds, peak and "rss before" all taken within that job's timed interval)."""
    if job is None:
        c = (res.get("compactions") or [{}])[0]
        rec = {
            "seconds": res.get("seconds"), "peak_rss": res.get("peak_rss"),
            "peak_rss_timed": (res.get("peak_rss_timed") or [None])[0],
            "rss_before_timed": (res.get("rss_before_timed") or [None])[0],
            "peak_pss": res.get("peak_pss"), "peak_pss_timed": (res.get("peak_pss_timed") or [None])[0],
            "pss_before_timed": (res.get("pss_before_timed") or [None])[0],
            "error": res.get("error"),
        }
        files = res.get("output_files") or []
        if engine == "spark":
            rec["seconds_excluding_jvm_start"] = res.get("seconds_excluding_jvm_start")
    elif job >= len(res.get("compactions") or []):  # the worker died before this job
        c = {}
        rec = {"seconds": None, "peak_rss": None, "peak_rss_timed": None, "rss_before_timed": None, "batched": True,
               "error": res.get("error") or "the batched worker stopped before this scenario"}
        files = []
    else:
        c = res["compactions"][job]
        peak = res["peak_rss_timed"][job]
        pss = (res.get("peak_pss_timed") or [None] * (job + 1))[job]
        rec = {"seconds": c["seconds"], "peak_rss": peak, "peak_rss_timed": peak, "rss_before_timed": res["rss_before_timed"][job],
               "peak_pss": pss, "peak_pss_timed": pss, "pss_before_timed": (res.get("pss_before_timed") or [None] * (job + 1))[job],
               "error": c.get("error"), "batched": True}
        files = c.get("output_files") or []
        if engine == "spark":  # a fresh JVM per run pays its start: add the start measured once, keep the query alone too
            rec["seconds_excluding_jvm_start"] = c["seconds"]
            rec["jvm_start_seconds"] = res["jvm_start_seconds"]
            rec["seconds"] = c["seconds"] + res["jvm_start_seconds"]
    if res.get("ray_start_retries"):
        rec["ray_start_retries"] = res["ray_start_retries"]
    if engine.startswith("ours"):
        rec.update({k: c.get(k) for k in ("step_seconds", "expected_seconds", "rows_in", "rows_out", "files_written", "files_carried",
                                           "bytes_written", "bytes_carried", "bytes_read", "hash_bucket_count", "rounds", "prior_rows",
                                           "index_bytes_written", "live_peak_increase", "live_parts",
                                           "live_at_peak", "live_peak_at_seconds")})
    if rec["error"]:
        rec["traceback"] = (c.get("traceback") or res.get("traceback") or "")[-2000:]
    return rec, files


def _verified(verifier: Verifier, scen: str, engine: str, r: int, rec: dict[str, Any], files: list[str], s: dict[str, Any], run_dir: Path, log: Any) -> dict[str, Any]:
    """Checks a run's output against the other engines' (MismatchError on a difference), logs it, frees its disk."""
    if rec["error"]:
        log(f"  {scen} run {r} {engine}: ERROR {rec['error']}")
        return rec
    rec["hash"] = verifier.check(scen, engine, files, s["expected_rows"])
    extra = f" (query {rec['seconds_excluding_jvm_start']:.2f}s + JVM start)" if rec.get("batched") and engine == "spark" else ""
    log(f"  {scen} run {r} {engine}: {rec['seconds']:.2f}s{extra} peak {rec['peak_rss'] / 2**20:.0f} MiB (verified)")
    shutil.rmtree(run_dir / "out", ignore_errors=True)
    shutil.rmtree(run_dir / "lake", ignore_errors=True)
    return rec


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _run_fresh(engine: str, scen: str, r: int | str, info: dict[str, Any], workdir: Path, N: int, verifier: Verifier, log: Any,
               pss: bool = False) -> dict[str, Any]:
    """Run ``r`` of ``engine`` on ``scen`` in a fresh subprocess, verified (with ``pss``: a memory run)."""
    s = info["scenarios"][scen]
    run_dir = _fresh_dir(workdir / scen / f"{engine}-{r}")
    spec = engine_spec(engine, scen, info, s, run_dir, N)
    spec["out_dir"] = str(run_dir / "out")
    rec, files = _record(engine, run_worker(spec, run_dir, pss=pss))
    return _verified(verifier, scen, engine, r, rec, files, s, run_dir, log)


# Memory runs: one extra untimed run per (scenario, engine) of the memory targets, the only runs that sample PSS
# (it slows a multi-process engine: TreeSampler). Scenario 1's peak against DuckDB's, scenario 5's increase
# within the budget.
MEMORY_RUNS = {
    "small": {"s1_full": ("ours_inprocess", "duckdb")},
    "full": {"s1_full": ("ours_warm", "ours_inprocess", "ours_command", "duckdb"), "s5_over_budget": ("ours_warm", "ours_inprocess")},
}
PSS_EVERY = 10  # with the 50 ms RSS interval: PSS every 500 ms


def run_memory(info: dict[str, Any], cfg: dict[str, Any], plan: dict[str, tuple[str, ...]], results: dict[str, Any], engines: list[str],
               workdir: Path, log: Any) -> None:
    """One memory run (PSS sampled, fresh subprocess, verified like the others) per planned (scenario, engine)
    that the timed runs measured, recorded as ``results[scen]["memory_runs"][engine]``; their outputs must equal
    the timed runs' (the verifier starts from a timed run's hash)."""
    verifier = Verifier()
    for scen, wanted in plan.items():
        if scen not in results:
            continue
        timed = [(e, r["hash"]) for e, recs in results[scen]["runs"].items() for r in recs if r.get("hash") and not e.startswith("copy")]
        if timed:
            verifier.reference[scen] = (info["scenarios"][scen]["expected_rows"], timed[0][1], f"{timed[0][0]} (timed run)")
        for engine in [e for e in wanted if e in engines]:
            rec = _run_fresh(engine, scen, "memory", info, workdir, cfg["rows"], verifier, log, pss=True)
            results[scen].setdefault("memory_runs", {})[engine] = [rec]


def run_scenarios(info: dict[str, Any], cfg: dict[str, Any], runs: int, scenarios: list[str], engines: list[str], workdir: Path, log: Any) -> dict[str, Any]:
    """Every run of every engine in a fresh subprocess (the full-scale methodology)."""
    verifier = Verifier()
    N = cfg["rows"]
    out: dict[str, Any] = {}
    for scen in scenarios:
        s = info["scenarios"][scen]
        out[scen] = {"runs": {e: [] for e in engines}, "info": {k: v for k, v in s.items() if k not in ("inputs",)}}
        for r in range(runs):
            order = engines[r % len(engines):] + engines[: r % len(engines)]  # alternate who goes first
            for engine in order:
                out[scen]["runs"][engine].append(_run_fresh(engine, scen, r, info, workdir, N, verifier, log))
    return out


BATCHED = ("ours_warm", "spark")  # engines whose runtime starts slowly: one subprocess runs every scenario in batched mode
COLD_SCENARIO = "s1_full"  # the one scenario cold Ray is measured on in batched mode


def run_batched(info: dict[str, Any], cfg: dict[str, Any], runs: int, scenarios: list[str], engines: list[str], workdir: Path, log: Any,
                sweeps: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Batched mode: warm Ray and Spark each run every scenario in ONE subprocess (one Ray session, one JVM; each
    scenario timed alone, Spark's seconds plus its JVM start measured once); cold Ray runs scenario 1 only (one
    fresh process); the copy floor, DuckDB and Polars run one fresh subprocess per scenario. Outputs are verified
    exactly as in ``run_scenarios``. With ``sweeps`` the sweep jobs follow the scenarios in the first warm worker
    (the same Ray session); returns (results, sweeps or None when no warm worker ran them)."""
    verifier = Verifier()
    N = cfg["rows"]
    out: dict[str, Any] = {}
    for scen in scenarios:
        s = info["scenarios"][scen]
        runs_of = {e: [] for e in engines if e != "ours_cold" or scen == COLD_SCENARIO}
        out[scen] = {"runs": runs_of, "info": {k: v for k, v in s.items() if k not in ("inputs",)}}
    sweep_out: dict[str, Any] | None = None
    for r in range(runs):
        order = engines[r % len(engines):] + engines[: r % len(engines)]  # alternate who goes first
        for engine in order:
            if engine in BATCHED:
                dirs = {scen: _fresh_dir(workdir / scen / f"{engine}-{r}") for scen in scenarios}
                bdir = _fresh_dir(workdir / "batched" / f"{engine}-{r}")
                if engine == "ours_warm":
                    jobs = [_ours_job(scen, info["scenarios"][scen], dirs[scen], N) for scen in scenarios]
                    if sweeps and sweep_out is None:
                        jobs += sweep_jobs(info, cfg, bdir)
                    spec = {"engine": engine, "jobs": jobs, "warmup_lake": _warm_copy(info, bdir)}
                else:
                    jobs = [{"label": scen, "inputs": info["scenarios"][scen]["inputs"], "out_dir": str(dirs[scen] / "out")} for scen in scenarios]
                    spec = {"engine": engine, "jobs": jobs, "columns": COLUMNS, "spark_driver_memory": SPARK_BATCHED_DRIVER_MEMORY}
                for d in dirs.values():
                    (d / "out").mkdir()
                log(f"  run {r} {engine}: one subprocess for {len(scenarios)} scenario(s)")
                res = run_worker(spec, bdir)
                failed = False
                for i, scen in enumerate(scenarios):
                    rec, files = _record(engine, res, i)
                    out[scen]["runs"][engine].append(_verified(verifier, scen, engine, r, rec, files, info["scenarios"][scen], dirs[scen], log))
                    failed = failed or bool(rec["error"])
                if len(spec["jobs"]) > len(scenarios):
                    sweep_out = sweep_results(info, res, len(scenarios), log)
                if not failed:  # keep the worker's log when a scenario failed
                    shutil.rmtree(bdir, ignore_errors=True)
                continue
            for scen in scenarios:
                if engine in out[scen]["runs"]:
                    out[scen]["runs"][engine].append(_run_fresh(engine, scen, r, info, workdir, N, verifier, log))
    return out, sweep_out


def sweep_jobs(info: dict[str, Any], cfg: dict[str, Any], d: Path) -> list[dict[str, Any]]:
    """Warm jobs of the plot sweeps (lakes hard-linked under ``d``): throughput vs hash buckets (scenario 1 data)
    and latency/memory vs input size, one round and one round per base file."""
    jobs = []
    for b in cfg["buckets"]:
        lake = d / f"buckets-{b}"
        subprocess.run(["cp", "-al", info["scenarios"]["s1_full"]["lake"], str(lake)], check=True)
        jobs.append({"lake": str(lake), "hash_bucket_count": b, "label": f"buckets={b}"})
    lake = d / "sizes"
    subprocess.run(["cp", "-al", info["sizes_lake"], str(lake)], check=True)
    for k in cfg["sizes"]:
        jobs.append({"lake": str(lake), "table": f"size_{k}", "label": f"size={k}"})
        jobs.append({"lake": str(lake), "table": f"size_{k}", "label": f"size={k} bounded", "max_round_bytes": info["base_file_bytes"],
                     "destination_compacted_table_id": f"size_{k}_bounded"})  # one base file per round
    # the incremental scenarios' table compacted from scratch (every delta again, the index ignored): what the
    # primary key index saves a 1% delta
    for scen in ("s2_incremental", "s3_clustered"):
        for run in range(cfg["runs"]) if scen in info["scenarios"] else ():
            lake = d / f"{scen}-from-scratch-{run}"
            subprocess.run(["cp", "-al", info["scenarios"][scen]["lake"], str(lake)], check=True)
            jobs.append({"lake": str(lake), "label": f"{scen} from scratch", "rebuild": True,
                         "rows_per_compacted_file": info["scenarios"][scen].get("rows_per_compacted_file", 4_000_000)})
    return jobs


def sweep_results(info: dict[str, Any], res: dict[str, Any], first: int, log: Any) -> dict[str, Any]:
    """The sweeps' part of a warm worker's result: its jobs from index ``first`` on."""
    if res.get("error") and len(res.get("compactions") or []) <= first:
        log(f"  sweeps: ERROR {res['error']}")
        return {"error": res["error"]}
    out = []
    for c, (label, a, b), peak, before in list(zip(res["compactions"], res["intervals"], res["peak_rss_timed"], res["rss_before_timed"]))[first:]:
        out.append({**{k: v for k, v in c.items() if k != "output_files"}, "peak_rss": peak, "rss_before": before})
        log(f"  sweep {label}: {c['seconds']:.2f}s peak {peak / 2**20:.0f} MiB" + (f" ERROR {c['error']}" if c.get("error") else ""))
    return {"jobs": out, "round_budget_bytes": info["base_file_bytes"], "size_rows": info["size_rows"], "size_bytes": info["size_bytes"]}


def run_sweeps(info: dict[str, Any], cfg: dict[str, Any], workdir: Path, log: Any) -> dict[str, Any]:
    """The sweeps in a warm worker of their own."""
    d = _fresh_dir(workdir / "sweeps")
    res = run_worker({"engine": "ours_warm", "jobs": sweep_jobs(info, cfg, d), "warmup_lake": _warm_copy(info, d)}, d)
    out = sweep_results(info, res, 0, log)
    shutil.rmtree(d, ignore_errors=True)
    return out


# ----- profile ---------------------------------------------------------------------------------------------------------
def _func(frame: str) -> str:
    """A py-spy frame's function name without its qualifier: ``_remote_functions.<locals>.dedupe_step (file:line)``
    -> ``dedupe_step``."""
    return frame.split(" ")[0].rsplit(".", 1)[-1]


STEP_FUNCS = {"hash_bucket_step": "hash_bucket", "dedupe_step": "dedupe", "materialize_step": "materialize", "index_step": "materialize (index write)"}


def profile_scenario(info: dict[str, Any], cfg: dict[str, Any], scen: str, workdir: Path, log: Any) -> dict[str, Any]:
    """py-spy (all processes of the tree, Ray workers included) over one warm run; top frames of the slowest step."""
    d = workdir / "profile" / scen
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    s = info["scenarios"][scen]
    spec = engine_spec("ours_warm", scen, info, s, d, cfg["rows"])
    raw = d / "pyspy.txt"
    res = run_worker(spec, d, profile_to=raw)
    if not raw.exists():
        return {"error": "py-spy produced no profile (not installed or not permitted)", "step_seconds": (res.get("compactions") or [{}])[0].get("step_seconds")}
    return parse_profile(raw, (res.get("compactions") or [{}])[0].get("step_seconds"))


def parse_profile(raw: Path, step_seconds: dict[str, float] | None) -> dict[str, Any]:
    """Samples per compaction step of a py-spy raw profile, and the top frames of the step with the most samples."""
    by_step: dict[str, int] = {}
    self_by_step: dict[str, dict[str, int]] = {}
    incl_by_step: dict[str, dict[str, int]] = {}
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        step = next((STEP_FUNCS[_func(f)] for f in frames if _func(f) in STEP_FUNCS), None)
        if step is None:
            continue
        total += n
        by_step[step] = by_step.get(step, 0) + n
        leaf = frames[-1]
        self_by_step.setdefault(step, {})[leaf] = self_by_step.setdefault(step, {}).get(leaf, 0) + n
        seen = set()
        idx = next(i for i, f in enumerate(frames) if _func(f) in STEP_FUNCS)
        for f in frames[idx + 1 :]:
            if f not in seen:
                seen.add(f)
                incl = incl_by_step.setdefault(step, {})
                incl[f] = incl.get(f, 0) + n
    if not by_step:
        return {"error": "no samples inside compaction steps", "step_seconds": step_seconds}
    slow = max(by_step, key=by_step.get)
    top_self = sorted(self_by_step[slow].items(), key=lambda kv: -kv[1])[:12]
    top_incl = sorted(incl_by_step.get(slow, {}).items(), key=lambda kv: -kv[1])[:15]
    return {
        "samples_by_step": by_step, "slowest_step": slow, "samples": total,
        "top_self": [[f, n] for f, n in top_self], "top_inclusive": [[f, n] for f, n in top_incl],
        "step_seconds": step_seconds,
    }


# ----- report ------------------------------------------------------------------------------------------------------
def summarize(results: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for scen, data in results.items():
        rows_in = info["scenarios"][scen]["input_rows"]
        per: dict[str, Any] = {}
        for engine, runs in data["runs"].items():
            ok = [r for r in runs if not r.get("error") and r.get("seconds") is not None]
            if not ok:
                per[engine] = {"error": runs[0]["error"] if runs else "not run", "available": False}
                continue
            med = statistics.median(r["seconds"] for r in ok)
            per[engine] = {
                "available": True, "median_s": med, "runs_s": [r["seconds"] for r in ok],
                "peak_mib": max(r["peak_rss"] for r in ok) / 2**20,
                "peak_timed_increase_mib": max((r["peak_rss_timed"] or 0) - (r["rss_before_timed"] or 0) for r in ok) / 2**20,
                "rows_per_s_core": rows_in / med / CORES,
            }
            # PSS: from the memory run where there is one; results recorded before memory runs sampled it in every run
            mem = [r for r in (data.get("memory_runs") or {}).get(engine, []) if not r.get("error")]
            sampled = mem or ok
            pss = [r for r in sampled if r.get("peak_pss") and r.get("pss_before_timed") is not None]
            if pss and len(pss) == len(sampled):
                per[engine]["peak_pss_mib"] = max(r["peak_pss"] for r in pss) / 2**20
                per[engine]["peak_pss_timed_increase_mib"] = max((r["peak_pss_timed"] or 0) - r["pss_before_timed"] for r in pss) / 2**20
                per[engine]["pss_from_memory_run"] = bool(mem)
            if engine.startswith("ours"):
                best = sorted(ok, key=lambda r: r["seconds"])[len(ok) // 2]
                per[engine]["step_seconds"] = best.get("step_seconds")
                per[engine]["expected_seconds"] = best.get("expected_seconds")
                per[engine]["files_written"] = best.get("files_written")
                per[engine]["files_carried"] = best.get("files_carried")
                per[engine]["rounds"] = best.get("rounds")
                lives = [r["live_peak_increase"] for r in ok if r.get("live_peak_increase") is not None]
                if lives:
                    per[engine]["live_peak_increase_mib"] = max(lives) / 2**20
                    parts = max((r for r in ok if r.get("live_parts")), key=lambda r: r["live_peak_increase"], default=None)
                    if parts is not None:
                        per[engine]["live_parts_mib"] = {k: v / 2**20 for k, v in parts["live_parts"].items()}
                        if parts.get("live_at_peak") is not None:
                            per[engine]["live_at_peak_mib"] = {k: v / 2**20 for k, v in parts["live_at_peak"].items()}
                            per[engine]["live_peak_at_seconds"] = parts.get("live_peak_at_seconds")
                for key in ("bytes_read", "bytes_written", "bytes_carried", "index_bytes_written"):
                    per[engine][key] = best.get(key)
            if engine == "spark":
                per[engine]["median_s_excluding_jvm_start"] = statistics.median(r["seconds_excluding_jvm_start"] for r in ok)
        floor = per.get("copy", {}).get("median_s")
        for engine, p in per.items():
            if p.get("available") and floor:
                p["x_copy_floor"] = p["median_s"] / floor
        summary[scen] = per
    return summary


def targets(summary: dict[str, Any], info: dict[str, Any]) -> list[dict[str, Any]]:
    out = []

    def get(scen: str, engine: str, key: str = "median_s") -> float | None:
        p = summary.get(scen, {}).get(engine, {})
        return p.get(key) if p.get("available") else None

    def add(name: str, measured: float | None, limit: float | None, unit: str, lower_is_better: bool = True) -> None:
        if measured is None or limit is None:
            out.append({"target": name, "measured": None, "limit": limit, "status": "N/A"})
            return
        ok = measured <= limit if lower_is_better else measured >= limit
        by = (measured / limit - 1) if lower_is_better else (1 - measured / limit)
        out.append({"target": name, "measured": measured, "limit": limit, "unit": unit, "status": "PASS" if ok else "MISS", "miss_by": None if ok else by})

    fl1 = get("s1_full", "copy")
    w1 = get("s1_full", "ours_warm")
    add("(1) warm <= 1.3x copy floor", w1 / fl1 if w1 and fl1 else None, 1.3, "x floor")
    for peer in ("polars", "duckdb", "spark"):
        p = get("s1_full", peer)
        add(f"(1) warm faster than {peer}", w1 / p if w1 and p else None, 1.0, "x peer")
    c1, dk = get("s1_full", "ours_cold"), get("s1_full", "duckdb")
    add("(1) cold faster than duckdb", c1 / dk if c1 and dk else None, 1.0, "x duckdb")
    w2, fl2 = get("s2_incremental", "ours_warm"), get("s2_incremental", "copy")
    add("(2) warm <= 1.2x copy floor", w2 / fl2 if w2 and fl2 else None, 1.2, "x floor")
    w3 = get("s3_clustered", "ours_warm")
    peers3 = [get("s3_clustered", p) for p in ("duckdb", "polars", "spark")]
    fastest = min([p for p in peers3 if p] or [0]) or None
    add("(3) warm >= 5x faster than the fastest peer", fastest / w3 if w3 and fastest else None, 5.0, "x speed-up", lower_is_better=False)
    s5 = summary.get("s5_over_budget", {}).get("ours_warm", {})
    budget = info["scenarios"].get("s5_over_budget", {}).get("memory_budget")
    if s5.get("available") and budget:
        add("(5) warm peak memory increase within the budget", s5["peak_timed_increase_mib"], budget / 2**20, "MiB")
    else:
        out.append({"target": "(5) completes within the memory budget (MiB)", "measured": None, "limit": budget / 2**20 if budget else None,
                    "status": "N/A" if not s5 else "MISS",
                    "note": s5.get("error")})
    if s5.get("peak_pss_timed_increase_mib") is not None and budget:
        add("(5) warm peak PSS increase within the budget", s5["peak_pss_timed_increase_mib"], budget / 2**20, "MiB")
    live5 = summary.get("s5_over_budget", {}).get("ours_inprocess", {}).get("live_peak_increase_mib")
    if live5 is not None and budget:
        add("(5) in-process live memory increase within the budget", live5, budget / 2**20, "MiB")
    live5w = summary.get("s5_over_budget", {}).get("ours_warm", {}).get("live_peak_increase_mib")
    if live5w is not None and budget:
        add("(5) warm live memory increase (driver, workers, object store) within the budget", live5w, budget / 2**20, "MiB")
    m1, md = get("s1_full", "ours_warm", "peak_mib"), get("s1_full", "duckdb", "peak_mib")
    add("(1) warm peak memory <= DuckDB's", m1 / md if m1 and md else None, 1.0, "x duckdb")
    p1, pd = get("s1_full", "ours_warm", "peak_pss_mib"), get("s1_full", "duckdb", "peak_pss_mib")
    if p1 and pd:
        add("(1) warm peak PSS <= DuckDB's", p1 / pd, 1.0, "x duckdb")
    mc = get("s1_full", "ours_cold", "peak_mib")
    add("(1) cold peak memory <= DuckDB's", mc / md if mc and md else None, 1.0, "x duckdb")
    # issue 15's targets (ratios to the copy floor of the same run)
    for scen, engine, limit, what in (
        ("s1_full", "ours_warm", 1.15, "s1 warm"), ("s1_full", "ours_command", 1.5, "s1 as a fresh command"),
        ("s3_clustered", "ours_warm", 0.15, "s3 warm"), ("s3_clustered", "ours_command", 0.5, "s3 as a fresh command"),
        ("s4_small_files", "ours_warm", 1.0, "s4 warm"), ("s4_small_files", "ours_inprocess", 1.0, "s4 in-process"),
        ("s5_over_budget", "ours_warm", 2.5, "s5 warm"), ("s5_over_budget", "ours_inprocess", 2.5, "s5 in-process"),
    ):
        ours, floor = get(scen, engine), get(scen, "copy")
        add(f"(15) {what} <= {limit}x copy floor", ours / floor if ours and floor else None, limit, "x floor")
    mi = get("s1_full", "ours_inprocess", "peak_mib")
    add("(15) s1 in-process peak memory <= DuckDB's", mi / md if mi and md else None, 1.0, "x duckdb")
    return out


def memory_reclaim(root: Path = Path("/sys/kernel/mm/damon/admin/kdamonds")) -> str:
    """What the kernel does to idle memory behind the engines' backs: a running DAMON scheme that pages out
    memory idle for a while makes a run's reads cost differently from run to run. This project's VM pages out
    memory idle for 60 s, at most 128 MiB a second: on 2026-11-28 s5's input lake (404 MB) had 31 MB left in the
    page cache hours after it was last read, s1's 394 MB 15 minutes after. "" when none runs (or not Linux)."""
    found = []
    for kdamond in sorted(root.glob("[0-9]*")):
        try:
            if (kdamond / "state").read_text().strip() != "on":
                continue
            for scheme in sorted(kdamond.glob("contexts/*/schemes/[0-9]*")):
                action = (scheme / "action").read_text().strip()
                attrs = scheme.parent.parent / "monitoring_attrs" / "intervals"
                age = int((scheme / "access_pattern/age/min").read_text()) * int((attrs / "aggr_us").read_text()) / 1e6
                found.append(f"DAMON {action} of memory idle for {age:.0f} s or more")
        except (OSError, ValueError):
            continue
    return "; ".join(found)


def machine() -> dict[str, Any]:
    from importlib.metadata import version  # the installed versions, without importing the engines

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {
        "cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(), "pyarrow": pa.__version__, "ray": version("ray"), "duckdb": version("duckdb"),
        "polars": version("polars"), "spark": version("pyspark"), "java": java[0] if java else "?", "numpy": np.__version__,
        "os": platform.platform(), "memory_reclaim": memory_reclaim(),
        "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
    }


def _opt_mib(mib: float | None) -> str:
    return "" if mib is None else f"{mib:.0f}"


def _mib(n: Any) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


PSS_DEFINITION = (
    "*Peak PSS MiB* is the same tree's summed proportional set size (each shared page divided among the processes that map "
    "it, so it adds up to what the tree costs the machine), sampled every 500 ms"
)
PSS_TEXT = PSS_DEFINITION + "; blank in results recorded before it was sampled. "  # results before memory runs: every timed run
MEMORY_RUN_TEXT = (
    PSS_DEFINITION + " in **one extra untimed memory run** per engine of "
    "the memory targets ({runs}; blank for the others): reading PSS walks the page tables of every process under its memory-map "
    "lock, which slowed warm Ray's s1 by 14% in a paired check while an in-process engine was unaffected, so the timed runs sample RSS "
    "only. "
)


def _pss_text(payload: dict[str, Any]) -> str:
    """What the PSS column means in this payload: memory runs, or (older results) PSS sampled in every timed run."""
    planned = [f"{scen} {engine}" for scen, res in payload["results"].items() for engine in (res.get("memory_runs") or {})]
    return MEMORY_RUN_TEXT.format(runs=", ".join(planned)) if planned else PSS_TEXT


def _methodology(payload: dict[str, Any]) -> str:
    """The methodology paragraph; it names the mode (batched, or a fresh subprocess per run) first."""
    common = (
        "Every engine is limited to 2 cores (Ray `num_cpus=2`, Spark `local[2]`, DuckDB `threads=2`, `POLARS_MAX_THREADS=2`, PyArrow 2 threads). "
        "*rows/s-core* = input rows (deltas + prior compacted rows) / median seconds / 2. "
        "*Warm* = a subprocess that starts Ray (`ray.init(num_cpus=2)`) and compacts a tiny warm-up table first, then times `compact()`; "
        "*cold* = `compact()` timed from the call that starts Ray inside. "
    )
    verified = ("Every output was verified equal across engines (row count, then a hash of all rows sorted by primary key); the copy floor "
                "writes the true number of rows.")
    if payload.get("primed_page_cache"):
        verified += (" Before every run the harness read the run's input files once, outside the timed region, so every engine started "
                     "with its inputs in the page cache.")
    if payload.get("mode") != "batched":
        return (
            "Mode: **a fresh subprocess per run** (every engine, every scenario, every run). " + common
            + "*Peak MiB* is the peak of the summed RSS of that subprocess and all its descendants (Ray GCS, raylet and "
            "workers; the Spark JVM), sampled every 50 ms over the process's whole life (shared pages such as Ray's object store are counted once per "
            "process that maps them, so it is an upper bound). " + _pss_text(payload) + "Spark's time includes starting its JVM (its time without it is in "
            "results.json). " + verified
        )
    jvm = sorted({r["jvm_start_seconds"] for res in payload["results"].values() for r in res["runs"].get("spark", []) if r.get("jvm_start_seconds") is not None})
    jvm_text = f" ({', '.join(f'{x:.1f}' for x in jvm)} s)" if jvm else ""
    return (
        "Mode: **batched** (the default at small scale; `--no-batch` runs the full-scale methodology, a fresh subprocess per run). "
        "Engines whose runtime starts slowly ran every scenario in ONE subprocess: flash warm compacted each scenario's own copy of its lake "
        "in one Ray session, one timed `compact()` per scenario; Spark ran every scenario in one JVM (started once and not stopped between "
        f"scenarios), and each scenario's Spark seconds are its own query and write **plus the JVM start measured once**{jvm_text}, so they stay "
        "comparable with a fresh JVM per run (the time without the JVM start is in results.json and below each table; scenarios after the "
        f"first run on a JVM already warmed by the earlier ones). One JVM means one driver memory setting: {SPARK_BATCHED_DRIVER_MEMORY} for "
        "every scenario, including (5), which gets a 1g driver in fresh-subprocess mode. Flash cold is one fresh process per run by nature and "
        "was **measured for scenario (1) only** in batched mode. The copy floor, DuckDB and Polars ran one fresh subprocess per scenario. "
        + common
        + "*Peak MiB* is the peak of the summed RSS of the subprocess and all its descendants (Ray GCS, raylet and workers; the Spark JVM), "
        "sampled every 50 ms: for a batched engine, within that scenario's timed interval (its increase is over the Ray session or JVM already "
        "running), for the others over the process's whole life (shared pages such as Ray's object store are counted once per process that maps "
        "them, so it is an upper bound). " + _pss_text(payload) + verified
    )


def issue15_scorecard(payload: dict[str, Any], out_dir: Path) -> list[str]:
    """Issue 15's table with its "now" column measured: ratios to the copy floor of this run, beside the peers
    of this run; the command and Dagster rows from results_cold_start.json / results_dagster_run.json beside
    results.md (benchmarks.cold_start, benchmarks.dagster_run), when present."""
    summary = payload["summary"]

    def med(scen: str, engine: str, key: str = "median_s") -> float | None:
        p = summary.get(scen, {}).get(engine, {})
        return p.get(key) if p.get("available") else None

    def ratio(scen: str, engine: str) -> str:
        ours, floor = med(scen, engine), med(scen, "copy")
        return f"{ours / floor:.2f}x ({ours:.2f} s)" if ours and floor else "n/a"

    def peers(scen: str) -> str:
        floor = med(scen, "copy")
        out = []
        for engine, name in (("duckdb", "DuckDB"), ("polars", "Polars"), ("spark", "Spark")):
            p = med(scen, engine)
            out.append(f"{name} {p / floor:.2f}x" if p and floor else f"{name} n/a")
        return ", ".join(out)

    def status(value: float | None, limit: float) -> str:
        if value is None:
            return "n/a"
        return "met" if value <= limit else f"missed by {value / limit - 1:.0%}"

    def r(scen: str, engine: str) -> float | None:
        ours, floor = med(scen, engine), med(scen, "copy")
        return ours / floor if ours and floor else None

    rows = [
        ("s1 full, Ray warm", ratio("s1_full", "ours_warm"), peers("s1_full"), "<= 1.15x", status(r("s1_full", "ours_warm"), 1.15)),
        ("s1 full, in this process (no Ray)", ratio("s1_full", "ours_inprocess"), peers("s1_full"), "<= 1.15x", status(r("s1_full", "ours_inprocess"), 1.15)),
        ("s1 full, a fresh `flash-compactor compact`", ratio("s1_full", "ours_command"), peers("s1_full"), "<= 1.5x", status(r("s1_full", "ours_command"), 1.5)),
        ("1% updates spread over all keys, warm", ratio("s2_incremental", "ours_warm"), peers("s2_incremental"), "(deletion vectors: issue 16)", "-"),
        ("s3 1% updates clustered in 1 of 10 files, warm", ratio("s3_clustered", "ours_warm"), peers("s3_clustered"), "<= 0.15x", status(r("s3_clustered", "ours_warm"), 0.15)),
        ("the same, as a command", ratio("s3_clustered", "ours_command"), "", "<= 0.5x", status(r("s3_clustered", "ours_command"), 0.5)),
        ("s4 3,000 small deltas, warm", ratio("s4_small_files", "ours_warm"), peers("s4_small_files"), "<= 1.0x", status(r("s4_small_files", "ours_warm"), 1.0)),
        ("s4, in this process", ratio("s4_small_files", "ours_inprocess"), peers("s4_small_files"), "<= 1.0x", status(r("s4_small_files", "ours_inprocess"), 1.0)),
        ("s5 input 10x the memory budget, warm", ratio("s5_over_budget", "ours_warm"), peers("s5_over_budget"), "<= 2.5x", status(r("s5_over_budget", "ours_warm"), 2.5)),
        ("s5, in this process", ratio("s5_over_budget", "ours_inprocess"), peers("s5_over_budget"), "<= 2.5x", status(r("s5_over_budget", "ours_inprocess"), 2.5)),
    ]
    md = med("s1_full", "duckdb", "peak_mib")
    for engine, what in (("ours_warm", "warm Ray (Ray's processes included)"), ("ours_inprocess", "in this process")):
        m = med("s1_full", engine, "peak_mib")
        rows.append((f"peak memory, s1, {what}", f"{m:.0f} MiB" if m else "n/a",
                     f"DuckDB {md:.0f} MiB" if md else "", "<= DuckDB's", status(m / md if m and md else None, 1.0)))
        mp, mdp = med("s1_full", engine, "peak_pss_mib"), med("s1_full", "duckdb", "peak_pss_mib")
        if mp and mdp:  # the same, each page shared between processes counted once in all
            rows.append((f"peak memory by PSS, s1, {what}", f"{mp:.0f} MiB", f"DuckDB {mdp:.0f} MiB", "<= DuckDB's", status(mp / mdp, 1.0)))
    cold = out_dir / "results_cold_start.json"
    if cold.exists():
        case = json.loads(cold.read_text())["cases"][0]
        rows.append((f"{case['case']}, as a command (results_cold_start.md)", f"{case['in_process_s']:.2f} s", f"cold Ray {case['ray_s']:.2f} s", "<= 1.5 s (< 3 s: acceptance)", status(case["in_process_s"], 1.5)))
    dag = out_dir / "results_dagster_run.json"
    if dag.exists():
        d = json.loads(dag.read_text())
        rows.append(("a Dagster run of the paper's example, launch to commit (results_dagster_run.md)", f"{d['launch_to_commit_s']:.2f} s", "", "<= 5 s", status(d["launch_to_commit_s"], 5.0)))
    nothp = []
    for scen, engine, what in (("s1_full", "ours_warm", "s1 warm"), ("s1_full", "ours_inprocess", "s1 in process"),
                               ("s1_full", "ours_command", "s1 command"), ("s3_clustered", "ours_warm", "s3 warm"),
                               ("s3_clustered", "ours_command", "s3 command"), ("s4_small_files", "ours_warm", "s4 warm"),
                               ("s4_small_files", "ours_inprocess", "s4 in process")):
        ours, floor = med(scen, engine), med(scen, "copy_nothp")
        if ours and floor:
            nothp.append(f"{what} {ours / floor:.2f}x")
    also = (" Our engine runs without transparent huge pages (it turns them off for its processes: `FLASH_THP`, "
            "benchmarks/README.md); the floor and the peers run as they come. The same floor without them "
            f"(`copy_nothp`) gives: {', '.join(nothp)}.") if nothp else ""
    L = ["## Issue 15: the scorecard", "", "Ratios to the copy floor of this run (read every input once, write the result once, with PyArrow)." + also, "",
         "| scenario | now | peers (same run) | target | status |", "|---|---|---|---|---|"]
    L += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return L + [""]


def write_report(payload: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "results.json").write_text(json.dumps(payload, indent=1, default=str))
    m = payload["machine"]
    L = [
        "# Benchmarks: flash compactor vs Spark, DuckDB, Polars and the copy floor",
        "",
        f"Generated by `{payload['command']}` on {payload['date']} ({payload['scale']} scale, "
        + ("batched mode, " if payload.get("mode") == "batched" else "a fresh subprocess per run, ")
        + f"{payload['runs']} run(s) per engine, "
        f"median reported; total {payload['total_seconds']:.0f} s).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; {m['os']}. Python {m['python']}, PyArrow {m['pyarrow']}, "
        f"Ray {m['ray']}, DuckDB {m['duckdb']}, Polars {m['polars']}, Spark (PySpark) {m['spark']} on {m['java']}, NumPy {m['numpy']}; repository at commit {m.get('git_commit', '?')}."
        + (f" The kernel runs {m['memory_reclaim']} (a source of run-to-run spread: a run may find part of its inputs no longer cached)." if m.get("memory_reclaim") else ""),
        "",
        _methodology(payload),
        "",
        f"Load average (1/5/15 min) at start {', '.join(f'{x:.1f}' for x in payload.get('load_average_at_start', []))}"
        + (f", at end {', '.join(f'{x:.1f}' for x in payload['load_average_at_end'])}" if payload.get("load_average_at_end") else "")
        + f" on {m['cores']} cores (the load average counts this benchmark's own busy processes: an engine run keeps both cores "
        "busy, and the py-spy profiling at the end adds its sampler). Absolute times vary from run to run (see each run's seconds); "
        "ratios between engines measured back to back are more meaningful than absolute numbers.",
        "",
        *([f"Profiling of missed targets: {payload['profiling']}.", ""] if payload.get("profiling") else []),
        *(["**PARTIAL RESULTS: the run was still in progress when this file was written.**", ""] if payload.get("partial") else []),
        "## Targets",
        "",
        "| target | measured | limit | status |",
        "|---|---|---|---|",
    ]
    for t in payload["targets"]:
        meas = "n/a" if t["measured"] is None else f"{t['measured']:.2f}"
        lim = "n/a" if t["limit"] is None else f"{t['limit']:.2f}"
        st = t["status"] + (f" (by {t['miss_by']:.0%})" if t.get("miss_by") else "")
        L.append(f"| {t['target']} | {meas} {t.get('unit', '')} | {lim} | {st} |")
    L.append("")
    L += issue15_scorecard(payload, out_dir)
    for scen, per in payload["summary"].items():
        inf = payload["results"][scen]["info"]
        L += [f"## {SCENARIOS[scen]}", "", f"Input rows {inf['input_rows']:,}" + (f" in {inf['deltas']:,} deltas" if inf.get("deltas") else "")
              + f"; true result {inf['expected_rows']:,} rows."
              + (f" Memory budget {inf['memory_budget'] / 2**20:.1f} MiB (input {inf['input_bytes_memory'] / 2**20:.1f} MiB in Arrow memory)." if inf.get("memory_budget") else ""), "",
              "| engine | median s | runs s | peak MiB | peak increase in timed region MiB | peak PSS MiB | rows/s-core | x copy floor |", "|---|---|---|---|---|---|---|---|"]
        for engine in ENGINES:
            p = per.get(engine)
            if p is None:
                if engine == "ours_cold" and payload.get("mode") == "batched" and engine in payload.get("engines", ()):
                    L.append(f"| {LABELS[engine]} | not measured: batched mode measures the cold start on scenario (1) only | | | | | | |")
                continue
            if not p.get("available"):
                L.append(f"| {LABELS[engine]} | not available: {str(p.get('error')).splitlines()[0][:300]} | | | | | | |")
                continue
            L.append(f"| {LABELS[engine]} | {p['median_s']:.2f} | {', '.join(f'{x:.2f}' for x in p['runs_s'])} | {p['peak_mib']:.0f} | "
                     f"{p['peak_timed_increase_mib']:.0f} | {_opt_mib(p.get('peak_pss_mib'))} | {p['rows_per_s_core']:,.0f} | "
                     f"{p.get('x_copy_floor', float('nan')):.2f} |")
        live = per.get("ours_inprocess", {}).get("live_peak_increase_mib")
        if live is not None:
            L.append("")
            L.append(f"{LABELS['ours_inprocess']}: peak increase of the memory held live in the timed region (Arrow's pool in use "
                     f"plus glibc malloc's in-use bytes, sampled every 20 ms; RSS also counts what the allocators keep for reuse), "
                     f"highest of the runs: {live:.0f} MiB.")
        live_w = per.get("ours_warm", {}).get("live_peak_increase_mib")
        if live_w is not None:
            parts = per["ours_warm"].get("live_parts_mib") or {}
            shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(parts.items()))
            L.append("")
            L.append(f"{LABELS['ours_warm']}: peak increase of the memory held live in the timed region, summed on one time line "
                     f"over the driver, every Ray worker (each samples its own, benchmarks/live_memory.py) and the object store's "
                     f"primary copies, highest of the runs: {live_w:.0f} MiB (each part's own peak, MiB: {shown}).")
            at_peak = per["ours_warm"].get("live_at_peak_mib")
            if at_peak:
                held = ", ".join(f"{k} {v:.0f}" for k, v in sorted(at_peak.items()))
                L.append(f"At that peak, {per['ours_warm'].get('live_peak_at_seconds') or 0:.1f} s into the run, each part held (MiB): {held}.")
        for engine in ("ours_warm", "ours_cold"):
            p = per.get(engine, {})
            if p.get("available"):
                L.append("")
                L.append(f"{LABELS[engine]} steps (s): " + ", ".join(f"{k} {v:.2f}" for k, v in (p.get("step_seconds") or {}).items())
                         + f"; files written {p.get('files_written')}, carried {p.get('files_carried')}, rounds {p.get('rounds')}; "
                         + f"bytes read {_mib(p.get('bytes_read'))}, written {_mib(p.get('bytes_written'))}, carried by reference {_mib(p.get('bytes_carried'))}; "
                         f"predicted latency: {p.get('expected_seconds') if p.get('expected_seconds') is not None else 'not available'}")
        scratch_runs = [j for j in payload.get("sweeps", {}).get("jobs", []) if j.get("label") == f"{scen} from scratch" and not j.get("error")]
        warm = per.get("ours_warm", {})
        if scratch_runs and warm.get("available"):
            scratch = sorted(scratch_runs, key=lambda j: j["seconds"])[len(scratch_runs) // 2]
            scratch_seconds = ", ".join(f"{j['seconds']:.2f}" for j in scratch_runs)
            L.append("")
            L.append(f"Incremental versus from scratch: the same table compacted from scratch (every delta again, `rebuild=True`, "
                     f"{len(scratch_runs)} warm run(s) in the sweep worker: {scratch_seconds} s) "
                     f"has a median of {scratch['seconds']:.2f} s, reading {_mib(scratch.get('bytes_read'))} and writing "
                     f"{_mib(scratch.get('bytes_written'))} of data plus {_mib(scratch.get('index_bytes_written'))} of index; the incremental "
                     f"run's median is {warm['median_s']:.2f} s (**from scratch takes {scratch['seconds'] / warm['median_s']:.1f}x as long**), "
                     f"reading {_mib(warm.get('bytes_read'))} and writing {_mib(warm.get('bytes_written'))} of data "
                     f"({_mib(warm.get('bytes_carried'))} carried by reference) plus {_mib(warm.get('index_bytes_written'))} of index.")
        sp = per.get("spark", {})
        if sp.get("available"):
            L.append("")
            L.append(f"Spark without JVM start: {sp['median_s_excluding_jvm_start']:.2f} s.")
        L.append("")
    if payload.get("profiles"):
        L += ["## Where the time goes (targets missed)", ""]
        for scen, prof in payload["profiles"].items():
            L.append(f"### {scen}")
            L.append("")
            if prof.get("error"):
                L.append(f"Profile not available: {prof['error']}. Step seconds: {prof.get('step_seconds')}")
                L.append("")
                continue
            tot = sum(prof["samples_by_step"].values())
            L.append(f"Step seconds (driver view): {prof.get('step_seconds')}. py-spy samples inside Ray steps (all workers, 100 Hz): "
                     + ", ".join(f"{k} {v} ({v / tot:.0%})" for k, v in sorted(prof["samples_by_step"].items(), key=lambda kv: -kv[1]))
                     + f". Slowest step: **{prof['slowest_step']}**.")
            L += ["", "Top frames of the slowest step by self samples:", "", "| frame | samples |", "|---|---|"]
            L += [f"| `{f[:140]}` | {n} |" for f, n in prof["top_self"]]
            L += ["", "Top frames by inclusive samples:", "", "| frame | samples |", "|---|---|"]
            L += [f"| `{f[:140]}` | {n} |" for f, n in prof["top_inclusive"]]
            L.append("")
    L += ["## Plots", ""]
    for name, title in (("throughput_vs_buckets", "Throughput vs hash bucket count (scenario 1 data, warm)"),
                        ("latency_vs_input_size", "Latency vs input size (warm)"),
                        ("memory_vs_input_size", "Peak memory vs input size, unbounded and bounded by rounds (warm)"),
                        ("predicted_vs_actual", "Predicted vs actual latency")):
        L += [f"### {title}", "", f"![{title}](plots/{name}.png)", ""]
    sw = payload.get("sweeps", {})
    if sw.get("jobs"):
        where = "the batched warm worker, after the scenarios" if payload.get("mode") == "batched" else "one warm worker"
        L += [f"Sweep data ({where}):", "", "| run | s | rows in | rows/s-core | peak MiB (tree) | increase MiB | buckets | rounds |", "|---|---|---|---|---|---|---|---|"]
        for j in sw["jobs"]:
            if j.get("error"):
                L.append(f"| {j['label']} | error: {j['error'][:200]} | | | | | | |")
                continue
            L.append(f"| {j['label']} | {j['seconds']:.2f} | {j.get('rows_in', 0):,} | {j.get('rows_in', 0) / j['seconds'] / CORES:,.0f} | "
                     f"{j['peak_rss'] / 2**20:.0f} | {(j['peak_rss'] - j['rss_before']) / 2**20:.0f} | {j.get('hash_bucket_count')} | {j.get('rounds')} |")
        L.append("")
    (out_dir / "results.md").write_text("\n".join(L) + "\n")


def plots(payload: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    jobs = [j for j in payload.get("sweeps", {}).get("jobs", []) if not j.get("error")]
    b = [j for j in jobs if j["label"].startswith("buckets=")]
    fig, ax = plt.subplots(figsize=(6, 4))
    if b:
        ax.plot([j["hash_bucket_count"] for j in b], [j["rows_in"] / j["seconds"] / CORES for j in b], "o-", label="flash (warm)")
        ax.set_xscale("log", base=2)
        fl = payload["summary"].get("s1_full", {}).get("copy", {})
        if fl.get("available"):
            ax.axhline(fl["rows_per_s_core"], color="gray", ls="--", label="copy floor")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "not available", ha="center", transform=ax.transAxes)
    ax.set_xlabel("hash bucket count")
    ax.set_ylabel("input rows / s-core")
    ax.set_title("Throughput vs hash bucket count (2 cores)")
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_buckets.png", dpi=110)
    plt.close(fig)

    sz = [j for j in jobs if j["label"].startswith("size=") and "bounded" not in j["label"]]
    bd = [j for j in jobs if j["label"].startswith("size=") and "bounded" in j["label"]]
    rows_of = lambda j: j.get("rows_in", 0)  # noqa: E731
    fig, ax = plt.subplots(figsize=(6, 4))
    if sz:
        ax.plot([rows_of(j) for j in sz], [j["seconds"] for j in sz], "o-", label="flash, one round")
        if bd:
            ax.plot([rows_of(j) for j in bd], [j["seconds"] for j in bd], "s--", label="flash, one round per base file")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "not available", ha="center", transform=ax.transAxes)
    ax.set_xlabel("input rows")
    ax.set_ylabel("latency (s)")
    ax.set_title("Latency vs input size (2 cores, warm)")
    fig.tight_layout()
    fig.savefig(out / "latency_vs_input_size.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    if sz:
        ax.plot([rows_of(j) for j in sz], [(j["peak_rss"] - j["rss_before"]) / 2**20 for j in sz], "o-", label="one round")
        if bd:
            ax.plot([rows_of(j) for j in bd], [(j["peak_rss"] - j["rss_before"]) / 2**20 for j in bd], "s--", label="bounded by rounds")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "not available", ha="center", transform=ax.transAxes)
    ax.set_xlabel("input rows")
    ax.set_ylabel("peak process-tree RSS increase (MiB)")
    ax.set_title("Peak memory vs input size (warm)")
    fig.tight_layout()
    fig.savefig(out / "memory_vs_input_size.png", dpi=110)
    plt.close(fig)

    pts = [(j["expected_seconds"], j["seconds"]) for j in jobs if j.get("expected_seconds") is not None]
    for scen, per in payload["summary"].items():
        for e in ("ours_warm", "ours_cold"):
            p = per.get(e, {})
            if p.get("available") and p.get("expected_seconds") is not None:
                pts.append((p["expected_seconds"], p["median_s"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts])
        hi = max(max(p) for p in pts)
        ax.plot([0, hi], [0, hi], "k--", lw=0.8)
    else:
        ax.text(0.5, 0.5, "not available:\nCompactionResult has no prediction\n(expected_seconds is None)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted latency (s)")
    ax.set_ylabel("actual latency (s)")
    ax.set_title("Predicted vs actual latency")
    fig.tight_layout()
    fig.savefig(out / "predicted_vs_actual.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--rows", type=int, help="override the base row count N")
    ap.add_argument("--small-deltas", type=int, help="override the number of deltas of scenario 4")
    ap.add_argument("--runs", type=int, help="runs per engine (default: 1 small, 3 full)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset")
    ap.add_argument("--batch", action=argparse.BooleanOptionalAction, default=None,
                    help="batched mode: warm Ray and Spark run every scenario in one subprocess, cold Ray scenario 1 only "
                         "(default: on at small scale, off at full scale, where every run is a fresh subprocess)")
    ap.add_argument("--no-sweeps", action="store_true", help="skip the plot sweeps")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="profile missed targets with py-spy (default: on at full scale, off at small scale)")
    ap.add_argument("--memory-runs", action=argparse.BooleanOptionalAction, default=True,
                    help="after the timed runs, one untimed run per engine of the memory targets that samples PSS (MEMORY_RUNS; "
                         "timed runs sample RSS only, as reading PSS slows Ray's processes)")
    ap.add_argument("--out", help="where results.md/.json and plots/ go (default: benchmarks/ at full scale, the committed "
                                  "results; benchmarks/.runs/small-results/ at small scale, which git ignores)")
    ap.add_argument("--data", help="data directory (default benchmarks/data/<scale>)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: write results.md again from the results.json in --out (default benchmarks/) and the "
                         "results_cold_start.json / results_dagster_run.json beside it, e.g. after re-running those two")
    args = ap.parse_args(argv)
    if args.report_only:
        out_dir = Path(args.out) if args.out else HERE
        payload = json.loads((out_dir / "results.json").read_text())
        write_report(payload, out_dir)
        print(f"wrote {out_dir / 'results.md'} from {out_dir / 'results.json'} (measured {payload.get('date')})")
        return payload
    started = time.perf_counter()
    cfg = dict(SCALES[args.scale])
    if args.rows:
        cfg["rows"] = args.rows
    if args.small_deltas:
        cfg["small_deltas"] = args.small_deltas
    runs = args.runs or cfg["runs"]
    batch = MODES[args.scale]["batch"] if args.batch is None else args.batch
    profile = MODES[args.scale]["profile"] if args.profile is None else args.profile
    data = Path(args.data) if args.data else HERE / "data" / args.scale
    out = Path(args.out) if args.out else HERE if args.scale == "full" else HERE / ".runs" / f"{args.scale}-results"
    workdir = (Path(args.out) if args.out else HERE) / ".runs" / args.scale  # scratch; runs with their own --out do not collide
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {msg}", flush=True)

    log(f"preparing data ({args.scale}: N={cfg['rows']:,})")
    info = prepare(args.scale, cfg, args.seed, data, log)
    log(f"data ready (prepare took {info.get('prepare_seconds')} s when generated)")
    scenarios = [s for s in args.scenarios.split(",") if s]
    engines = [e for e in args.engines.split(",") if e]
    base_payload = {
        "command": " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "scale": args.scale, "config": cfg, "runs": runs, "seed": args.seed,
        "mode": "batched" if batch else "fresh", "primed_page_cache": True, "engines": engines, "machine": machine(), "load_average_at_start": os.getloadavg(),
    }
    if batch:
        log(f"batched mode: warm Ray and Spark run all {len(scenarios)} scenario(s) in one subprocess each; cold Ray {COLD_SCENARIO} only")
        results, sweeps = run_batched(info, cfg, runs, scenarios, engines, workdir, log, sweeps=not args.no_sweeps)
        if args.memory_runs:
            run_memory(info, cfg, MEMORY_RUNS[args.scale], results, engines, workdir, log)
    else:
        sweeps = None
        results = {}
        for scen in scenarios:  # the report is rewritten after every scenario (partial results survive an interrupted run)
            results.update(run_scenarios(info, cfg, runs, [scen], engines, workdir, log))
            if args.memory_runs:
                run_memory(info, cfg, {k: v for k, v in MEMORY_RUNS[args.scale].items() if k == scen}, results, engines, workdir, log)
            summary = summarize(results, info)
            write_report({**base_payload, "results": results, "summary": summary, "targets": targets(summary, info), "sweeps": {},
                          "profiles": {}, "total_seconds": time.perf_counter() - started, "partial": True}, out)
    summary = summarize(results, info)
    tg = targets(summary, info)
    for t in tg:
        meas = "n/a" if t["measured"] is None else f"{t['measured']:.2f}"
        log(f"TARGET {t['target']}: measured {meas} (limit {t['limit']}) {t['status']}" + (f" by {t['miss_by']:.0%}" if t.get("miss_by") else ""))
    if sweeps is None:
        sweeps = {} if args.no_sweeps else run_sweeps(info, cfg, workdir, log)
    profiles = {}
    missed = sorted({t["target"][1] for t in tg if t["status"] == "MISS" and t["target"][0] == "("})
    if profile:
        for num in missed:
            scen = {"1": "s1_full", "2": "s2_incremental", "3": "s3_clustered", "5": "s5_over_budget"}.get(num)
            if scen and scen in scenarios:
                log(f"profiling {scen} (target missed)")
                profiles[scen] = profile_scenario(info, cfg, scen, workdir, log)
        profiling = "ran for " + ", ".join(profiles) if profiles else "no missed target to profile"
    else:
        profiling = ("skipped (" + ("the default at small scale, where a run takes about a second; `--profile` turns it on"
                                    if args.profile is None else "`--no-profile`")
                     + (f"; targets of scenario(s) {', '.join(missed)} were missed" if missed else "") + ")")
    payload = {
        **base_payload, "results": results, "summary": summary, "targets": tg, "sweeps": sweeps, "profiles": profiles, "profiling": profiling,
        "total_seconds": time.perf_counter() - started, "load_average_at_end": os.getloadavg(),
    }
    write_report(payload, out)
    plots(payload, out / "plots")
    log(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'plots'}")
    return payload


if __name__ == "__main__":
    main()
