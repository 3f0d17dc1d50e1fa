"""How the compactor's processes get memory: no transparent huge pages, and freed memory reused while a round runs.

Transparent huge pages: off for the processes that run a round's steps (``FLASH_THP=on`` keeps them).

NumPy and Arrow's allocator ask the kernel for transparent huge pages on large allocations
(``madvise(MADV_HUGEPAGE)``). With the common ``defrag=madvise`` setting, a fault in such a region makes the
kernel assemble a 2 MiB page on the spot (direct compaction), and on a VM whose host reclaims freed guest memory
each of those pages is a host fault too. Measured on this project's 2-core VM (benchmarks/scripts/first_touch.py):
filling 1 GiB of fresh memory took 2.3-2.5 s with huge pages and 0.38-0.42 s without; s1 compacted in a fresh
process after 15 s idle took 4.6-5.0 s with them and 3.6-3.8 s without (hot: 3.5-4.6 s against 3.4-3.5 s). A
round's arrays are streamed once, in cache-sized partitions, so huge pages buy little TLB reach back.
Measured again on 2026-11-30 (benchmarks/results_thp_recheck.md) the idle penalty was gone (the host's reclaim
changed): huge pages made the s1 and s3 commands ~7% faster for 5-10% more peak RSS. The default stays off.

``prctl(PR_SET_THP_DISABLE)`` turns them off for the calling process and the processes it starts (Ray's head
and workers when the driver starts a local Ray); Ray tasks also apply it in their worker. Memory already mapped
keeps its pages. Linux only: elsewhere, or if the kernel refuses, nothing changes.

Freed memory reused (:func:`reusing_freed_memory`, ``FLASH_MALLOC_REUSE=off`` opts out): glibc's malloc hands
every allocation above its mmap threshold (at most 32 MiB) to the kernel as a fresh mapping and unmaps it when
freed, and trims freed memory at the top of its heaps, so each step's large arrays (a task's envelopes, a
bucket's rows, the index rows) are new pages that fault in one by one -- on this project's VM 0.8 s a GiB. While
a round's steps run, malloc is told to serve every allocation from its heaps and to keep what is freed
(``mallopt(M_MMAP_MAX, 0)``, a high ``M_TRIM_THRESHOLD``), so the next step reuses pages already in place; when
the last step of the process ends, large allocations are mappings again (at the 32 MiB threshold glibc itself
grows to) and ``malloc_trim(0)`` returns the freed memory to the system, so no round's peak stays with a
long-lived process. s1 in process: hash bucket 1.1-1.7 s -> 0.9-1.1 s, about the same peak RSS (1294-1344 MiB
against 1162-1328 MiB with it off). glibc only: elsewhere nothing changes. A session under a memory budget also
returns each step's freed pages, Arrow's included, at the step's end (:func:`release_freed_memory`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

from flash_pipeline.settings import env_switch

PR_SET_THP_DISABLE = 41
_applied: bool | None = None  # the outcome of the first call in this process


def huge_pages_setting() -> bool:
    """FLASH_THP: off (the default) or on; anything else is a one-line error naming the variable."""
    return env_switch("FLASH_THP", False, "off: no transparent huge pages for the compactor's processes")


def apply_huge_pages_setting() -> bool:
    """Turn transparent huge pages off for this process unless FLASH_THP=on (once; later calls only re-check the
    variable). Returns whether they are off."""
    global _applied
    keep = huge_pages_setting()
    if _applied is None:
        _applied = False
        if not keep and sys.platform.startswith("linux"):
            try:
                import ctypes

                _applied = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):  # no prctl in this libc: nothing to do
                _applied = False
    return _applied


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # mallopt parameters (malloc.h)
# what the block restores: glibc's own maximum mapping count, and the thresholds its dynamic adjustment reaches
# once a process has freed a large mapping (any mallopt call ends that adjustment for good, so restoring the
# initial 128 KiB thresholds would leave the process mapping and unmapping every allocation above 128 KiB)
_MMAP_MAX, _MMAP_THRESHOLD, _TRIM_THRESHOLD = 65536, 32 * 2**20, 64 * 2**20
_reuse_lock = threading.Lock()
_reuse_depth = 0
_reuse_libc: Any | None = None  # the library the outermost block changed, to restore


def _glibc() -> Any | None:
    """This process's C library when it is glibc (it has mallopt and malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def malloc_reuse_setting() -> bool:
    """FLASH_MALLOC_REUSE: on (the default) or off; anything else is a one-line error naming the variable."""
    return env_switch("FLASH_MALLOC_REUSE", True, "on: a round reuses the memory its steps free")


