"""Where a job run's rounds execute: on Ray, or in this process when starting Ray would cost more than the work.

A fresh local Ray costs seconds before the first task runs (its processes, one worker per CPU, the engine's
imports in each); the paper's example compacts in a tenth of that. Small inputs therefore run the very same
step functions on a thread pool in this process (round.py). Ray is used whenever it is already there or asked
for: a Ray address in options or FLASH_RAY_ADDRESS, a Ray this process already joined, ``executor="ray"``, or
a worker crash point of the resilience tests (a worker must be a separate process to die alone).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Sequence

from flash_pipeline.errors import FlashError

RAY = "ray"
IN_PROCESS = "in-process"
EXECUTORS = (RAY, IN_PROCESS)

# Inputs (deltas plus the prior compacted version, bytes at rest) up to this size run in process by default.
# Measured on the 2-core benchmark machine (benchmarks/results.md, benchmarks/results_cold_start.md): a fresh
# command is 3-10x faster in process at every size up to 92 MiB (a cold Ray costs ~7 s), and at 385 MiB (s1,
# 6.3M rows) in-process rounds take as long as rounds on an already warm Ray with less than half its peak memory.
# Above this, or with more CPUs than threads can use well, Ray's processes pay off. FLASH_IN_PROCESS_MAX_BYTES
# overrides it.
IN_PROCESS_MAX_BYTES = 384 << 20


def parse_executor(value: object) -> str:
    text = str(value).strip().lower().replace("_", "-")
    if text in ("local", "inprocess"):
        text = IN_PROCESS
    if text not in EXECUTORS:
        raise FlashError(f"executor must be one of {', '.join(EXECUTORS)} (or auto), not {value!r}")
    return text


@dataclass(frozen=True)
class ExecutorChoice:
    executor: str
    reason: str

    @property
    def in_process(self) -> bool:
        return self.executor == IN_PROCESS


def in_process_max_bytes() -> int:
    raw = os.environ.get("FLASH_IN_PROCESS_MAX_BYTES")
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            raise FlashError(f"FLASH_IN_PROCESS_MAX_BYTES must be a number of bytes, not {raw!r}") from None
    return IN_PROCESS_MAX_BYTES


def ray_running_here() -> bool:
    """Whether this process already joined a Ray (without importing Ray when it was never imported)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def choose_executor(requested: str | None, ray_address: str | None, input_bytes: Sequence[int]) -> ExecutorChoice:
    """The executor of one job run from what was asked and the bytes at rest of each session's input."""
    if requested:
        return ExecutorChoice(parse_executor(requested), f"executor {requested} requested")
    env = os.environ.get("FLASH_EXECUTOR")
    if env and env != "auto":
        return ExecutorChoice(parse_executor(env), f"FLASH_EXECUTOR={env}")
    if ray_address or os.environ.get("FLASH_RAY_ADDRESS"):
        return ExecutorChoice(RAY, "a Ray address is configured")
    if ray_running_here():
        return ExecutorChoice(RAY, "Ray is already running in this process")
    if os.environ.get("FLASH_CRASH_AT", "").startswith("worker:"):
        return ExecutorChoice(RAY, "a worker crash point is set")
    limit = in_process_max_bytes()
    total = sum(input_bytes)
    if total <= limit:
        return ExecutorChoice(IN_PROCESS, f"{total} B of input (<= {limit} B): in this process, without starting Ray")
    return ExecutorChoice(RAY, f"{total} B of input (> {limit} B in-process limit): on Ray")


def local_resources(num_cpus: int | None) -> tuple[int, int, int]:
    """(CPUs, heap bytes, 'object store' bytes) for in-process rounds, split like a local Ray would split them:
    30% of available memory for intermediate objects, the rest of 70% for the tasks."""
    if num_cpus:
        cpus = num_cpus
    elif hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    available = _available_memory()
    store = int(available * 0.3)
    heap = max(256 << 20, int(available * 0.7) - store)
    return max(1, cpus), heap, store


def _available_memory() -> int:
    """MemAvailable of /proc/meminfo (what Ray sizes itself from), else free pages, else 4 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30
