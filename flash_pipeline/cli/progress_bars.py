"""Progress bars for a terminal: one tqdm bar per step of a round while it runs (tasks done of total).

Used by ``compact`` when stderr is a terminal; elsewhere (logs, CI, Dagster) the engine's throttled progress
lines say the same (runtime/progress.py). A bar appears only for a step still running after
``FLASH_PROGRESS_SECONDS`` (tqdm's ``delay``), so quick compactions print no bars at all.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.compactor.runtime.progress import OnStep, progress_interval


class StepBars:
    """An ``on_step`` callback drawing the bars; ``close()`` ends any left open (e.g. after an error)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.bars: dict[tuple[Any, ...], Any] = {}
        self.lock = threading.Lock()

    def __call__(self, info: dict[str, Any]) -> None:
        from tqdm import tqdm

        part = tuple(tuple(kv) for kv in info["partition"])
        key = (part, info["round"], info["step"])
        with self.lock:
            bar = self.bars.get(key)
            if bar is None:
                desc = f"[{format_partition(part)}] round {info['round']}/{info['rounds']} {info['step']}"
                bar = tqdm(total=info["total"], desc=desc, unit="task", file=self.stream, delay=progress_interval(),
                           leave=False, dynamic_ncols=True)
                self.bars[key] = bar
            bar.n = info["done"]
            bar.refresh()
            if info["done"] >= info["total"]:
                bar.close()
                del self.bars[key]

    def close(self) -> None:
        with self.lock:
            for bar in self.bars.values():
                bar.close()
            self.bars.clear()


def terminal_bars(stream: Any = None) -> tuple[OnStep | None, StepBars | None]:
    """(on_step, bars) for a terminal on ``stream`` (stderr by default), else (None, None)."""
    stream = stream or sys.stderr
    if not getattr(stream, "isatty", lambda: False)():
        return None, None
    bars = StepBars(stream)
    return bars, bars
