"""Memory held live (not what allocators keep for reuse), in this process and across a warm Ray's processes.

RSS, which the benchmark reports for every engine, also counts what the allocators keep for reuse (the compactor
keeps freed malloc pages while a round runs, runtime/memory.py, and Arrow's mimalloc purges lazily) and, per
process that maps them, the object store's shared pages: a round budget bounds none of those. What it bounds is
the data a round holds: Arrow's pool in use, malloc's in-use bytes (NumPy's arrays, Python's objects) and the
object store's primary copies. :class:`LiveMemory` samples the first two in this process; :class:`RayLiveMemory`
adds every Ray worker's (a sampler thread each starts through Ray's ``worker_process_setup_hook``) and the object
store's, summed on one time line.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

SAMPLE_SECONDS = 0.02
LIVE_DIR_ENV = "FLASH_BENCH_LIVE_DIR"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def live_bytes_reader() -> Callable[[], int]:
    """A function giving this process's live bytes: Arrow's pool in use plus glibc malloc's in use (mallinfo2;
    where there is no glibc, Arrow's pool alone)."""
    import pyarrow as pa

    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if mallinfo2 is not None:
        mallinfo2.restype = _MallInfo2

    def now() -> int:
        used = pa.total_allocated_bytes()
        if mallinfo2 is not None:
            m = mallinfo2()
            used += m.uordblks + m.hblkhd
        return used

    return now


class LiveMemory:
    """Peak increase of this process's live bytes, sampled every 20 ms on a thread from construction to stop()."""

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        self._now = live_bytes_reader()
        self._base, self._peak = self._now(), 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._done.is_set():
            self._peak = max(self._peak, self._now() - self._base)
            self._done.wait(interval)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self._peak


def worker_sampler_hook() -> None:
    """Run in each Ray worker at start (``worker_process_setup_hook``): sample the worker's live bytes every 20 ms
    and, when the driver touches ``<dir>/flush``, write the last two minutes of samples to ``<dir>/<pid>.json``.
    Between flushes it only samples (no file I/O inside a timed region)."""
    folder = os.environ.get(LIVE_DIR_ENV)
    if not folder:
        return
    now = live_bytes_reader()
    samples: deque[tuple[float, int]] = deque(maxlen=int(120 / SAMPLE_SECONDS))
    flush = Path(folder) / "flush"

    def run() -> None:
        flushed = 0.0
        while True:
            samples.append((time.time(), now()))
            try:
                asked = flush.stat().st_mtime
            except OSError:
                asked = 0.0
            if asked > flushed:
                flushed = asked
                out = Path(folder) / f"{os.getpid()}.json"
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps({"flush": asked, "samples": list(samples)}))
                os.replace(tmp, out)
            time.sleep(SAMPLE_SECONDS)

    threading.Thread(target=run, name="bench-live-memory", daemon=True).start()


def object_store_sampler() -> Callable[[], int]:
    """A function giving the bytes of primary copies in Ray's object store (objects a round holds; freed ones
    linger as cache). The raylet's stub is made once: Ray's own helper (``internal_api.get_memory_info_reply``)
    reads the node table and opens a gRPC channel per call, which made sampling every 20 ms slow the measured
    compaction by half, and sampling every 100 ms let a round's freed envelopes (freed within milliseconds)
    coincide on the time line with the next round's workers."""
    import ray
    from ray._private.internal_api import MAX_MESSAGE_LENGTH, build_address
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    node = next(n for n in ray.nodes() if n["Alive"])
    channel = init_grpc_channel(build_address(node["NodeManagerAddress"], node["NodeManagerPort"]),
                                options=[("grpc.max_send_message_length", MAX_MESSAGE_LENGTH),
                                         ("grpc.max_receive_message_length", MAX_MESSAGE_LENGTH)])
    stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
    request = node_manager_pb2.FormatGlobalMemoryInfoRequest(include_memory_info=False)

    def now() -> int:
        return int(stub.FormatGlobalMemoryInfo(request, timeout=60).store_stats.object_store_bytes_primary_copy)

    return now


