"""Progress inside a round: how many tasks of each step (hash bucket, dedupe, materialize) are done.

The round reports every change (``StepTick``); a :class:`StepReporter` turns that into what a person reads: a
structured dict for a caller's ``on_step`` (the CLI draws progress bars from it), or, without one, a progress
line at most every ``FLASH_PROGRESS_SECONDS`` (default 1 s) per step, and none at all for a step that finished
sooner: short compactions print nothing more than before, long ones show they are moving.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

StepTick = Callable[[int, str, int, int], None]  # (round, step, tasks done, tasks in the step)
OnStep = Callable[[dict[str, Any]], None]


def progress_interval() -> float:
    """FLASH_PROGRESS_SECONDS: at most one progress line per step this often (a bad value is refused in one line,
    like every FLASH_* setting; it was ignored)."""
    from flash_pipeline.settings import env_number

    return env_number("FLASH_PROGRESS_SECONDS", 1.0, 0.0, 86400.0, "a number of seconds from 0 to 86400", "1")


class StepReporter:
    """The ``StepTick`` of one session: dicts to ``on_step`` when given, else throttled lines to ``progress``."""

    def __init__(self, where: str, partition: Any, rounds: int, progress: Callable[[str], None],
                 on_step: OnStep | None = None, interval: float | None = None) -> None:
        self.where = where
        self.partition = partition
        self.rounds = rounds
        self.progress = progress
        self.on_step = on_step
        self.interval = progress_interval() if interval is None else interval
        self._started: dict[tuple[int, str], float] = {}
        self._last: dict[tuple[int, str], float] = {}
        self._lock = threading.Lock()

    def __call__(self, k: int, step: str, done: int, total: int) -> None:
        now = time.monotonic()
        key = (k, step)
        with self._lock:
            started = self._started.setdefault(key, now)
            elapsed = now - started
            if self.on_step is not None:
                self.on_step({"partition": [list(kv) for kv in self.partition], "round": k, "rounds": self.rounds,
                              "step": step, "done": done, "total": total, "elapsed_seconds": elapsed})
                return
            said = key in self._last
            if done < total:
                if elapsed < self.interval or now - self._last.get(key, started) < self.interval:
                    return
            elif not said and elapsed < self.interval:
                return  # a quick step: nothing to report
            self._last[key] = now
        self.progress(f"{self.where}: round {k}/{self.rounds} {step}: {done}/{total} tasks done ({elapsed:.1f}s)")


def no_ticks(k: int, step: str, done: int, total: int) -> None:
    """The ``StepTick`` of callers that do not report progress."""
