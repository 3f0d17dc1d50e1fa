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
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_data import prepare
from benchmarks.config import ENGINES, HERE, MODES, SCALES, SCENARIOS, SPARK_BATCHED_DRIVER_MEMORY
from benchmarks.generate import COLUMNS
from benchmarks.measure import machine, run_worker
from benchmarks.outputs import Verifier
from benchmarks.report import plots, summarize, targets, write_report


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