@contextmanager
def reusing_freed_memory() -> Iterator[None]:
    """Within this block (nestable, from any thread: the outermost decides), malloc serves large allocations
    from its heaps and keeps freed memory for the next one; after it, the defaults are back and the freed
    memory is returned to the system."""
    global _reuse_depth, _reuse_libc
    wanted = malloc_reuse_setting()
    with _reuse_lock:
        _reuse_depth += 1
        if _reuse_depth == 1:
            _reuse_libc = _glibc() if wanted else None
            if _reuse_libc is not None:
                _reuse_libc.mallopt(_M_MMAP_MAX, 0)
                _reuse_libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    try:
        yield
    finally:
        with _reuse_lock:
            _reuse_depth -= 1
            if _reuse_depth == 0 and _reuse_libc is not None:
                _reuse_libc.mallopt(_M_MMAP_MAX, _MMAP_MAX)
                _reuse_libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
                _reuse_libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
                _reuse_libc.malloc_trim(0)
                _reuse_libc = None


def _release_arrow_pool() -> None:
    """Return the pages Arrow's pool keeps for reuse. Its mimalloc (3.4 in pyarrow 26) purges freed pages
    after ``purge_delay`` (1 s), and only when the allocator is called again: an idle process kept its round's
    high water for good (in a warm Ray's workers after s1, Arrow's pool held 0 bytes while each worker kept
    300-350 MiB more than before the round). ``release_unused`` returns them in about 2 ms, but only those held
    by the calling thread's heap (from another thread -- a timer's, a session's once its step threads ended --
    it returned nothing): so it runs on the thread that ran the steps, a Ray worker's last task of a session
    (:func:`task_memory`) and ``compact``'s caller. Purging sooner while a round runs would lower the peak but
    costs page faults: warm s1 with MIMALLOC_PURGE_DELAY at 100 or 0 ms took 0.57 or 1.03 s longer (medians, on
    4.50 s) for 175 or 223 MiB less peak PSS (benchmarks/results_ray_memory.md)."""
    if "pyarrow" not in sys.modules:  # nothing of Arrow's to return, and no reason to import it
        return
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


# OS thread ids of the compactor's pool threads (see note_pool_thread), until seen gone
_pool_threads: set[int] = set()
_pool_lock = threading.Lock()
THREAD_EXIT_WAIT = 1.0  # seconds release_freed_memory waits, at most, for joined pool threads to finish exiting


def note_pool_thread() -> None:
    """A ``ThreadPoolExecutor`` initializer for pools whose threads run steps: remembers the thread's OS id, so
    that :func:`release_freed_memory` can wait for it to finish exiting once the pool was joined."""
    with _pool_lock:
        _pool_threads.add(threading.get_native_id())


def _await_joined_pool_threads(timeout: float = THREAD_EXIT_WAIT) -> None:
    """Wait until the pool threads Python has joined are gone from the kernel too. Joining a Python thread
    returns when its Python code ended, before the OS thread's exit runs its thread-local destructors, among
    them mimalloc's, which hands the thread's heap pages back to the arenas that ``release_unused`` purges: a
    release racing a busy machine's exiting step threads found their pages still held (CI: 276 MiB kept beyond
    malloc's after compact(), purged a second later). Linux only; bounded by ``timeout``."""
    if not _pool_threads or not sys.platform.startswith("linux"):
        return
    running = {t.native_id for t in threading.enumerate()}  # a concurrent compaction's pools: not waited for
    with _pool_lock:
        exiting = _pool_threads - running
    deadline = time.monotonic() + timeout
    while exiting:
        gone = {tid for tid in exiting if not os.path.exists(f"/proc/self/task/{tid}")}
        with _pool_lock:
            _pool_threads.difference_update(gone)
        exiting -= gone
        if exiting and time.monotonic() >= deadline:
            with _pool_lock:  # not ours any more (an id the kernel reused): never waited for again
                _pool_threads.difference_update(exiting)
            return
        if exiting:
            time.sleep(0.001)


def release_freed_memory() -> None:
    """Return the pages both allocators keep for reuse to the system now: glibc's free heap pages
    (``malloc_trim(0)``, whatever the thresholds) and those of Arrow's pool (``release_unused``).

    For sessions under a memory budget (several rounds), at each step's end. The steps use different allocators
    (hash bucket and materialize decode Parquet into Arrow's pool; dedupe's arrays are NumPy's, from malloc), and
    each allocator keeps its own high water for reuse, so a process's resident memory grew to the sum of the
    steps' peaks instead of the largest. Released, the next step faults its pages in again (about 0.8 s a GiB on
    this project's VM): under a budget that is at most a budget's worth per step. Pool threads already joined
    finish exiting first (:func:`_await_joined_pool_threads`)."""
    _await_joined_pool_threads()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    _release_arrow_pool()


