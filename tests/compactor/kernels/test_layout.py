"""The round's compacted layout (kernels/layout.py) against an explicit model that lays out every row.

The model follows the module's ordering rules literally: carried prior files first (numbered 1..C), then each
materialize task in order, its sources in src order, a prior unit's surviving rows in their old order, a delta
file's survivors by hash bucket then row index, every task cut into files of at most rows_per_file rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import kernel_form
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.compactor.kernels.layout import compute_layout, index_pointers
from flash_pipeline.compactor.model.plans import RoundPlan, SessionSpec, SourceFile, rank_of


@st.composite
def rounds(draw: st.DrawFn) -> dict[str, Any]:
    buckets = draw(st.integers(1, 4))
    rows_per_file = draw(st.integers(1, 7))
    sources: list[SourceFile] = []
    prior_file_rows = []
    lost: list[int] = []  # ranks of prior rows that lost
    for number in range(1, draw(st.integers(0, 3)) + 1):  # prior files, each one or two units
        unit_rows = draw(st.lists(st.integers(0, 6), min_size=1, max_size=2))
        start = 0
        for rows in unit_rows:
            src = len(sources)
            sources.append(SourceFile(src, f"p{number}", ContentType.PARQUET, rows, 0, -1, number, False, True, (), start))
            lost += [int(rank_of(src, r)) for r in range(rows) if draw(st.booleans()) and draw(st.booleans())]
            start += rows
        prior_file_rows.append(start)
    survivors: dict[int, list[tuple[int, int]]] = {}  # delta src -> [(row, bucket)]
    for position in range(1, draw(st.integers(1, 3)) + 1):  # a round has at least one delta
        src = len(sources)
        rows = draw(st.integers(0, 6))
        is_delete = draw(st.booleans()) and draw(st.booleans())
        sources.append(SourceFile(src, f"d{position}", ContentType.PARQUET, rows, 0, position, 1, is_delete, False))
        if not is_delete:
            survivors[src] = [(r, draw(st.integers(0, buckets - 1))) for r in range(rows) if draw(st.booleans())]
    spec = SessionSpec("T", "T", (), 1, ("k",), (), 0, ("k",), "", rows_per_file, 10, ContentType.PARQUET, False)
    plan = RoundPlan("r", 2, spec, buckets, tuple(sources), None, (), draw(st.integers(1, 12)), "data", "index",
                     materialize_min_rows=draw(st.integers(1, 5)), prior_file_rows=tuple(prior_file_rows))
    return {"plan": plan, "lost": sorted(lost), "survivors": survivors}


def _model_tasks(plan: RoundPlan, writers: list[int]) -> list[list[int]]:
    """The materialize tasks as the plan's docstring states them: the rewritten units in src order, a task closed
    once it holds ``target`` input rows (the last takes the rest), where ``target`` is the plan's
    materialize_rows unless the units are fewer than 4 tasks' worth: then a quarter of them, at least
    materialize_min_rows, at most materialize_rows."""
    total = sum(plan.sources[src].rows for src in writers)
    target = plan.materialize_rows
    if total < 4 * target:
        target = min(target, max(plan.materialize_min_rows, -(-total // 4)))
    tasks: list[list[int]] = []
    open_task: list[int] = []
    held = 0
    for i, src in enumerate(writers):
        open_task.append(src)
        held += plan.sources[src].rows
        if held >= max(1, target) and i < len(writers) - 1:
            tasks.append(open_task)
            open_task, held = [], 0
    if open_task:
        tasks.append(open_task)
    return tasks


def _model(plan: RoundPlan, lost: list[int], survivors: dict[int, list[tuple[int, int]]]) -> tuple[dict, dict, list]:
    """(carried file number per prior file, (src, row) -> (file, row) of every materialized row, task row counts)."""
    lost_set = set(lost)
    prior = [s for s in plan.sources if s.prior]
    kept = {s.src: [r for r in range(s.rows) if int(rank_of(s.src, r)) not in lost_set] for s in prior}
    carried: dict[int, int] = {}
    for number, rows in enumerate(plan.prior_file_rows, 1):
        units = [s for s in prior if s.file_number == number]
        if rows > 0 and all(len(kept[s.src]) == s.rows for s in units):
            carried[number] = len(carried) + 1
    where: dict[tuple[int, int], tuple[int, int]] = {}
    task_rows = []
    next_file = len(carried) + 1
    writers = [s.src for s in plan.sources if not s.is_delete and not (s.prior and s.file_number in carried)]
    for group in _model_tasks(plan, writers):
        order: list[tuple[int, int]] = []
        for src in group:
            s = plan.sources[src]
            if s.prior:
                order += [(src, r) for r in kept[src]]
            else:
                order += [(src, r) for r, b in sorted(survivors.get(src, []), key=lambda rb: (rb[1], rb[0]))]
        for offset, item in enumerate(order):
            where[item] = (next_file + offset // plan.spec.rows_per_file, offset % plan.spec.rows_per_file)
        task_rows.append(len(order))
        next_file += -(-len(order) // plan.spec.rows_per_file)
    return carried, where, task_rows


@pytest.mark.parametrize("form", ["compiled", "interpreted"])  # Numba's machine code, the kernels' Python source
@settings(max_examples=300, deadline=None)
@given(case=rounds())
def test_layout_and_pointers_match_the_explicit_model(case: dict[str, Any], form: str) -> None:
    plan, lost, survivors = case["plan"], case["lost"], case["survivors"]
    counts = np.zeros((plan.bucket_count, len(plan.sources)), dtype=np.int64)
    for src, rows in survivors.items():
        for _, b in rows:
            counts[b, src] += 1
    with kernel_form(form):
        layout = compute_layout(plan, counts, np.array(lost, dtype=np.int64))
    carried, where, task_rows = _model(plan, lost, survivors)

    assert {s.file_number: int(layout.carried_file_number[s.src]) for s in plan.sources if s.prior and layout.carried_file_number[s.src]} == carried
    assert layout.task_rows.tolist() == task_rows
    for bucket in range(plan.bucket_count):
        mine = sorted((src, r) for src, rows in survivors.items() for r, b in rows if b == bucket)
        ranks = np.array([int(rank_of(src, r)) for src, r in mine], dtype=np.int64)
        with kernel_form(form):
            files, rows = index_pointers(layout, bucket, ranks)
        assert list(zip(files.tolist(), rows.tolist())) == [where[item] for item in mine]
    # every materialized row has its own slot, files are numbered contiguously after the carried ones
    slots = list(where.values())
    assert len(set(slots)) == len(slots)
    numbers = sorted({f for f, _ in slots})
    assert numbers == list(range(len(carried) + 1, len(carried) + 1 + len(numbers)))
    assert all(r < plan.spec.rows_per_file for _, r in slots)
