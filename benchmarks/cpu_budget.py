"""Where scenario s1's time goes, in CPU seconds: our in-process compaction part by part beside the copy floor.

    .venv/bin/python -m benchmarks.cpu_budget --data benchmarks/data/full --runs 3   # ~3 min once the data exists

Issue 15 asks for s1 (a full compaction of 6.26M input rows) within 1.15x of the copy floor (read every input
once, write the result once, PyArrow) on Ray warm, and 1.5x as a fresh command. On this 2-core machine both the
floor and our engine keep both cores busy, so their wall times stand about as their CPU seconds do: the floor's
CPU seconds are the budget, and this script says what of ours lies outside it.

Each run is a fresh subprocess, the floor and ours alternating (ours with the engine loaded first, as the
benchmark's "in-process" engine: numba's cached kernels and a tiny warm-up compaction). Process CPU (user +
system, every thread) is read:

- around the floor (benchmarks/engines.run_copy, the benchmark's own floor);
- around our ``compact(..., executor="in-process")``, and at the driver's step boundaries. Those are read at the
  fault-injection points ``driver:hash_bucket`` and ``driver:dedupe`` (flash_pipeline/faults.py), which the driver
  passes as each step ends: a measuring seam, nothing changes in what runs;
- inside the steps, the calling thread's CPU (``time.thread_time``) of the parts that are not reading or
  writing Parquet: the primary key digests, sort key bytes and bucket numbers (hash bucket); the survivors'
  takes, the compacted files' checksums and the index writers (materialize). Parquet decoding runs partly on
  Arrow's own threads, so reading is what remains of a step.

The output is verified: our row count against the scenario's true result. Writes results_cpu_budget.{md,json}
under ``--out`` (default benchmarks/).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# parts timed on the calling thread, by (module, attribute) patched in the measuring subprocess
THREAD_PARTS = {
    "digests": [("flash_pipeline.compactor.steps.hash_bucket", "primary_key_digests")],
    "sort key bytes and buckets": [("flash_pipeline.compactor.steps.hash_bucket", "sort_key_bytes"),
                                   ("flash_pipeline.compactor.steps.hash_bucket", "hash_buckets"),
                                   ("flash_pipeline.compactor.steps.hash_bucket", "append_by_bucket_kernel")],
    "survivor takes": [("flash_pipeline.compactor.steps.materialize", "_take_rows")],
    "file checksums": [("flash_pipeline.catalog.checksums", "checksum_of_file")],
    "index writers": [("flash_pipeline.compactor.round", "_write_index")],
}


ENGINES = ("floor", "floor_nothp", "ours")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _thread_timed(totals: dict[str, float], part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[part] = totals.get(part, 0.0) + time.thread_time() - t

    return timed


def measure_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """One in-process compaction of the scenario's lake, with CPU read at the step boundaries and per part."""
    import importlib

    from benchmarks.engines import PK, warm_up
    from flash_pipeline import Catalog, compact
    from flash_pipeline.compactor import round as round_module
    from flash_pipeline.compactor.kernels.compiled import load_cached_kernels

    load_cached_kernels()
    warm_up(spec["warmup_lake"], "in-process")
    parts: dict[str, float] = {}
    for part, targets in THREAD_PARTS.items():
        for module_name, attr in targets:
            module = importlib.import_module(module_name)
            setattr(module, attr, _thread_timed(parts, part, getattr(module, attr)))
    marks: dict[str, float] = {}
    crash = round_module.maybe_crash

    def mark(point: str) -> None:
        marks.setdefault(point, _cpu())
        crash(point)

    round_module.maybe_crash = mark
    os.sync()
    c0, t0 = _cpu(), time.perf_counter()
    res = compact("orders", primary_keys=PK, sort_keys=[("last_updated", "ascending")], catalog=Catalog(spec["lake"]), num_cpus=2,
                  progress=lambda m: None, rows_per_compacted_file=4_000_000, executor="in-process")
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    p = res.partitions[0]
    if p.rows_out != spec["expected_rows"]:
        raise SystemExit(f"ours wrote {p.rows_out} rows, the true result has {spec['expected_rows']}")
    hb, dd = marks["driver:hash_bucket"] - c0, marks["driver:dedupe"] - marks["driver:hash_bucket"]
    return {"wall": wall, "cpu": cpu, "steps_cpu": {"planning + hash bucket": hb, "dedupe": dd, "materialize + index + commit": cpu - hb - dd},
            "steps_wall": dict(p.seconds), "parts_thread_cpu": parts, "bytes_read": p.bytes_read, "bytes_written": p.bytes_written,
            "index_bytes_written": p.index_bytes_written}


