"""The paper's RowCountsPendingMaterialize actor: dedupe tasks share their survivor counts through it.

Every dedupe task reports how many rows of each source file survive in its bucket; once all have reported,
the actor turns the counts into the compacted layout from which both the materialize tasks and the index
writers derive their positions, so index pointers predict the files before they are written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flash_pipeline.compactor.layout import Layout, compute_layout
from flash_pipeline.compactor.plan import RoundPlan

ACTOR_NAME = "flash-row-counts-pending-materialize"


class RowCountsPendingMaterialize:
    def __init__(self) -> None:
        self._rounds: dict[str, dict[int, np.ndarray]] = {}

    def add_row_counts(self, round_id: str, bucket: int, counts: np.ndarray) -> None:
        self._rounds.setdefault(round_id, {})[bucket] = counts

    def layout(self, round_id: str, plan: RoundPlan) -> Layout:
        got = self._rounds.get(round_id, {})
        missing = [b for b in range(plan.bucket_count) if b not in got]
        if missing:
            raise RuntimeError(f"round {round_id}: buckets {missing[:5]} have not reported row counts")
        counts = np.stack([got[b] for b in range(plan.bucket_count)])
        return compute_layout(plan, counts)

    def finish(self, round_id: str) -> None:
        self._rounds.pop(round_id, None)


def get_actor() -> Any:
    """One actor per Ray cluster (named, reused across rounds and sessions, costs no CPU slot)."""
    import ray

    remote_cls = ray.remote(num_cpus=0, max_concurrency=64)(RowCountsPendingMaterialize)
    return remote_cls.options(name=ACTOR_NAME, get_if_exists=True).remote()
