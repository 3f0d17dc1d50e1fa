"""The full suite's scheduler (`--dist loadscope`, README) made safe for a worker that dies mid-run.

pytest-xdist 3.8.0 (the latest release) puts a crashed worker's whole workload back on the queue: the modules it
had finished come back as empty units, which no worker ever reports done, so the run waits forever at its end
(pytest-dev/pytest-xdist#1378); and the test the worker died on is run again, taking its replacement down too
(#1371). On this project's 2-core VM one crash (a worker gone without a traceback) left a full run waiting at
99% with every worker idle, where it should have failed that test and finished. Here a crashed worker's finished
modules stay finished, the test it died on is reported failed (xdist does that) and is not run again, and the
rest of its module goes back on the queue. A worker that dies just after reporting a test done, before xdist has
seen it go, makes the next hand-out of work fail to send ("cannot send (already closed?)", an INTERNALERROR that
ended a run with exit 3): that unit goes back on the queue for the worker's replacement."""

from __future__ import annotations

from typing import Any


def crash_safe_loadscope(config: Any, log: Any) -> Any:
    """A LoadScopeScheduling whose ``remove_node`` re-queues only what the dead worker left unfinished."""
    from xdist.scheduler import LoadScopeScheduling

    class CrashSafeLoadScope(LoadScopeScheduling):  # type: ignore[misc]
        def _assign_work_unit(self, node: Any) -> None:
            scope, unit = next(iter(self.workqueue.items()))
            try:
                super()._assign_work_unit(node)
            except OSError:  # the worker is gone; its remove_node follows and finds this unit not its own
                self.assigned_work[node].pop(scope, None)
                self.workqueue[scope] = unit
                self.workqueue.move_to_end(scope, last=False)

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