def measure_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's copy floor; ``floor_nothp`` in a process without transparent huge pages, as ours runs."""
    from benchmarks.engines import run_copy, run_copy_nothp

    c0 = _cpu()
    out = (run_copy_nothp if spec["engine"] == "floor_nothp" else run_copy)(spec)
    return {"wall": out["seconds"], "cpu": _cpu() - c0}


def _child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = measure_ours(spec) if spec["engine"] == "ours" else measure_floor(spec)
    Path(spec["result_path"]).write_text(json.dumps(out))


def _run(engine: str, info: dict[str, Any], work: Path, i: int) -> dict[str, Any]:
    s = info["scenarios"]["s1_full"]
    run_dir = work / f"{engine}-{i}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spec: dict[str, Any] = {"engine": engine, "result_path": str(run_dir / "result.json"), "expected_rows": s["expected_rows"]}
    if engine == "ours":
        subprocess.run(["cp", "-al", s["lake"], str(run_dir / "lake")], check=True)
        subprocess.run(["cp", "-al", info["warmup_lake"], str(run_dir / "warmup")], check=True)
        spec.update(lake=str(run_dir / "lake"), warmup_lake=str(run_dir / "warmup"))
    else:
        from benchmarks.generate import COLUMNS

        (run_dir / "out").mkdir()
        spec.update(inputs=s["inputs"], columns=COLUMNS, out_dir=str(run_dir / "out"))
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_budget", "--child", str(run_dir / "spec.json")], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{engine} run {i} failed: {done.stderr.strip()[-2000:]}")
    result = json.loads((run_dir / "result.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _each(runs: list[dict[str, Any]], key: str) -> str:
    return ", ".join(f"{r[key]:.2f}" for r in runs)


def report(runs: dict[str, list[dict[str, Any]]], machine: dict[str, Any], command: str) -> str:
    ours, floor, nothp = runs["ours"], runs["floor"], runs["floor_nothp"]
    f_cpu, f_wall = _median([r["cpu"] for r in floor]), _median([r["wall"] for r in floor])
    n_cpu, n_wall = _median([r["cpu"] for r in nothp]), _median([r["wall"] for r in nothp])
    o_cpu, o_wall = _median([r["cpu"] for r in ours]), _median([r["wall"] for r in ours])
    lines = [
        "# Where s1's time goes: CPU seconds, ours beside the copy floor", "",
        f"Generated by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {machine['cpu']}, "
        f"{machine['cores']} cores, {machine['ram_gib']} GiB, Python {machine['python']}, PyArrow {machine['pyarrow']}; commit {machine['git_commit']}.",
        "",
        "Scenario s1 of benchmarks/run.py (a full compaction: 6,259,022 input rows, 5,152,500 out), in process, the engine loaded. "
        f"Medians of {len(ours)} runs each, every run a fresh subprocess, the floor and ours alternating; our row count checked every run. "
        "CPU = user + system seconds of every thread of the process (benchmarks/cpu_budget.py says how each part is read).",
        "",
        "| | wall s (runs) | CPU s (runs) | CPU / wall | wall x floor | CPU x floor |",
        "|---|---|---|---|---|---|",
        f"| copy floor (PyArrow) | {f_wall:.2f} ({_each(floor, 'wall')}) | {f_cpu:.2f} ({_each(floor, 'cpu')}) | {f_cpu / f_wall:.2f} | 1.00 | 1.00 |",
        f"| copy floor, no transparent huge pages | {n_wall:.2f} ({_each(nothp, 'wall')}) | {n_cpu:.2f} ({_each(nothp, 'cpu')}) | {n_cpu / n_wall:.2f} | {n_wall / f_wall:.2f} | {n_cpu / f_cpu:.2f} |",
        f"| flash, in process (no transparent huge pages) | {o_wall:.2f} ({_each(ours, 'wall')}) | {o_cpu:.2f} ({_each(ours, 'cpu')}) | {o_cpu / o_wall:.2f} | {o_wall / f_wall:.2f} | {o_cpu / f_cpu:.2f} |",
        "",
        f"On 2 cores, wall = CPU / (CPU / wall). 1.15x of the floor's wall ({1.15 * f_wall:.2f} s) at our present CPU / wall "
        f"({o_cpu / o_wall:.2f}) needs ours within {1.15 * f_wall * o_cpu / o_wall:.2f} CPU s ({o_cpu - 1.15 * f_wall * o_cpu / o_wall:.2f} s fewer "
        f"than now); with both cores busy all the time (CPU / wall = 2), within {2.3 * f_wall:.2f} CPU s.",
        "",
        "## Our CPU seconds by step and part (medians)", "",
        "| step | part | CPU s | in the floor's work? |",
        "|---|---|---|---|",
    ]
    steps = {k: _median([r["steps_cpu"][k] for r in ours]) for k in ours[0]["steps_cpu"]}
    parts = {k: _median([r["parts_thread_cpu"].get(k, 0.0) for r in ours]) for k in THREAD_PARTS}
    hb, dd, mat = steps["planning + hash bucket"], steps["dedupe"], steps["materialize + index + commit"]
    hb_compute = parts["digests"] + parts["sort key bytes and buckets"]
    mat_own = parts["survivor takes"] + parts["file checksums"] + parts["index writers"]
    lines += [
        f"| planning + hash bucket | total | {hb:.2f} | no |",
        f"| | primary key digests (framing + SHA-1) | {parts['digests']:.2f} | no |",
        f"| | sort key bytes, bucket numbers, scatter | {parts['sort key bytes and buckets']:.2f} | no |",
        f"| | the rest: reading the key columns (Parquet), planning | {hb - hb_compute:.2f} | no (the floor reads each input once) |",
        f"| dedupe | total | {dd:.2f} | no |",
        f"| materialize + index writers + commit | total | {mat:.2f} | |",
        f"| | survivor takes | {parts['survivor takes']:.2f} | no |",
        f"| | compacted files' SHA-256 checksums | {parts['file checksums']:.2f} | no |",
        f"| | primary key index writers | {parts['index writers']:.2f} | no |",
        f"| | the rest: reading every column, writing the compacted Parquet files, commit | {mat - mat_own:.2f} | yes |",
        "",
        f"Outside the floor's work: {hb + dd + mat_own:.2f} CPU s; the floor's own work (reading and writing) as we do it: "
        f"{mat - mat_own:.2f} CPU s against the floor's {f_cpu:.2f}.",
        "",
    ]
    w = {k: _median([r["steps_wall"].get(k, 0.0) for r in ours]) for k in ("hash_bucket", "dedupe", "materialize", "commit")}
    idle = {"hash bucket": 2 * w["hash_bucket"] - hb, "dedupe": 2 * w["dedupe"] - dd, "materialize + commit": 2 * (w["materialize"] + w["commit"]) - mat}
    lines += ["Step wall seconds (medians): " + ", ".join(f"{k} {v:.2f}" for k, v in w.items()) + ". Core-seconds left idle "
              "(2 x wall - CPU): " + ", ".join(f"{k} {v:.2f}" for k, v in idle.items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=HERE / "data" / "full", help="benchmark data (benchmarks.bench_data prepares it if absent)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return
    from benchmarks.bench_data import prepare
    from benchmarks.config import SCALES
    from benchmarks.measure import machine

    info = prepare("full", dict(SCALES["full"]), 42, args.data)
    work = args.out / ".runs" / "cpu_budget"
    runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in ENGINES}
    for i in range(args.runs):
        for engine in ENGINES:
            r = _run(engine, info, work, i)
            runs[engine].append(r)
            print(f"run {i + 1}/{args.runs} {engine}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    command = "python -m benchmarks.cpu_budget " + " ".join(argv if argv is not None else sys.argv[1:])
    m = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results_cpu_budget.json").write_text(json.dumps({"machine": m, "command": command, "runs": runs}, indent=1))
    (args.out / "results_cpu_budget.md").write_text(report(runs, m, command))
    print(f"wrote {args.out / 'results_cpu_budget.md'}")


if __name__ == "__main__":
    main()
