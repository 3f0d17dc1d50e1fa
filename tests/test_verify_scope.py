"""``verify(..., unchanged_since=...)``: files unchanged since a version verified before are not read again, and
every file that did change is checked as a full verification checks it (flash_pipeline/verify_scope.py).

Real compactions (deletion vectors on and off, carried files renumbered) against a full verification of the
same version; damage to a changed file found either way; and the rules that decide an index file unchanged,
each broken on a copy of a real version's manifest."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flash_pipeline import Catalog, compact
from flash_pipeline.verify import verify
from flash_pipeline.verify_scope import index_files_to_read, unchanged_data_keys

T = "T.SCOPE"


def _rows(ids: list[int], ts: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array([ts] * len(ids), pa.int64()),
                     "v": [f"v{i}@{ts}" for i in ids]})


def _compact(cat: Catalog, vectors: bool):
    result = compact(T, ["id"], [("ts", "ascending")], catalog=cat, rows_per_compacted_file=40, hash_bucket_count=2,
                     rows_per_primary_key_index_file=25, executor="in-process", deletion_vectors=vectors)
    return cat.compacted_version(T, (), result.partitions[0].compacted_version)


def _lake(tmp_path, vectors: bool, updates: list[list[int]]):
    cat = Catalog(tmp_path / "lake")
    cat.append(T, (), "upsert", [_rows(list(range(300)), ts=0)])
    versions = [_compact(cat, vectors)]
    for ts, ids in enumerate(updates, start=1):
        cat.append(T, (), "upsert", [_rows(ids, ts)])
        versions.append(_compact(cat, vectors))
    return cat, versions


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updates=st.lists(st.lists(st.integers(0, 299), min_size=1, max_size=40), min_size=1, max_size=3),
       vectors=st.booleans())
def test_a_verification_since_the_last_version_agrees_with_a_full_one(tmp_path_factory, updates, vectors) -> None:
    cat, versions = _lake(tmp_path_factory.mktemp("scope"), vectors, updates)
    full = verify(cat, T, [()])
    since = verify(cat, T, [()], unchanged_since=versions[-2])
    assert full.ok and since.ok and full.unchanged == 0
    assert since.files + since.unchanged >= full.files and since.bytes <= full.bytes
    assert since.files <= full.files


def test_unchanged_files_are_not_read_and_a_changed_one_is_checked(tmp_path) -> None:
    cat, (v1, v2) = _lake(tmp_path, False, [list(range(100, 110))])
    full, since = verify(cat, T, [()]), verify(cat, T, [()], unchanged_since=v1)
    assert since.ok and since.unchanged > 0 and since.bytes < full.bytes / 2
    new = [f for f in v2.files if f.key not in unchanged_data_keys(v2, v1)]
    assert new
    path = cat.storage._path(new[0].key)  # a file this version wrote, damaged: found with or without the scope
    path.write_bytes(path.read_bytes()[:-10])
    for result in (verify(cat, T, [()]), verify(cat, T, [()], unchanged_since=v1)):
        assert not result.ok and any(new[0].key in p.key for p in result.problems)


@pytest.fixture
def versions(tmp_path):
    """Version 2 rewrote the files holding ids 100-109 and renumbered the files after them."""
    return _lake(tmp_path, False, [list(range(100, 110))])[1]


def _skipped(v, since) -> set[str]:
    return {f.key for f in index_files_to_read(v, since, unchanged_data_keys(v, since))[1]}


def test_index_files_of_unchanged_data_are_skipped_even_when_renumbered(versions) -> None:
    v1, v2 = versions
    skipped = _skipped(v2, v1)
    assert skipped
    old = {f.key: f for files in v1.index.buckets for f in files}
    assert any(f.key in skipped and f.file_shift != old[f.key].file_shift for files in v2.index.buckets for f in files)


def test_an_index_file_is_read_once_a_data_file_of_its_range_changed(versions) -> None:
    v1, v2 = versions
    skipped = _skipped(v2, v1)
    victim = next(f for files in v2.index.buckets for f in files if f.key in skipped)
    n = victim.first_file
    swapped = replace(v2, files=[replace(f, key=f.key + ".other") if f.file_number == n else f for f in v2.files])
    assert victim.key not in _skipped(swapped, v1)


def test_an_index_file_is_read_when_its_shift_disagrees_with_its_range_or_its_content_changed(versions) -> None:
    v1, v2 = versions
    skipped = _skipped(v2, v1)
    b, victim = next((b, f) for b, files in enumerate(v2.index.buckets) for f in files if f.key in skipped)
    for changed in (replace(victim, file_shift=victim.file_shift + 1), replace(victim, checksum="0" * 64),
                    replace(victim, dead_rows=victim.dead_rows + 1)):
        buckets = [list(files) for files in v2.index.buckets]
        buckets[b] = [changed if f.key == victim.key else f for f in buckets[b]]
        assert victim.key not in _skipped(replace(v2, index=replace(v2.index, buckets=buckets)), v1)


def test_an_unchanged_index_file_meeting_a_read_ones_range_is_read(versions) -> None:
    """Two index rows pointing at one row are only found among files read: a read file whose range spans every
    compacted file makes every other index file read too."""
    v1, v2 = versions
    read, _ = index_files_to_read(v2, v1, unchanged_data_keys(v2, v1))
    b, wide = read[0]
    buckets = [list(files) for files in v2.index.buckets]
    buckets[b] = [replace(f, first_file=1, last_file=max(x.file_number for x in v2.files)) if f.key == wide.key else f
                  for f in buckets[b]]
    assert not _skipped(replace(v2, index=replace(v2.index, buckets=buckets)), v1)


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_an_unchanged_file_deleted_or_replaced_since_the_proof_is_still_found(tmp_path, damage: str) -> None:
    """Unchanged files are not read, but each must still be stored with its recorded size (one stat each): the
    Dagster ``files_intact`` check once passed a version whose carried file had been moved away since its proof."""
    cat, (v1, v2) = _lake(tmp_path, False, [list(range(100, 110))])
    unchanged = unchanged_data_keys(v2, v1)
    carried = next(f for f in v2.files if f.key in unchanged)
    index_taken = _skipped(v2, v1)
    assert index_taken, "the scope must skip some index file for this test to hold"
    for key in (carried.key, sorted(index_taken)[0]):
        path = cat.storage._path(key)
        if damage == "deleted":
            path.unlink()
        else:
            path.write_bytes(path.read_bytes()[:-3])
    for result in (verify(cat, T, [()]), verify(cat, T, [()], unchanged_since=v1)):
        found = {p.key for p in result.problems}
        assert not result.ok and carried.key in found and sorted(index_taken)[0] in found, result.problems
