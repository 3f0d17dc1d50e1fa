"""Stopping a job run when its user interrupts it (Ctrl-C in the terminal, a terminated Dagster run).

Python delivers the interrupt to the main thread only, while each session runs in a thread of its own: the job
sets a :class:`StopRequest`, and every session checks it at its step boundaries and before its commit, so it
stops within a step (the tasks of a step in flight finish; nothing is cut off mid-write) and commits nothing. A
session past its commit completes: its version stays, as committed versions always do. Before, the job's thread
pool waited for every session to finish and commit, and only then reported the interrupt.
"""

from __future__ import annotations

import threading

from flash_pipeline.errors import Interrupted


class StopRequest:
    """Set once by the job on an interrupt; read by its sessions."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self, where: str, before: str) -> None:
        """Raise :class:`Interrupted` if a stop was requested (``before``: what the session would do next)."""
        if self._event.is_set():
            raise Interrupted(f"{where}: interrupted before {before}; this session committed nothing (run the command "
                              "again)")