class RayLiveMemory:
    """Peak increase, over a timed region, of the live bytes of this driver, every Ray worker and the object
    store's primary copies, summed on one time line (each series a step function of its samples; a worker that
    starts inside the region counts from zero). Needs Ray started with :func:`ray_runtime_env`."""

    STORE_SECONDS = SAMPLE_SECONDS

    def __init__(self) -> None:
        self.folder = Path(os.environ[LIVE_DIR_ENV])
        self._now = live_bytes_reader()
        self._store = object_store_sampler()
        # each series' value at t0 is its base: sampled here, before the region starts (a series' first sample
        # taken after t0 would make its base 0, and the whole driver -- modules, Python's objects -- an increase)
        self._series: dict[str, list[tuple[float, int]]] = {"driver": [(time.time(), self._now())],
                                                            "store": [(time.time(), self._store())]}
        self._done = threading.Event()
        self.t0 = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_store = 0.0
        while not self._done.is_set():
            t = time.time()
            self._series["driver"].append((t, self._now()))
            if t - last_store >= self.STORE_SECONDS:
                last_store = t
                self._series["store"].append((t, self._store()))
            self._done.wait(SAMPLE_SECONDS)

    def stop(self) -> dict[str, Any]:
        """{"peak_increase": bytes, "parts": {series: its own peak increase}, "workers": n}."""
        t1 = time.time()
        self._done.set()
        self._thread.join()
        flush = self.folder / "flush"
        flush.touch()
        asked = flush.stat().st_mtime
        deadline = time.time() + 3
        series = dict(self._series)
        while time.time() < deadline:
            fresh = {}
            for path in glob.glob(str(self.folder / "*.json")):
                try:
                    doc = json.loads(Path(path).read_text())
                except (OSError, ValueError):
                    continue
                if doc["flush"] >= asked:
                    fresh[Path(path).stem] = [(t, b) for t, b in doc["samples"]]
            if fresh and len(fresh) >= len(glob.glob(str(self.folder / "*.json"))):
                series.update({f"worker {pid}": s for pid, s in fresh.items()})
                break
            time.sleep(0.1)
        return _peak_increase(series, self.t0, t1)


def _step(samples: list[tuple[float, int]]) -> Callable[[float], int]:
    """The step function of ``samples`` (0 before the first sample: a process not there yet)."""
    import bisect

    times = [ts for ts, _ in samples]
    values = [b for _, b in samples]
    return lambda t: values[i - 1] if (i := bisect.bisect_right(times, t)) else 0


def _peak_increase(series: dict[str, list[tuple[float, int]]], t0: float, t1: float) -> dict[str, Any]:
    steps = {name: _step(sorted(s)) for name, s in series.items()}
    base = {name: f(t0) for name, f in steps.items()}
    parts = {name: max([0] + [b - base[name] for t, b in s if t0 <= t <= t1]) for name, s in series.items()}
    grid = sorted({t for s in series.values() for t, _ in s if t0 <= t <= t1} | {t0})
    peak, at = max((sum(f(t) - base[name] for name, f in steps.items()), t) for t in grid)
    workers = sum(1 for name in series if name.startswith("worker"))
    # what each part held at that moment (their own peaks, ``parts``, need not coincide)
    at_peak = {name: f(at) - base[name] for name, f in steps.items()}
    return {"peak_increase": max(0, peak), "parts": parts, "at_peak": at_peak, "peak_at_seconds": at - t0, "workers": workers}


def ray_runtime_env(folder: str) -> dict[str, Any]:
    """``ray.init(runtime_env=...)`` that starts the sampler in every worker (they write under ``folder``)."""
    os.environ[LIVE_DIR_ENV] = folder
    Path(folder).mkdir(parents=True, exist_ok=True)
    repo = str(Path(__file__).resolve().parents[1])  # where workers import this module from
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    return {"worker_process_setup_hook": "benchmarks.live_memory.worker_sampler_hook",
            "env_vars": {LIVE_DIR_ENV: folder, "PYTHONPATH": path}}
