"""The full suite's scheduler (`--dist loadscope`, README) made safe for a worker that dies mid-run.

pytest-xdist 3.8.0 (the latest release) puts a crashed worker's whole workload back on the queue: the modules it
had finished come back as empty units, which no worker ever reports done, so the run waits forever at its end
(pytest-dev/pytest-xdist#1378); and the test the worker died on is run again, taking its replacement down too
(#1371). On this project's 2-core VM one crash (a worker gone without a traceback) left a full run waiting at
99% with every worker idle, where it should have failed that test and finished. Here a crashed worker's finished
modules stay finished, the test it died on is reported failed (xdist does that) and is not run again, and the
rest of its module goes back on the queue."""

from __future__ import annotations

from typing import Any


def crash_safe_loadscope(config: Any, log: Any) -> Any:
    """A LoadScopeScheduling whose ``remove_node`` re-queues only what the dead worker left unfinished."""
    from xdist.scheduler import LoadScopeScheduling

    class CrashSafeLoadScope(LoadScopeScheduling):  # type: ignore[misc]
        def remove_node(self, node: Any) -> str | None:
            workload = self.assigned_work.pop(node)
            if not self._pending_of(workload):
                return None
            crashitem = next(nodeid for unit in workload.values() for nodeid, done in unit.items() if not done)
            for unit in workload.values():
                if crashitem in unit:
                    unit[crashitem] = True  # reported failed by xdist; run again it would take the next worker too
            self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

    return CrashSafeLoadScope(config, log)
