"""Units of a prior compacted file: split from the row group size its manifest records (no footer read) exactly as
from the file's own footer, and `verify` catches a recorded size the footer does not bear out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.catalog.storage import LocalStorage
from flash_pipeline.compactor.steps.source_io import split_units
from flash_pipeline.verify import _Facts, _row_group_findings


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
    assert [(g, r, s) for g, r, _, s in from_manifest] == [(g, r, s) for g, r, _, s in from_footer]
    assert sum(b for _, _, b, _ in from_manifest) <= size


def test_verify_reports_a_recorded_row_group_size_the_footer_contradicts() -> None:
    f = DataFile(3, "data/000003.parquet", 500, 1000, ContentType.PARQUET, row_group_rows=200)
    assert _row_group_findings(f, _Facts(1000, rows=500, row_groups=(200, 200, 100))) == []
    assert _row_group_findings(dataclasses.replace(f, row_group_rows=0), _Facts(1000, rows=500, row_groups=(250, 250))) == []
    found = _row_group_findings(f, _Facts(1000, rows=500, row_groups=(250, 250)))
    assert len(found) == 1 and "200 rows each" in found[0]


def test_manifest_round_trip_keeps_the_row_group_size() -> None:
    f = DataFile(2, "k.parquet", 10, 99, ContentType.PARQUET, "sha256:00", None, 4)
    assert DataFile.from_json(f.to_json()) == f
    old = {k: v for k, v in f.to_json().items() if k != "row_group_rows"}  # a manifest written before the field
    assert DataFile.from_json(old).row_group_rows == 0
