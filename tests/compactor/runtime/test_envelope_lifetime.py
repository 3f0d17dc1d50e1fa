"""An in-process round frees each step's envelopes as soon as no later step needs them (round.py): the hash
bucket tasks' own arrays once dedupe has joined a bucket's, and the joined arrays once the index writers that
read them end -- never held through materialize, which needs only the survivors' ranks -- and a first
compaction's index writer writes its rows over the joined envelopes instead of a second array. Checked with weak
references to the very arrays the steps hand on, on a real compaction whose result is checked too."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog
from flash_pipeline.compactor import round as round_module
from flash_pipeline.compactor.index import pk_index
from tests.compaction_helpers import read_compacted, run_compact


def _lake(tmp_path: Path, files: int) -> tuple[Catalog, dict[int, int]]:
    """A table of ``files`` upsert deltas and what it compacts to, by a plain model: the last delta that holds a
    key wins (its sort key is the delta's number), and within it the key's last row."""
    rng = np.random.default_rng(7)
    cat = Catalog(tmp_path / "lake")
    expected: dict[int, int] = {}
    for i in range(files):  # several delta files: with two CPUs, two hash bucket tasks
        keys = rng.integers(0, 3000, 4000)
        values = rng.integers(0, 10**9, 4000)
        cat.append("T", (), "upsert", [pa.table({"k": keys, "ts": np.full(4000, i), "v": values})])
        expected.update(zip(keys.tolist(), values.tolist()))
    return cat, expected


@pytest.mark.parametrize("cpus", [1, 2])
def test_envelopes_are_freed_once_no_later_step_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            cpus: int) -> None:
    cat, expected = _lake(tmp_path, 4)
    task_outputs: list[weakref.ref[np.ndarray]] = []
    joined: list[weakref.ref[np.ndarray]] = []
    # at each materialize task: (task arrays alive, of them, joined arrays alive, of them)
    seen: list[tuple[int, int, int, int]] = []
    index_tasks: list[int] = []
    in_place: list[bool] = []  # per index writer: were its rows written over its bucket's joined envelopes
    write_bucket = pk_index.write_bucket

    hash_task, join, write_index, materialize = (round_module._hash_bucket_task, round_module._joined,
                                                 round_module._write_index, round_module.materialize_task)

    def hash_task_spy(*args: Any) -> Any:
        envelopes, key_range = hash_task(*args)
        task_outputs.extend(weakref.ref(e) for e in envelopes)
        return envelopes, key_range

    def join_spy(*args: Any) -> list[np.ndarray]:
        out = join(*args)
        joined.extend(weakref.ref(e) for e in out)
        return out

    def write_index_spy(*args: Any) -> Any:
        out = write_index(*args)
        index_tasks.append(args[3])
        return out

    def write_bucket_spy(storage: Any, prefix: str, bucket: int, rows: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        in_place.append(any(r() is not None and np.shares_memory(rows, r()) for r in joined))
        return write_bucket(storage, prefix, bucket, rows, *args, **kwargs)

    def materialize_spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((sum(r() is not None for r in task_outputs), len(task_outputs),
                     sum(r() is not None for r in joined), len(joined)))
        return materialize(*args, **kwargs)

    monkeypatch.setattr(round_module, "_hash_bucket_task", hash_task_spy)
    monkeypatch.setattr(round_module, "_joined", join_spy)
    monkeypatch.setattr(round_module, "_write_index", write_index_spy)
    monkeypatch.setattr(round_module, "materialize_task", materialize_spy)
    monkeypatch.setattr(pk_index, "write_bucket", write_bucket_spy)
    result = run_compact(cat, "T", ["k"], [("ts", "ascending")], executor="in-process", num_cpus=cpus,
                         hash_bucket_count=3)

    assert result.partitions[0].rounds == 1 and len(index_tasks) == 3
    tasks = 2 if cpus == 2 else 1
    assert len(task_outputs) == 3 * tasks and len(joined) == 3 and seen
    assert in_place == [True] * 3  # a first compaction's index rows take the envelopes' memory, no second array
    if cpus == 2:  # two tasks' parts were joined: materialize never sees them
        assert all(alive == 0 for alive, _, _, _ in seen), seen
    else:  # one task: its arrays are the joined ones (no copy), and one thread ran every index writer first
        assert all(alive == 0 and joined_alive == 0 for alive, _, joined_alive, _ in seen), seen
    rows = read_compacted(cat, "T", ())
    assert dict(zip(rows.column("k").to_pylist(), rows.column("v").to_pylist())) == expected
    assert rows.num_rows == len(expected)

    # the index those rows became is what the next compaction probes: an update of known and new keys
    keys = np.arange(2500, 3500)
    values = np.arange(len(keys)) * 7
    cat.append("T", (), "upsert", [pa.table({"k": keys, "ts": np.full(len(keys), 9), "v": values})])
    expected.update(zip(keys.tolist(), values.tolist()))
    run_compact(cat, "T", ["k"], [("ts", "ascending")], executor="in-process", num_cpus=cpus)
    rows = read_compacted(cat, "T", ())
    assert rows.num_rows == len(expected)
    assert dict(zip(rows.column("k").to_pylist(), rows.column("v").to_pylist())) == expected
