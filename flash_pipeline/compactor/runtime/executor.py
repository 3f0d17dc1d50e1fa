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
AUTO = "auto"

# Inputs (deltas plus the prior compacted version, bytes at rest) up to this size run in process by default.
# Measured on the 2-core benchmark machine (benchmarks/results.md, benchmarks/results_cold_start.md): a fresh
# command is 3-10x faster in process at every size up to 92 MiB (a cold local Ray costs 7-8 s before its first
# task), and on a warm Ray rounds save at most 11% over in-process ones at 385 MiB (s1: 6.31 s vs 6.54 s; s4's
# 3,000 small files: 4.35 s vs 4.91 s; s5 in rounds: 10.42 s vs 10.48 s). Starting a Ray pays off only where
# in-process work would take longer than ~7 s / 11% = ~64 s, about 3.8 GiB at the measured ~60 MiB/s; memory
# is no reason to start one, as rounds keep in-process sessions within the same budget. So with up to
# SMALL_MACHINE_CPUS CPUs the limit is SMALL_MACHINE_MAX_BYTES. With more CPUs, threads of one process use
# them less well than Ray's worker processes (the GIL between Arrow calls): there, unmeasured, the limit stays
# at 384 MiB. FLASH_IN_PROCESS_MAX_BYTES overrides both.
IN_PROCESS_MAX_BYTES = 384 << 20
SMALL_MACHINE_CPUS = 4
SMALL_MACHINE_MAX_BYTES = 4 << 30


def parse_executor(value: object) -> str:
    """RAY, IN_PROCESS or AUTO (the default spelled out: chosen by input size, as when none is given)."""
    text = str(value).strip().lower().replace("_", "-")
    if text in ("local", "inprocess"):
        text = IN_PROCESS
    if text not in (*EXECUTORS, AUTO):
        raise FlashError(f"executor must be one of {', '.join(EXECUTORS)} (or auto), not {value!r}")
    return text


@dataclass(frozen=True)
class ExecutorChoice:
    executor: str
    reason: str

    @property
    def in_process(self) -> bool:
        return self.executor == IN_PROCESS


def in_process_max_bytes(cpus: int | None = None) -> int:
    """The in-process limit for a machine of ``cpus`` CPUs (this one's when None); see IN_PROCESS_MAX_BYTES."""
    raw = os.environ.get("FLASH_IN_PROCESS_MAX_BYTES")
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            raise FlashError(f"FLASH_IN_PROCESS_MAX_BYTES must be a number of bytes, not {raw!r}") from None
    if cpus is None:
        cpus = local_cpus(None)
    return SMALL_MACHINE_MAX_BYTES if cpus <= SMALL_MACHINE_CPUS else IN_PROCESS_MAX_BYTES


def ray_running_here() -> bool:
    """Whether this process already joined a Ray (without importing Ray when it was never imported)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def choose_executor(requested: str | None, ray_address: str | None, input_bytes: Sequence[int],
                    cpus: int | None = None) -> ExecutorChoice:
    """The executor of one job run from what was asked, the bytes at rest of each session's input and the CPUs
    in-process rounds would use."""
    if requested and parse_executor(requested) != AUTO:
        return ExecutorChoice(parse_executor(requested), f"executor {requested} requested")
    env = os.environ.get("FLASH_EXECUTOR")
    if env and parse_executor(env) != AUTO:
        return ExecutorChoice(parse_executor(env), f"FLASH_EXECUTOR={env}")
    from flash_pipeline.compactor.runtime.cluster import configured_ray_address  # imports no Ray

    if ray_address or configured_ray_address():
        return ExecutorChoice(RAY, "a Ray address is configured")
    if ray_running_here():
        return ExecutorChoice(RAY, "Ray is already running in this process")
    if os.environ.get("FLASH_CRASH_AT", "").startswith("worker:"):
        return ExecutorChoice(RAY, "a worker crash point is set")
    limit = in_process_max_bytes(cpus)
    total = sum(input_bytes)
    if total <= limit:
        return ExecutorChoice(IN_PROCESS, f"{total} B of input (<= {limit} B): in this process, without starting Ray")
    return ExecutorChoice(RAY, f"{total} B of input (> {limit} B in-process limit): on Ray")


def local_resources(num_cpus: int | None) -> tuple[int, int, int]:
    """(CPUs, heap bytes, 'object store' bytes) for in-process rounds, split like a local Ray would split them:
    30% of available memory for intermediate objects, the rest of 70% for the tasks."""
    cpus = local_cpus(num_cpus)
    available = _available_memory()
    store = int(available * 0.3)
    heap = max(256 << 20, int(available * 0.7) - store)
    return max(1, cpus), heap, store


def local_cpus(num_cpus: int | None) -> int:
    """The CPUs in-process rounds use: ``num_cpus`` if given, else those this process may run on."""
    if num_cpus:
        return max(1, num_cpus)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


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
