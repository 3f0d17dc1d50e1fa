"""Units of a prior compacted file: split from the row group size its manifest records (no footer read) exactly as
from the file's own footer, and `verify` catches a recorded size the footer does not bear out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.catalog.storage import LocalStorage
from flash_pipeline.compactor.model.plans import SourceFile
from flash_pipeline.compactor.steps.source_io import read_units, split_units
from flash_pipeline.errors import FlashError
from flash_pipeline.file_facts import FileFacts, row_group_findings


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 700), row_group_rows=st.integers(1, 200), unit_rows=st.integers(1, 500))
def test_units_from_the_recorded_row_groups_equal_the_footers(tmp_path_factory, rows: int, row_group_rows: int, unit_rows: int) -> None:
    root = tmp_path_factory.mktemp("units")
    pq.write_table(pa.table({"k": np.arange(rows)}), root / "f.parquet", row_group_size=row_group_rows)
    storage = LocalStorage(str(root))
    size = (root / "f.parquet").stat().st_size
    from_footer = split_units(storage, DataFile(1, "f.parquet", rows, size, ContentType.PARQUET), unit_rows)
    recorded = DataFile(1, "missing.parquet", rows, size, ContentType.PARQUET, row_group_rows=row_group_rows)
    from_manifest = split_units(storage, recorded, unit_rows)  # a key that does not exist: nothing is opened
    without_bytes = [(g, r, s, gr, sk) for g, r, _, s, gr, sk in from_manifest]
    assert without_bytes == [(g, r, s, gr, sk) for g, r, _, s, gr, sk in from_footer]
    assert sum(u[2] for u in from_manifest) <= size
    # every row once, in order; no unit above unit_rows unless the file is one unit; parts tile their row group
    starts = [s for _, _, s, _, _ in without_bytes]
    assert starts == [sum(u[1] for u in without_bytes[:i]) for i in range(len(without_bytes))]
    assert sum(r for _, r, _, _, _ in without_bytes) == rows
    assert len(without_bytes) == 1 or all(r <= unit_rows for _, r, _, _, _ in without_bytes), without_bytes
    for i, (groups, r, start, group_rows, skip) in enumerate(without_bytes):
        if group_rows:
            assert len(groups) == 1 and group_rows > unit_rows and skip + r <= group_rows
            assert min(row_group_rows, rows - groups[0] * row_group_rows) == group_rows
            assert start == groups[0] * row_group_rows + skip


def test_verify_reports_a_recorded_row_group_size_the_footer_contradicts() -> None:
    f = DataFile(3, "data/000003.parquet", 500, 1000, ContentType.PARQUET, row_group_rows=200)
    assert row_group_findings(f, FileFacts(1000, rows=500, row_groups=(200, 200, 100))) == []
    assert row_group_findings(dataclasses.replace(f, row_group_rows=0), FileFacts(1000, rows=500, row_groups=(250, 250))) == []
    found = row_group_findings(f, FileFacts(1000, rows=500, row_groups=(250, 250)))
    assert len(found) == 1 and "200 rows each" in found[0]


def test_manifest_round_trip_keeps_the_row_group_size() -> None:
    f = DataFile(2, "k.parquet", 10, 99, ContentType.PARQUET, "sha256:00", None, 4)
    assert DataFile.from_json(f.to_json()) == f
    old = {k: v for k, v in f.to_json().items() if k != "row_group_rows"}  # a manifest written before the field
    assert DataFile.from_json(old).row_group_rows == 0


def _sources(storage: LocalStorage, key: str, rows: int, size: int, unit_rows: int) -> list[SourceFile]:
    units = split_units(storage, DataFile(1, key, rows, size, ContentType.PARQUET), unit_rows)
    return [SourceFile(i, key, ContentType.PARQUET, r, b, 1, 1, False, False, g, s, gr, sk) for i, (g, r, b, s, gr, sk) in enumerate(units)]


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(2, 3000), unit_rows=st.integers(1, 1000), picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=12))
def test_parts_of_a_row_group_read_back_as_their_rows_in_any_order(tmp_path_factory, rows: int, unit_rows: int, picks: list[int]) -> None:
    """One streaming reader serves parts read in order, skipped ahead, or read again (it reopens)."""
    root = tmp_path_factory.mktemp("parts")
    table = pa.table({"k": np.arange(rows), "s": [f"v{i % 7}" for i in range(rows)]})
    pq.write_table(table, root / "f.parquet", row_group_size=rows)
    storage = LocalStorage(str(root))
    sources = _sources(storage, "f.parquet", rows, (root / "f.parquet").stat().st_size, unit_rows)
    assert rows <= unit_rows or len(sources) > 1 and all(s.group_rows == rows for s in sources)
    wanted = [sources[p % len(sources)] for p in picks]
    for threads in (True, False):  # decoded on Arrow's pool, or on the task's own thread (RoundPlan.decodes_on_threads)
        for source, got in zip(wanted, read_units(storage, wanted, lambda s: ["k", "s"], table.schema, threads=threads)):
            assert got.equals(table.slice(source.row_start, source.rows)), (threads, source, got.num_rows)


def test_a_step_decodes_on_arrows_pool_only_with_fewer_tasks_than_cpus_or_from_an_object_store(tmp_path) -> None:
    """The planner records the session's CPUs in the plan; a local lake's units are decoded on the task's thread
    once a step has a task per CPU, an object store's always on Arrow's pool (its column chunks are GETs)."""
    from flash_pipeline import Catalog
    from flash_pipeline.compactor.model.options import CompactOptions
    from flash_pipeline.compactor.model.plans import SessionSizing
    from flash_pipeline.compactor.planning.rounds import build_round_plan
    from flash_pipeline.compactor.planning.sessions import PlannedSession, plan_session
    from flash_pipeline.compactor.steps.source_io import _on_threads

    cat = Catalog(tmp_path / "lake")
    cat.append("M.T", (), "upsert", [pa.table({"k": np.arange(100)})])
    session = plan_session(cat, "M.T", CompactOptions(primary_keys=("k",)), (), lambda m: None)
    assert isinstance(session, PlannedSession)
    sizing = SessionSizing(1, 1 << 40, (tuple(session.deltas),), session.base_version)
    plan = build_round_plan(cat, session.spec, sizing, session.prior, sizing.rounds, session.base_version + 1, 3)
    assert plan.cpus == 3
    assert [plan.decodes_on_threads(t) for t in (1, 2, 3, 4)] == [True, True, False, False]
    local = LocalStorage(str(tmp_path))
    assert not _on_threads(local, False) and _on_threads(local, True)
    local.read_ahead = 8  # what S3Storage says: per-file latency to overlap
    assert _on_threads(local, False)


def test_a_part_of_a_replaced_file_stops_the_read_naming_it(tmp_path) -> None:
    pq.write_table(pa.table({"k": np.arange(1000)}), tmp_path / "f.parquet", row_group_size=1000)
    storage = LocalStorage(str(tmp_path))
    sources = _sources(storage, "f.parquet", 1000, (tmp_path / "f.parquet").stat().st_size, 300)
    pq.write_table(pa.table({"k": np.arange(900)}), tmp_path / "f.parquet", row_group_size=1000)  # replaced behind the plan
    with pytest.raises(FlashError, match=r"f\.parquet: row groups \[0\] hold 900 rows .* says 1000"):
        list(read_units(storage, sources, lambda s: ["k"], pa.schema([("k", pa.int64())])))
