"""Where a warm Ray's memory goes during scenario 1 (full compaction), process by process, against the same
compaction in one process: the "why" behind results.md's warm peak-memory line.

Each run is a fresh subprocess, as in benchmarks/run.py: it starts Ray the way the benchmark's warm engine does
(``ray.init(num_cpus=2, include_dashboard=False)``; ``in-process``: no Ray), compacts a tiny warm-up table twice,
then compacts a hard-linked copy of the s1 lake. This process samples the proportional set size of the child's
whole process tree every 0.25 s (/proc/PID/smaps_rollup: Pss_Anon, Pss_Shmem -- Ray's object store --, Pss_File),
and reports each role's share just before the compaction and at the tree's peak.

Usage: .venv/bin/python -m benchmarks.scripts.ray_memory_breakdown --lake DATA/lakes/s1 [--runs 3] [--env NAME=VALUE]
(DATA is a benchmark data directory, ``python -m benchmarks.run --data DATA`` makes it.) Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SECONDS = 0.25
MiB = 2**20

CHILD = r"""
import os, sys, time
import pyarrow as pa
lake, warm_lake, mode, marker = sys.argv[1:5]
if mode == "ray":
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="flash-compactor", log_to_driver=False)
from flash_pipeline import Catalog, compact
from flash_pipeline.compactor.kernels.compiled import load_cached_kernels
if mode != "ray":  # on Ray the workers load them (cluster.py _warm); the driver runs no kernel
    load_cached_kernels()
quiet = lambda m: None
w = Catalog(warm_lake)
for i in range(2):
    w.append("warm", (), "upsert", [pa.table({"order_id": pa.array(range(i, 3000 + i), pa.int64()), "region": ["a"] * 3000,
                                             "last_updated": [i] * 3000})])
    compact("warm", primary_keys=["order_id", "region"], sort_keys=[("last_updated", "ascending")], catalog=w, num_cpus=2,
            progress=quiet, executor=mode, hash_bucket_count=2)
time.sleep(1.0)  # the warm-up's memory settles (a worker returns malloc's pages after 2 s idle)
time.sleep(1.5)
open(marker + ".start", "w").close()
t = time.perf_counter()
compact("orders", primary_keys=["order_id", "region"], sort_keys=[("last_updated", "ascending")], catalog=Catalog(lake),
        num_cpus=2, progress=quiet, rows_per_compacted_file=4_000_000, executor=mode)
