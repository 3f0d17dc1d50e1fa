"""Freed memory reused while a round runs (runtime/memory.py, FLASH_MALLOC_REUSE), read from glibc's own account
of its heaps (``mallinfo2``) in a fresh process: inside the block a large array comes from malloc's heap, not a
fresh mapping, and is kept when freed; after it, the heap is trimmed and large arrays are mappings again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_helpers import assert_compact_command_refused

# glibc's account of its heaps, as a probe process reads it
MALLINFO = r"""
import ctypes, json, time
import numpy as np

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
info = lambda: {name: getattr(libc.mallinfo2(), name) for name, _ in MallInfo2._fields_}
MiB = 2**20
"""

PROBE = MALLINFO + r"""
from flash_pipeline.compactor.runtime.memory import reusing_freed_memory
out = {}
with reusing_freed_memory():
    with reusing_freed_memory():  # nested: the outer block decides
        a = np.ones(96 * MiB, dtype=np.uint8)
        out["inside"] = info()
        del a
    out["freed_inside"] = info()
out["after"] = info()
b = np.ones(96 * MiB, dtype=np.uint8)
out["outside"] = info()
c = np.ones(8 * MiB, dtype=np.uint8)
out["outside_mid"] = info()
print(json.dumps(out))
"""


def _probe(env: dict[str, str]) -> dict[str, dict[str, int]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_MALLOC_REUSE", "MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env={**base, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _has_mallinfo2() -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_mallinfo2(), reason="glibc 2.33+ only (mallinfo2)")
MiB = 2**20


@glibc_only
def test_inside_a_round_freed_memory_is_kept_for_reuse_and_returned_after() -> None:
    got = _probe({})
    assert got["inside"]["hblkhd"] < 96 * MiB <= got["inside"]["arena"]  # from the heap, not a fresh mapping
    assert got["freed_inside"]["fordblks"] >= 96 * MiB  # kept by malloc, not unmapped
    assert got["after"]["arena"] < 96 * MiB  # returned to the system when the outer block ends
    assert got["outside"]["hblkhd"] >= 96 * MiB  # and large arrays are mappings again
    # at glibc's grown threshold (32 MiB), not the initial 128 KiB: an 8 MiB array still comes from the heap
    assert got["outside_mid"]["hblkhd"] - got["outside"]["hblkhd"] < 8 * MiB


@glibc_only
def test_flash_malloc_reuse_off_leaves_malloc_as_it_is() -> None:
    got = _probe({"FLASH_MALLOC_REUSE": "off"})
    assert got["inside"]["hblkhd"] >= 96 * MiB
    assert got["freed_inside"]["fordblks"] < 96 * MiB


RELEASE_PROBE = r"""
import json, time
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from flash_pipeline.compactor.runtime.memory import release_freed_memory, reusing_freed_memory

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024

MiB = 2**20
out = {"base": rss()}
with reusing_freed_memory():
    a = np.ones(96 * MiB, dtype=np.uint8)  # malloc's heap
    src = pa.array(np.arange(128 * 1024, dtype=np.int64))  # zero-copy of NumPy's buffer
    arrays = [pc.add(src, i) for i in range(96)]  # 96 x 1 MiB from Arrow's pool
    out["arrow"] = pa.total_allocated_bytes()
    del a, src, arrays
    time.sleep(0.1)
    out["freed"] = rss()
    release_freed_memory()
    out["released"] = rss()
print(json.dumps(out))
"""


@glibc_only
def test_a_budgeted_session_returns_both_allocators_freed_pages_at_a_steps_end() -> None:
    """What a session under a memory budget does at each step's end (round.py, runtime/tasks.py): the pages malloc
    and Arrow's pool kept after the step freed its arrays go back to the system, so the next step's peak does not
    add to this one's. Without the Arrow half, 96 MiB would stay resident."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_MALLOC_REUSE", "MALLOC_", "GLIBC_TUNABLES", "MIMALLOC_"))}
    done = subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True, env=base, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["arrow"] >= 96 * MiB
    assert got["freed"] - got["base"] >= 160 * MiB, got  # both allocators kept what was freed
    assert got["released"] - got["base"] <= 32 * MiB, got


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_flash_malloc_reuse_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path: Path, value: str) -> None:
    assert_compact_command_refused(tmp_path, {"FLASH_MALLOC_REUSE": value}, "FLASH_MALLOC_REUSE")


WORKER_PROBE = MALLINFO + r"""
from flash_pipeline.compactor.runtime import memory
memory.WORKER_IDLE_SECONDS = 0.6
out = {}
with memory.task_memory():  # a hash bucket task
    a = np.ones(96 * MiB, dtype=np.uint8)
    del a
out["between_tasks"] = info()
time.sleep(0.3)
with memory.task_memory():  # the next task, within the idle window: it reuses the pages
    out["next_task"] = info()
    b = np.ones(96 * MiB, dtype=np.uint8)
    out["next_task_allocated"] = info()
    del b
time.sleep(0.4)  # 0.7 s after the first task, 0.4 s after the second: still held
out["idle_briefly"] = info()
time.sleep(1.0)
out["idle"] = info()
c = np.ones(96 * MiB, dtype=np.uint8)
out["outside"] = info()
del c
with memory.task_memory():  # a dedupe task
    d = np.ones(96 * MiB, dtype=np.uint8)
    del d
with memory.task_memory(fresh=True):  # a materialize task: its rows come from Arrow's pool
    out["fresh_task"] = info()
print(json.dumps(out))
"""


@glibc_only
def test_a_ray_worker_keeps_freed_memory_between_tasks_and_returns_it_once_idle() -> None:
    """runtime/memory.py task_memory, as each Ray task runs in its worker: the memory a task freed stays with the
    worker for the session's next task (no fresh pages to fault in), and goes back to the system once the worker
    has been idle for WORKER_IDLE_SECONDS -- counted from its last task, not its first; a ``fresh`` task
    (materialize) returns it as it begins."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_MALLOC_REUSE", "MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run([sys.executable, "-c", WORKER_PROBE], capture_output=True, text=True, env=base, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["between_tasks"]["fordblks"] >= 96 * MiB  # kept after the task
    assert got["next_task_allocated"]["arena"] - got["next_task"]["arena"] < 8 * MiB  # reused, the heap did not grow
    assert got["next_task_allocated"]["hblkhd"] < 96 * MiB  # from the heap, not a fresh mapping
    assert got["idle_briefly"]["fordblks"] >= 96 * MiB  # the second task restarted the idle clock
    assert got["idle"]["arena"] < 96 * MiB  # returned once idle
    assert got["outside"]["hblkhd"] >= 96 * MiB  # and malloc's defaults are back
    assert got["fresh_task"]["arena"] < 96 * MiB and got["fresh_task"]["fordblks"] < 96 * MiB
