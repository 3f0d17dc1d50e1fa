"""Arrow's pool gives a round's pages back (runtime/memory.py ``_release_arrow_pool``): its mimalloc keeps what
a round freed until the thread that holds it asks, so an idle Ray worker, or a process that called compact(),
kept a round's high water for good. Read from the kernel's account of each process (RssAnon), in fresh
processes: the worker's last task of a session returns it, and so does the end of compact()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

MiB = 2**20
REPO = Path(__file__).resolve().parents[3]

# A task of a Ray worker, as runtime/tasks.py runs one: Arrow arrays made and dropped inside task_memory
TASK_PROBE = r"""
import json, sys
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from flash_pipeline.compactor.runtime import memory

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024

last = sys.argv[1] == "last"
src = pa.array(np.arange(128 * 1024, dtype=np.int64))  # 1 MiB
base = anon()
with memory.task_memory(fresh=True, last=last):
    arrays = [pc.add(src, i) for i in range(160)]  # 160 MiB from Arrow's pool
    pool = pa.total_allocated_bytes()
    del arrays
print(json.dumps({"pool": pool, "kept": anon() - base}))
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MIMALLOC_", "ARROW_DEFAULT_MEMORY_POOL", "FLASH_MALLOC_REUSE"))}


def _run(code: str, *args: str, timeout: float = 300) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_clean_env(), timeout=timeout,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_sessions_last_task_returns_arrows_pages_and_an_earlier_task_keeps_them_for_the_next() -> None:
    kept = _run(TASK_PROBE, "earlier")
    assert kept["pool"] >= 160 * MiB
    assert kept["kept"] >= 120 * MiB, kept  # mimalloc keeps them: the next task reuses them without faulting
    last = _run(TASK_PROBE, "last")
    assert last["kept"] <= 24 * MiB, last


# A compaction of 800,000 rows in a warm engine, then the account of the process that ran its steps: with
# executor "ray", a Ray of one CPU (one worker runs every task) and that worker's own account, read by a task
COMPACTION_PROBE = r"""
import json, sys, time
import numpy as np, pyarrow as pa
from flash_pipeline import Catalog, compact

lake, executor = sys.argv[1], sys.argv[2]

def account():
    import ctypes, os
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    m = mallinfo2()
    anon = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon")][0]
    return {"pid": os.getpid(), "anon": anon, "malloc": m.arena + m.hblkhd, "pool_peak": pa.default_memory_pool().max_memory()}

if executor == "ray":
    import ray
    ray.init(address="local", num_cpus=1, include_dashboard=False, namespace="flash-compactor", log_to_driver=False)
    remote_account = ray.remote(num_cpus=1)(account)
    steps_account = lambda: ray.get(remote_account.remote())
else:
    steps_account = account

cat = Catalog(lake)
rng = np.random.default_rng(7)
n = 200_000
for d in range(4):
    keys = rng.integers(0, 2 * n, n)
    cat.append("T", (), "upsert", [pa.table({"k": pa.array(keys, pa.int64()), "ts": pa.array(np.full(n, d), pa.int64()),
                                            "s": pa.array(np.char.add("row-", keys.astype(str)).astype(object)).cast(pa.large_string()),
                                            "pad": pa.array(["x" * 600] * n)})])  # a unit's rows use the pool
cat.append("W", (), "upsert", [pa.table({"k": [1, 2], "ts": [0, 0], "s": ["a", "b"], "pad": ["x", "y"]})])
quiet = lambda m: None
compact("W", ["k"], catalog=cat, executor=executor, progress=quiet, num_cpus=1)  # modules and kernels loaded
before = steps_account()
compact("T", ["k"], sort_keys=[("ts", "ascending")], catalog=cat, executor=executor, progress=quiet, num_cpus=1,
        rows_per_compacted_file=100_000)
if executor == "ray":
    time.sleep(3)  # past the worker's idle release of malloc's pages (WORKER_IDLE_SECONDS)
after = steps_account()
print(json.dumps({"same_process": before["pid"] == after["pid"], "kept": after["anon"] - before["anon"],
                  "malloc_kept": after["malloc"] - before["malloc"], "pool_peak": after["pool_peak"]}))
"""