print(f"{time.perf_counter() - t:.2f}", flush=True)
open(marker + ".end", "w").close()
time.sleep(0.5)  # what the processes hold right after, until the driver exits
"""

ROLES = [  # (role, how to recognise its command line), first match wins
    ("GCS server", lambda cmd: cmd.split(" ", 1)[0].endswith("/gcs_server")),
    ("raylet", lambda cmd: cmd.split(" ", 1)[0].endswith("/raylet")),  # its arguments name the agents' scripts
    ("Ray worker", lambda cmd: cmd.startswith("ray::") and "Agent" not in cmd),
    ("dashboard agent", lambda cmd: "DashboardAgent" in cmd or "dashboard/agent.py" in cmd),
    ("runtime env agent", lambda cmd: "RuntimeEnvAgent" in cmd or "runtime_env/agent" in cmd),
    ("dashboard (API server)", lambda cmd: "dashboard/dashboard.py" in cmd),
    ("autoscaler monitor", lambda cmd: "autoscaler/_private/monitor.py" in cmd),
    ("log monitor", lambda cmd: "log_monitor.py" in cmd),
]


def _role(pid: int, driver: int, cmd: str) -> str:
    if pid == driver:
        return "driver (the engine's process)"
    return next((name for name, match in ROLES if match(cmd)), "other")


def _snapshot(root: psutil.Process) -> dict[int, tuple[str, float, float, float]]:
    """pid -> (role, PSS anon, PSS shmem, PSS file) in MiB, for ``root`` and its descendants."""
    out: dict[int, tuple[str, float, float, float]] = {}
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return out
    for p in procs:
        try:
            fields = {}
            for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines()[1:]:
                name, value = line.split(":", 1)
                fields[name] = int(value.split()[0]) / 1024
            cmd = " ".join(p.cmdline())
        except (OSError, psutil.Error, ValueError):
            continue
        out[p.pid] = (_role(p.pid, root.pid, cmd), fields.get("Pss_Anon", 0.0), fields.get("Pss_Shmem", 0.0), fields.get("Pss_File", 0.0))
    return out


def _total(snap: dict[int, tuple[str, float, float, float]]) -> float:
    return sum(a + s + f for _, a, s, f in snap.values())


def run_once(lake: Path, mode: str, extra_env: dict[str, str]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="flash-memory-breakdown-"))
    try:
        subprocess.run(["cp", "-al", str(lake), str(work / "lake")], check=True)
        marker = str(work / "marker")
        env = {**os.environ, **extra_env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(work / "lake"), str(work / "warm"), mode, marker],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        root = psutil.Process(child.pid)
        idle: dict[int, Any] = {}
        peak: dict[int, Any] = {}
        while child.poll() is None:
            snap = _snapshot(root)
            started, ended = os.path.exists(marker + ".start"), os.path.exists(marker + ".end")
            if not started:
                idle = snap
            elif _total(snap) > _total(peak):
                peak = snap
            if ended and time.time() - os.path.getmtime(marker + ".end") > 0.4:
                break
            time.sleep(SAMPLE_SECONDS)
        out, _ = child.communicate(timeout=120)
        if child.returncode != 0:
            raise SystemExit(f"the {mode} run failed (exit {child.returncode})")
        return {"seconds": float(out.split()[-1]), "idle": idle, "peak": peak}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _by_role(snap: dict[int, tuple[str, float, float, float]]) -> dict[str, list[float]]:
    """role -> [processes, anon, shmem, file] MiB."""
    out: dict[str, list[float]] = {}
    for role, a, s, f in snap.values():
        row = out.setdefault(role, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += a
        row[2] += s
        row[3] += f
    return out


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for mode, runs in results.items():
        peaks = [_total(r["peak"]) for r in runs]
        median_run = sorted(runs, key=lambda r: _total(r["peak"]))[len(runs) // 2]
        seconds = ", ".join(f"{r['seconds']:.2f}" for r in runs)
        lines.append(f"### {mode}: peak PSS of the tree {statistics.median(peaks):,.0f} MiB (runs "
                     f"{', '.join(f'{p:,.0f}' for p in peaks)}; compaction {seconds} s)")
        lines.append("")
        lines.append("The median run, by role (MiB of PSS; anon = private and Arrow/NumPy data, shmem = Ray's object store):")
        lines.append("")
        lines.append("| role | processes | before the compaction | at the peak | of which anon | shmem | file |")
        lines.append("|---|---|---|---|---|---|---|")
        idle, peak = _by_role(median_run["idle"]), _by_role(median_run["peak"])
        for role in sorted(set(idle) | set(peak), key=lambda r: -sum(peak.get(r, [0, 0, 0, 0])[1:])):
            i, p = idle.get(role, [0, 0, 0, 0]), peak.get(role, [0, 0, 0, 0])
            lines.append(f"| {role} | {int(p[0] or i[0])} | {sum(i[1:]):,.0f} | {sum(p[1:]):,.0f} | {p[1]:,.0f} | {p[2]:,.0f} | {p[3]:,.0f} |")
        lines.append(f"| **all** | {len(median_run['peak'])} | {_total(median_run['idle']):,.0f} | {_total(median_run['peak']):,.0f} | | | |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lake", type=Path, required=True, help="the s1 lake of a benchmark data directory (DATA/lakes/s1)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="ray,in-process")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the child's environment (Ray's processes inherit it), e.g. MIMALLOC_PURGE_DELAY=0")
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)
    if not args.lake.is_dir():
        raise SystemExit(f"{args.lake}: not a lake; make one with python -m benchmarks.run --data DATA")
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.runs):  # interleaved, as benchmarks/run.py runs its engines
        for mode in modes:
            results[mode].append(run_once(args.lake, mode, extra_env))
            print(f"{mode}: {_total(results[mode][-1]['peak']):,.0f} MiB peak PSS", file=sys.stderr, flush=True)
    if extra_env:
        print(f"With {', '.join(f'`{k}={v}`' for k, v in extra_env.items())} in the environment.\n")
    print(report(results))


if __name__ == "__main__":
    main()
