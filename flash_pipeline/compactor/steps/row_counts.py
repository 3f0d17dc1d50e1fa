"""The paper's RowCountsPendingMaterialize actor: dedupe tasks share their survivor counts through it.

Every dedupe task reports how many rows of each delta file survive in its bucket and which prior compacted
rows lost; once all have reported,
the actor turns the counts into the compacted layout from which both the materialize tasks and the index
writers derive their positions, so index pointers predict the files before they are written.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from flash_pipeline.compactor.kernels.layout import Layout, compute_layout
from flash_pipeline.compactor.model.plans import RoundPlan

ACTOR_NAME = "flash-row-counts-pending-materialize"


class RowCountsPendingMaterialize:
    def __init__(self) -> None:
        self._rounds: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}

    def add_row_counts(self, round_id: str, bucket: int, counts: np.ndarray, lost_ranks: np.ndarray) -> None:
        self._rounds.setdefault(round_id, {})[bucket] = (counts, lost_ranks)

    def layout(self, round_id: str, plan: RoundPlan) -> Layout:
        got = self._rounds.get(round_id, {})
        missing = [b for b in range(plan.bucket_count) if b not in got]
        if missing:
            raise RuntimeError(f"round {round_id}: buckets {missing[:5]} have not reported row counts")
        counts = np.stack([got[b][0] for b in range(plan.bucket_count)])
        lost = np.sort(np.concatenate([got[b][1] for b in range(plan.bucket_count)]).astype(np.int64))
        return compute_layout(plan, counts, lost)

    def finish(self, round_id: str) -> None:
        self._rounds.pop(round_id, None)


_handle: Any = None
_handle_lock = threading.Lock()


def get_actor() -> Any:
    """One actor per driver, named, reused across rounds and sessions, costing no CPU slot.

    The handle is kept for the life of the process: Ray kills an actor whose last handle is dropped, and
    starting a new actor process costs seconds.
    """
    import ray

    global _handle
    with _handle_lock:
        if _handle is None:
            remote_cls = ray.remote(num_cpus=0, max_concurrency=64)(RowCountsPendingMaterialize)
            name = f"{ACTOR_NAME}-{ray.get_runtime_context().get_job_id()}"
            _handle = remote_cls.options(name=name, get_if_exists=True).remote()
        return _handle
