"""Peak memory of a process tree (this process, Ray's raylet, workers, object store), sampled in a thread.

PSS (proportional set size) counts a shared page once across processes, so Ray's shared-memory object store
is not counted once per worker that maps it.
"""

from __future__ import annotations

import threading
import time

import psutil


def tree_pss(root: psutil.Process) -> int:
    total = 0
    for p in [root] + root.children(recursive=True):
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def object_store_used() -> int:
    """Bytes of primary copies in Ray's object store right now: the live intermediate data of a round.

    Unpinned objects whose references were dropped stay in the store (counted in ``object_store_bytes_used``)
    until memory pressure evicts them: that is a cache, not data the round holds."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_primary_copy)


class PeakMemory:
    def __init__(self, interval: float = 0.05) -> None:
        self.root = psutil.Process()
        self.interval = interval
        self.peak = 0
        self.baseline = 0
        self.store_peak = 0
        self.store_baseline = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss(self.root))
            self.store_peak = max(self.store_peak, object_store_used())
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.baseline = tree_pss(self.root)
        self.peak = self.baseline
        self.store_baseline = self.store_peak = object_store_used()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss(self.root))

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    @property
    def store_growth(self) -> int:
        return self.store_peak - self.store_baseline
