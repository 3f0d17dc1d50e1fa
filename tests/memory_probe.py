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


class PeakMemory:
    def __init__(self, interval: float = 0.05) -> None:
        self.root = psutil.Process()
        self.interval = interval
        self.peak = 0
        self.baseline = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss(self.root))
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.baseline = tree_pss(self.root)
        self.peak = self.baseline
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss(self.root))

    @property
    def growth(self) -> int:
        return self.peak - self.baseline
