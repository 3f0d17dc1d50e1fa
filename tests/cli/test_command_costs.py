"""What a fresh ``flash-compactor compact`` process does not pay for: modules its work does not need (numpy.ma,
imported by ``pa.array`` of a NumPy array; deltalake, for a schema its base version already published) and
returning freed memory right before it exits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog, compact
from flash_pipeline.compactor.runtime import memory

PROBE = """
import json, sys
from flash_pipeline.cli import main
code = main(["compact", "--catalog", sys.argv[1], "--table", "T", "--executor", "in-process"], exits_after=True)
print(json.dumps({"code": code, "numpy.ma": "numpy.ma" in sys.modules, "deltalake": "deltalake" in sys.modules}))
"""


def test_a_fresh_compaction_over_a_published_version_imports_neither_numpy_ma_nor_deltalake(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    rng = np.random.default_rng(3)
    keys = rng.permutation(2000)
    cat.append("T", {}, "upsert", [pa.table({"k": keys, "v": keys * 2})])
    compact("T", ["k"], catalog=cat, progress=lambda _: None)
    cat.append("T", {}, "upsert", [pa.table({"k": keys[-40:], "v": keys[-40:] * 2})])
    compact("T", catalog=cat, progress=lambda _: None)  # the version whose files first carry deletion vectors
    updated = keys[:40]
    cat.append("T", {}, "upsert", [pa.table({"k": updated, "v": updated * 0 - 1})])
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "lake")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"code": 0, "numpy.ma": False, "deltalake": False}
    latest = cat.latest_compacted("T", ())
    assert latest is not None and latest.version == 3 and latest.delta_log and cat.deltalake_committed(latest)
    import deltalake

    table = deltalake.DeltaTable(cat.deltalake_location("T", ()))
    got = pa.table(deltalake.QueryBuilder().register("t", table).execute("select k, v from t").read_all())
    values = dict(zip(got.column("k").to_pylist(), got.column("v").to_pylist()))
    assert len(values) == 2000 and all(values[k] == (-1 if k in set(updated.tolist()) else 2 * k) for k in values)


def test_the_freed_memory_goes_back_after_a_job_unless_the_process_exits_right_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(memory, "release_freed_memory", lambda: calls.append(1))
    memory.release_at_job_end()
    assert calls == [1]
    with memory.process_exits_after_job():
        memory.release_at_job_end()
    assert calls == [1]
    memory.release_at_job_end()  # the context ended: a process that lives on returns them again
    assert calls == [1, 1]