# what a process may keep of the round beyond malloc's: a few of mimalloc's segments and Arrow's own state
KEPT_BOUND = 48 * MiB


def _kept_outside_malloc(got: dict[str, int]) -> int:
    """What the process kept of the round beyond what glibc's malloc holds: Arrow's pool, whose pages are the
    subject here. (malloc's own -- an in-process round's step threads leave their arenas' free tops, which
    glibc's malloc_trim does not return -- are runtime/memory.py's reuse block and its tests' concern.)"""
    return got["kept"] - got["malloc_kept"]


def test_an_idle_ray_worker_keeps_no_arrow_pages_of_the_round_it_ran(tmp_path: Path) -> None:
    """In a warm Ray's worker after the compaction: what Arrow's pool freed went back to the system at the end
    of the session's last materialize task. Without it the worker kept 73-309 MiB beyond malloc's (140 MiB of
    a 973 MiB pool peak in this probe, at 61d99fd); with it 1-21 MiB of a 188 MiB peak (units of 128Ki rows:
    source_io.UNIT_ROWS). The bound is in MiB, not a share of the peak: the peak follows the unit size."""
    got = _run(COMPACTION_PROBE, str(tmp_path / "lake"), "ray", timeout=600)
    assert got["same_process"], got
    assert got["pool_peak"] >= 128 * MiB, got  # the round did use Arrow's pool in that worker
    assert _kept_outside_malloc(got) <= KEPT_BOUND, got


def test_compact_returns_arrows_pages_to_the_system_before_it_returns(tmp_path: Path) -> None:
    """The same compaction in process: a long-lived caller (a service, a notebook) does not keep the round's
    pages of Arrow's pool once compact() returned (without the release: 371 MiB beyond malloc's of a 583 MiB
    pool peak in this probe, at 61d99fd; with it 12-17 MiB of a 188 MiB peak)."""
    got = _run(COMPACTION_PROBE, str(tmp_path / "lake"), "in-process")
    assert got["pool_peak"] >= 128 * MiB, got
    assert _kept_outside_malloc(got) <= KEPT_BOUND, got


def test_the_release_waits_for_joined_step_threads_to_finish_exiting() -> None:
    """Joining a pool's thread returns before the OS thread has run its thread-local destructors (mimalloc's hands
    the thread's pages back there), so the release first waits for the joined pool threads to be gone. Here each
    thread's exit is held up 0.4 s by a destructor of its own (libc's usleep, registered with pthread_key_create),
    as a busy machine's scheduler holds it up; the release returns only once those threads are gone."""
    import ctypes
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from flash_pipeline.compactor.runtime.memory import note_pool_thread, release_freed_memory

    libc = ctypes.CDLL(None)
    key = ctypes.c_uint()
    assert libc.pthread_key_create(ctypes.byref(key), libc.usleep) == 0
    delay_us = 400_000

    def step(_: int) -> int:
        libc.pthread_setspecific(key, ctypes.c_void_p(delay_us))  # usleep(delay_us) as this thread exits
        return threading.get_native_id()

    try:
        with ThreadPoolExecutor(max_workers=2, initializer=note_pool_thread) as pool:
            ids = set(pool.map(step, range(8)))
        lingering = {tid for tid in ids if os.path.exists(f"/proc/self/task/{tid}")}
        assert lingering, "the threads' destructors should still be running: the setup does not hold up their exit"
        started = time.monotonic()
        release_freed_memory()
        assert not {tid for tid in ids if os.path.exists(f"/proc/self/task/{tid}")}
        assert time.monotonic() - started < 2.0  # bounded by the memory module's wait
    finally:
        libc.pthread_key_delete(key)
