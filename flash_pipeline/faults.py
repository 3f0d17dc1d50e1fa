"""Crash points for resilience tests: ``FLASH_CRASH_AT=<point>`` SIGKILLs the process that reaches it.

Points: ``driver:hash_bucket``, ``driver:dedupe``, ``driver:materialize``, ``driver:between_rounds`` (the
driver dies while that step's tasks run, or after round 1 saved its state and completion file), ``driver:before_commit``
and ``driver:after_commit`` (every file written, the manifest not yet / just created) and ``worker:hash_bucket``,
``worker:dedupe``, ``worker:materialize`` (a Ray worker dies inside its task once; Ray retries the task);
``retain:after_expire`` and ``retain:during_delete`` (retention marked versions expired and deleted none / one
of their files).
``FLASH_CRASH_MARKER`` names a file that makes a worker crash happen only once. ``FLASH_CRASH_SIGNAL=INT`` (or
``TERM``) sends SIGINT, a user's Ctrl-C (or SIGTERM, a scheduler stopping the job) instead of SIGKILL. Unset,
this costs nothing.
"""

from __future__ import annotations

import os
import signal
import time


def crash_settings() -> tuple[str, str] | None:
    """The driver's crash settings, handed to Ray tasks in the round plan (workers do not share its env)."""
    point = os.environ.get("FLASH_CRASH_AT")
    return (point, os.environ.get("FLASH_CRASH_MARKER", "")) if point else None


def maybe_crash(point: str, settings: tuple[str, str] | None = None) -> None:
    if settings is None:
        settings = crash_settings()
    if not settings or settings[0] != point:
        return
    marker = settings[1]
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            return
    chosen = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}.get(os.environ.get("FLASH_CRASH_SIGNAL", ""),
                                                                signal.SIGKILL)
    os.kill(os.getpid(), chosen)
    if chosen != signal.SIGKILL:
        # Python runs the handler in the main thread, at its next chance: a session thread that sent the signal
        # waits a moment, as a real step would still be running, so the stop lands where the test put it
        time.sleep(1.0)
