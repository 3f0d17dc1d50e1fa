"""Compacted files in every output format (parquet, feather, orc, csv), incremental runs reading them back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog, ContentType
from tests.compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("ts", pa.int64()), ("x", pa.float64())])


def _delta(rng: np.random.Generator, n: int) -> pa.Table:
    keys = rng.integers(0, 300, n)
    return pa.table({"k": keys, "s": np.char.add("v", keys.astype(str)), "ts": rng.integers(0, 30, n), "x": rng.random(n)}, schema=SCHEMA)


@pytest.mark.parametrize("fmt", list(ContentType))
def test_each_output_format_compacts_and_recompacts(lake: Catalog, fmt: ContentType) -> None:
    rng = np.random.default_rng(hash(fmt.value) % 1000)
    log = DeltaLog(lake, "F.T", {"d": "1"}, SCHEMA)
    log.append("upsert", [_delta(rng, 400), _delta(rng, 100)])
    log.append("delete", [_delta(rng, 40).select(["k"])])
    run_compact(lake, "F.T", ["k"], [("ts", "ascending")], compacted_file_content_type=fmt, rows_per_compacted_file=90, hash_bucket_count=2)
    log.append("upsert", [_delta(rng, 60)])
    run_compact(lake, "F.T", None, None)  # reads the compacted files of this format back (rewritten or carried)
    latest = lake.latest_compacted("F.T", (("d", "1"),))
    assert latest is not None and {f.content_type for f in latest.files} == {fmt}
    assert all(f.key.endswith(fmt.extension) for f in latest.files)
    expected = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert rows_of(read_compacted(lake, "F.T", {"d": "1"}), SCHEMA.names) == rows_of(expected, SCHEMA.names)
    if fmt in (ContentType.PARQUET, ContentType.FEATHER):  # annotations ride in the schema metadata (ORC/CSV: manifest only)
        meta = lake.read_file(latest.files[0]).schema.metadata
        assert meta[b"flash.compacted_table_id"] == b"F.T" and meta[b"flash.operation_type"] == b"upsert"