_process_exits_after = ContextVar("process_exits_after", default=False)


@contextmanager
def process_exits_after_job() -> Iterator[None]:
    """Inside: the process ends right after this job (the ``flash-compactor compact`` command), whose exit returns
    every page, so :func:`release_at_job_end` skips the return (Arrow's pool, 20 ms of a 1.1 s command)."""
    token = _process_exits_after.set(True)
    try:
        yield
    finally:
        _process_exits_after.reset(token)


def release_at_job_end() -> None:
    """:func:`release_freed_memory` after a job, unless the process ends right after it."""
    if not _process_exits_after.get():
        release_freed_memory()


# How long a Ray worker keeps the memory its steps freed after its last task ends (see task_memory).
WORKER_IDLE_SECONDS = 2.0
_worker_lock = threading.Lock()
_worker_block: Any | None = None  # the reusing_freed_memory block a worker holds across its tasks
_worker_timer: threading.Timer | None = None
_worker_tasks = 0  # tasks begun in this process: an idle timer set before the latest one does nothing


def _hold_worker_memory() -> None:
    """Enter the worker's reuse block (if not held) and call off a pending idle release."""
    global _worker_block, _worker_timer, _worker_tasks
    with _worker_lock:
        _worker_tasks += 1
        if _worker_timer is not None:
            _worker_timer.cancel()
            _worker_timer = None
        if _worker_block is None:
            _worker_block = reusing_freed_memory()
            _worker_block.__enter__()


def _release_when_idle(seconds: float) -> None:
    """Leave the worker's reuse block (returning malloc's freed memory) ``seconds`` from now, unless a task
    begins. Arrow's pool cannot be released from this timer's thread (:func:`_release_arrow_pool`)."""
    global _worker_timer
    with _worker_lock:
        begun = _worker_tasks
        _worker_timer = threading.Timer(seconds, _release_idle_worker, args=(begun,))
        _worker_timer.daemon = True
        _worker_timer.start()


def _release_idle_worker(begun: int) -> None:
    global _worker_block, _worker_timer
    with _worker_lock:
        if begun != _worker_tasks or _worker_block is None:
            return  # a task began since: it holds the memory now
        block, _worker_block, _worker_timer = _worker_block, None, None
        block.__exit__(None, None, None)


@contextmanager
def task_memory(release: bool = False, fresh: bool = False, last: bool = False) -> Iterator[None]:
    """A Ray task's memory settings around its step: this worker's own FLASH_THP (a worker does not see the
    driver's environment, and acts on it once per process), then freed memory reused while the step runs; with
    ``release`` (a session under a memory budget), what the step freed goes back to the system at its end.

    A worker runs a session's steps one after another, as an in-process session runs them in one reuse block:
    so the worker keeps what malloc freed from one task to the next (hash bucket's envelopes become dedupe's
    and the index writer's NumPy arrays), and returns it once idle for WORKER_IDLE_SECONDS -- a long-lived
    Ray's idle worker does not keep a round's peak. A ``fresh`` task (materialize, whose rows come from Arrow's
    own pool, not malloc's) returns it first: kept, it added to materialize's peak (warm s1's Ray processes
    peaked at 3,258-3,329 MiB RSS against 2,719-2,824 MiB before; returned first, 2,702-2,788 MiB). Measured
    on warm s1, six alternating pairs: dedupe 0.46-0.62 s against 0.51-0.65 s (the step whose pages were all
    fresh before); the whole compaction's spread (3.8-4.8 s) hid any difference in its total.

    A ``last`` task (a materialize task of the session's last wave: the driver starts no later one) also returns
    Arrow's pool at its end, on the task's own thread, the only one its pages go back from
    (:func:`_release_arrow_pool`): measured after s1 on a warm Ray, each idle worker kept 434-499 MiB anonymous
    memory without it and 131-144 MiB with it (a warmed worker holds ~127 MiB before any round). Released by an
    earlier task, the worker's next one would fault its pages in afresh."""
    apply_huge_pages_setting()
    _hold_worker_memory()
    if fresh:
        libc = _glibc()
        if libc is not None:
            libc.malloc_trim(0)
    try:
        yield
    finally:
        if release:
            release_freed_memory()
        elif last:
            _release_arrow_pool()
        _release_when_idle(WORKER_IDLE_SECONDS)
