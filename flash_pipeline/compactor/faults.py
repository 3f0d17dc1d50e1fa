"""Crash points for resilience tests: ``FLASH_CRASH_AT=<point>`` SIGKILLs the process that reaches it.

Points: ``driver:hash_bucket``, ``driver:dedupe``, ``driver:materialize``, ``driver:between_rounds`` (the
driver dies while that step's tasks run, or after round 1 committed) and ``worker:hash_bucket``,
``worker:dedupe``, ``worker:materialize`` (a Ray worker dies inside its task once; Ray retries the task).
``FLASH_CRASH_MARKER`` names a file that makes a worker crash happen only once. Unset, this costs nothing.
"""

from __future__ import annotations

import os
import signal


def maybe_crash(point: str) -> None:
    wanted = os.environ.get("FLASH_CRASH_AT")
    if not wanted or wanted != point:
        return
    marker = os.environ.get("FLASH_CRASH_MARKER")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
