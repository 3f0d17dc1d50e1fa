"""The latency model counts the materialize tasks a round actually runs (planning/latency.materialize_tasks
against RoundPlan.materialize_tasks on random rounds): its materialize step is spread over that many CPUs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.files import ContentType
from flash_pipeline.compactor.model.plans import RoundPlan, SessionSpec, SourceFile
from flash_pipeline.compactor.planning import latency
from flash_pipeline.compactor.planning.rounds import COMPACTED_ROW_GROUP_ROWS, MIN_TASK_ROWS, materialize_target_rows
from flash_pipeline.compactor.steps.source_io import UNIT_ROWS


def _plan_tasks(prior_files: list[int], touched: list[bool], deltas: list[int]) -> tuple[int, int, int]:
    """(input rows, rewritten rows, materialize tasks of the plan) of a round over prior files of the given rows
    (split into units at their row groups, as compacted files are), of which ``touched`` ones lost rows, and
    delta files of the given rows."""
    sources: list[SourceFile] = []
    rewritten: list[bool] = []
    for number, (rows, hit) in enumerate(zip(prior_files, touched), 1):
        for start in range(0, rows, COMPACTED_ROW_GROUP_ROWS):
            unit = min(COMPACTED_ROW_GROUP_ROWS, rows - start)
            sources.append(SourceFile(len(sources), f"p{number}", ContentType.PARQUET, unit, 0, -1, number, False, True, (), start))
            rewritten.append(hit)
    input_rows = sum(prior_files) + sum(deltas)
    target = materialize_target_rows(input_rows)  # build_round_plan's, under a budget too large to cap it
    unit_rows = min(UNIT_ROWS, target)  # a large delta is read in units of its row groups (written that small)
    for position, rows in enumerate(deltas, 1):
        for start in range(0, rows, unit_rows):
            sources.append(SourceFile(len(sources), f"d{position}", ContentType.PARQUET, min(unit_rows, rows - start), 0, position, 1, False, False))
            rewritten.append(True)
    spec = SessionSpec("T", "T", (), 1, ("k",), (), 0, ("k",), "", 1 << 40, 10, ContentType.PARQUET, False)
    plan = RoundPlan("r", 2, spec, 1, tuple(sources), None, (), target, "data", "index", materialize_min_rows=MIN_TASK_ROWS,
                     prior_file_rows=tuple(prior_files))
    mask = np.array(rewritten, dtype=bool)
    return input_rows, [s.rows for s, hit in zip(sources, rewritten) if hit], len(plan.materialize_tasks(mask))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2_000_000), st.booleans()), max_size=30),
       st.lists(st.integers(1, 3_000_000), min_size=1, max_size=8))
def test_the_model_counts_the_tasks_the_plan_forms(prior: list[tuple[int, bool]], deltas: list[int]) -> None:
    input_rows, units, planned = _plan_tasks([r for r, _ in prior], [hit for _, hit in prior], deltas)
    assert latency.materialize_tasks(input_rows, units) == planned


def test_an_incremental_round_that_rewrites_one_file_counts_its_tasks_not_the_tables() -> None:
    """Scenario 3's shape: ten 500,000-row files, one of them hit, 50,000 new rows. The plan runs 2 tasks (the
    file's row groups, the new rows joining the second); the model counted one per million rows of the table (6)
    before it counted the rewritten units. From catalog statistics alone (estimate_workload) the touched rows
    are the uniform estimate, every file here: the table's tasks, as before."""
    input_rows, units, planned = _plan_tasks([500_000] * 10, [True] + [False] * 9, [50_000])
    assert planned == 2
    assert latency.materialize_tasks(input_rows, units) == planned
