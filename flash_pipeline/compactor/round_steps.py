"""What the two ways of running a round's steps share (round.py in this process, steps_on_ray.py on Ray): the
step names progress reports, which rounds still run, the timings and statistics summed over tasks, the probe
range, the layout of the compacted files from every bucket's counts and the order materialize tasks start in."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from flash_pipeline.catalog.key_ranges import KeyRange, KeyRangeBuilder, merged
from flash_pipeline.catalog.model import DataFile, IndexFile
from flash_pipeline.compactor.kernels.layout import Layout, compute_layout
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.model.survivors import SurvivorMap

HASH_BUCKET, DEDUPE, MATERIALIZE = "hash bucket", "dedupe", "materialize"  # the step names progress reports use
StepsOutput = tuple[Layout, list[dict[str, int]], list[DataFile], list[tuple[IndexFile, ...]]]
# called after each round but the last, once its dedupe state is saved: (round number, summed statistics)
AfterRound = Callable[[int, dict[str, int]], None]
# called at each step boundary with what comes next: raises to stop the session there (runtime/interrupt.py)
StopCheck = Callable[[str], None]


def never(before: str) -> None:
    """The StopCheck of a round nobody stops."""


def rounds_to_run(plan: RoundPlan) -> range:
    """Round numbers (1-based) still to run: a resumed session skips the rounds its state holds."""
    return range((plan.resume[0] if plan.resume is not None else 0) + 1, plan.rounds + 1)


def summed(stats_list: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(int(s[k]) for s in stats_list) for k in stats_list[0]} if stats_list else {}


def add_time(timings: dict[str, float], step: str, seconds: float) -> None:
    timings[step] = timings.get(step, 0.0) + seconds


def survivor_map(plan: RoundPlan, bucket_ranks: Iterable[np.ndarray]) -> SurvivorMap:
    """The last round's survivors (each bucket's ranks, in bucket order) as materialize reads them in a session
    of several rounds: a bucket number per input row (model/survivors.py), 1 byte a row instead of 8 a survivor."""
    survivors = SurvivorMap.empty(plan)
    for bucket, ranks in enumerate(bucket_ranks):
        survivors.mark(bucket, ranks)
    return survivors


def probe_range_of(plan: RoundPlan, builders: list[KeyRangeBuilder | None]) -> KeyRange | None:
    """The range of the session's delta keys, for dedupe's probe to skip index files by (catalog/key_ranges.py).
    None when the plan does not probe by range, or in a resumed session: the rounds it skips saw keys this
    process never did."""
    if not plan.probes_by_key_range or plan.resume is not None:
        return None
    return merged(builders, plan.spec.primary_keys[0])


def layout_of(plan: RoundPlan, counts: list[np.ndarray], lost_ranks: list[np.ndarray]) -> Layout:
    """The round's compacted layout from every bucket's row counts and lost prior ranks (in bucket order)."""
    if not counts:
        return compute_layout(plan, np.zeros((0, len(plan.sources)), dtype=np.int64), np.zeros(0, dtype=np.int64))
    return compute_layout(plan, np.stack(counts), np.sort(np.concatenate(lost_ranks).astype(np.int64)))


def largest_first(layout: Layout) -> list[int]:
    """The order materialize tasks are started in: the most rows first, after the index writers (each a
    bucket's whole index). Started in task order, with the index writers last, a round ended with one CPU
    writing an index while the other idled (s1: ~0.27 s of its 2.4 s materialize); the small tasks now
    fill the end instead."""
    return sorted(range(len(layout.task_rows)), key=lambda m: (-int(layout.task_rows[m]), m))
