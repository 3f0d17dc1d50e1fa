"""What a local lake fsyncs: its commit points always; the bulk files of a version (compacted data, primary key
index, round state) only with FLASH_FSYNC=1 (catalog/storage.py fsync_every_file). A version committed either
way reads back the same."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from compaction_helpers import DeltaLog, assert_compact_command_refused, fresh_lake, read_compacted, rows_of, run_compact
from flash_pipeline.catalog import storage as storage_mod

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])


def _compact_recording_fsyncs(monkeypatch: pytest.MonkeyPatch, fsync_all: bool) -> tuple[list[str], list[tuple]]:
    synced: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(storage_mod.os, "fsync", recording)
    if fsync_all:
        monkeypatch.setenv("FLASH_FSYNC", "1")
    else:
        monkeypatch.delenv("FLASH_FSYNC", raising=False)
    with fresh_lake() as cat:
        log = DeltaLog(cat, "T", {"p": "a"}, SCHEMA)
        rng = np.random.default_rng(7)
        for i in range(3):
            k = rng.integers(0, 500, 400)
            log.append("upsert", [pa.table({"k": k, "ts": rng.integers(0, 9, 400), "v": [f"r{i}-{j}" for j in range(400)]}, schema=SCHEMA)])
        synced.clear()  # appends are not what this test is about
        run_compact(cat, "T", ["k"], [("ts", "ascending")], executor="in-process", hash_bucket_count=2, max_round_bytes=20_000)
        (part,) = cat.partitions("T")
        latest = cat.latest_compacted("T", part)
        assert latest is not None and latest.index is not None
        bulk = [str(Path(cat.storage.arrow_source(f.key)).resolve()) for f in latest.files]
        bulk += [str(Path(cat.storage.arrow_source(ix.key)).resolve()) for files in latest.index.buckets for ix in files]
        got = rows_of(read_compacted(cat, "T", part), SCHEMA.names)
    # files are fsynced as their temporary name, then renamed: match on the folder and the count
    return [s for s in synced], [(bulk, got)]


def test_commit_points_are_fsynced_and_bulk_files_only_with_flash_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    default_synced, [(bulk, rows_default)] = _compact_recording_fsyncs(monkeypatch, fsync_all=False)
    bulk_dirs = {str(Path(b).parent) for b in bulk}
    assert default_synced, "the commit (manifests, round completion) must be fsynced"
    assert not [s for s in default_synced if str(Path(s).parent) in bulk_dirs], "a data or index file was fsynced by default"
    monkeypatch.undo()

    all_synced, [(bulk, rows_all)] = _compact_recording_fsyncs(monkeypatch, fsync_all=True)
    bulk_dirs = {str(Path(b).parent) for b in bulk}
    in_bulk_dirs = [s for s in all_synced if str(Path(s).parent) in bulk_dirs]
    assert len(in_bulk_dirs) >= len(bulk), (len(in_bulk_dirs), len(bulk))  # every data and index file
    assert len(all_synced) > len(default_synced)
    assert rows_all == rows_default


def test_a_bad_flash_fsync_is_refused_in_one_line_before_anything_is_written(tmp_path: Path) -> None:
    """Through the CLI: exit non-zero, one line naming the variable and what to set, the lake as it was."""
    assert_compact_command_refused(tmp_path, {"FLASH_FSYNC": "sometimes"}, "FLASH_FSYNC must be 1 or 0")


@pytest.mark.parametrize("value", ["x", "-1", "2.5"])
def test_a_bad_flash_max_replans_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path, value: str) -> None:
    """It was int() of the raw value: exit 1 with 'unexpected ValueError'."""
    assert_compact_command_refused(tmp_path, {"FLASH_MAX_REPLANS": value}, "FLASH_MAX_REPLANS must be a whole number")
