"""Running one measurement: an engine subprocess (``benchmarks.engines``) started on a spec, its inputs read into
the page cache first, its whole process tree's RSS (and on memory runs PSS) sampled while it runs, and the record
of the machine it ran on. It is its own module because every benchmark of this directory measures this way
(``run``, ``deletion_vectors``, ``cpu_budget``, ``schema_evolution``), and how a run is measured should not
depend on which report it goes into.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from benchmarks.config import CORES, ROOT

PSS_EVERY = 10  # with the 50 ms RSS interval: PSS every 500 ms


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
