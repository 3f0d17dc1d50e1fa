"""Kill-and-resume: a session SIGKILLed anywhere resumes with identical output, skipping the rounds it finished.

Each compaction runs as a separate driver process connected to the test's Ray cluster; a crash point
(flash_pipeline/compactor/faults.py) kills the driver mid hash bucket, mid dedupe, mid materialize or between
rounds, or kills a Ray worker inside a task. The resumed run must equal an uninterrupted run file for file,
and no file of the dead attempt may remain.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog
from flash_pipeline.compactor.runtime.cluster import ensure_ray
from flash_pipeline.catalog.commits import attempt_roots, referenced_attempts

TESTS = Path(__file__).resolve().parents[1]  # tests/, where the driver scripts live
BUDGET = 150_000  # bytes of estimated round memory: the 6 deltas below need 3 rounds


def _build_lake(path: Path) -> Catalog:
    rng = np.random.default_rng(7)
    cat = Catalog(path)
    regions = np.array(["n", "s", "e"])
    for d in range(6):
        if d == 4:
            keys = rng.integers(0, 1500, 150)
            cat.append("R.T", (), "delete", [pa.table({"k": keys, "region": regions[keys % 3]})])
            continue
        keys = rng.integers(0, 1500, 900)
        cat.append(
            "R.T",
            (),
            "upsert",
            [
                pa.table({"k": keys[:450], "region": regions[keys[:450] % 3], "ts": rng.integers(0, 50, 450), "v": rng.random(450)}),
                pa.table({"k": keys[450:], "region": regions[keys[450:] % 3], "ts": rng.integers(0, 50, 450), "v": rng.random(450)}),
            ],
        )
    return cat


def _run(lake: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    import ray

    env = dict(os.environ, **env_extra)
    address = ray.get_runtime_context().gcs_address
    return subprocess.run(
        [sys.executable, str(TESTS / "_resume_driver.py"), str(lake), address, str(BUDGET)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _snapshot(cat: Catalog) -> list[tuple[int, int, list[dict]]]:
    v = cat.latest_compacted("R.T", ())
    assert v is not None
    return [(f.file_number, f.rows, cat.read_file(f).to_pylist()) for f in v.files]


def _assert_no_orphans(cat: Catalog) -> None:
    roots = attempt_roots(cat, "R.T", ())
    versions = [cat.compacted_version("R.T", (), n) for n in cat.compacted_versions("R.T", ())]
    keep = referenced_attempts(versions, roots)
    present = {f"{kind}/{a}" for kind, root in roots.items() for a in cat.storage.list_children(root)}
    present.discard("data/_delta_log")  # the Delta table's log (catalog/deltalake_table.py), not an attempt
    assert present <= keep, f"files of dead attempts remain: {sorted(present - keep)}"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ensure_ray(num_cpus=2)
    path = tmp_path_factory.mktemp("pristine") / "lake"
    _build_lake(path)
    return path


@pytest.fixture(scope="module")
def reference(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    lake = tmp_path_factory.mktemp("reference") / "lake"
    shutil.copytree(pristine, lake)
    done = _run(lake, {})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "round 3/3" in done.stdout, "the budget must split the session into 3 rounds"
    return _snapshot(Catalog(lake))


@pytest.mark.parametrize("point", ["driver:hash_bucket", "driver:dedupe", "driver:materialize", "driver:before_commit", "driver:after_commit", "driver:between_rounds"])
def test_driver_killed_then_resumed_gives_identical_output(point: str, pristine: Path, reference: list, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    shutil.copytree(pristine, lake)
    crashed = _run(lake, {"FLASH_CRASH_AT": point})
    assert crashed.returncode == -signal.SIGKILL, f"{point}: expected SIGKILL, got {crashed.returncode}: {crashed.stderr[-1500:]}"
    cat = Catalog(lake)
    committed_before = cat.compacted_versions("R.T", ())
    progress_files = [k for k in cat.listing() if "/rounds/" in k and "-round-" in k]
    if point == "driver:after_commit":
        assert committed_before == [1], "the session's one commit must be in before the crash"
    else:
        assert committed_before == [], f"{point}: a session commits once, after its last round"
    if point == "driver:between_rounds":
        assert len(progress_files) == 1 and progress_files[0].endswith("-round-0001.json"), progress_files
        assert any("/compacted/state/" in k for k in cat.listing()), "round 1's dedupe state must be saved"
    if point == "driver:before_commit":
        assert any("/compacted/data/" in k for k in cat.listing()), "files written, nothing committed"
    resumed = _run(lake, {})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    if point == "driver:between_rounds":
        # the resumed session reads round 1's completion file and runs rounds 2 and 3 only
        assert "resuming after round 1/3" in resumed.stdout, resumed.stdout
        assert "]: round 1/3" not in resumed.stdout and "]: round 2/3" in resumed.stdout, resumed.stdout
    assert _snapshot(cat) == reference
    _assert_no_orphans(cat)
    leftovers = [k for k in cat.listing() if "/compacted/state/" in k or ("/rounds/" in k and "-round-" in k)]
    assert not leftovers, f"round state left after the commit: {leftovers}"


def test_a_session_killed_between_rounds_twice_resumes_from_both_attempts(pristine: Path, reference: list, tmp_path: Path) -> None:
    """Killed after round 1, resumed and killed after round 2: round 1's summary lives in the first attempt's
    state, round 2's in the second's. The last round replays both, so the third run must find both."""
    lake = tmp_path / "lake"
    shutil.copytree(pristine, lake)
    first = _run(lake, {"FLASH_CRASH_AT": "driver:between_rounds"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-1500:]
    second = _run(lake, {"FLASH_CRASH_AT": "driver:between_rounds"})
    assert second.returncode == -signal.SIGKILL, second.stderr[-1500:]
    assert "resuming after round 1/3" in second.stdout, second.stdout
    cat = Catalog(lake)
    attempts = {k.split("/compacted/state/")[1].split("/")[0] for k in cat.listing() if "/compacted/state/" in k}
    assert len(attempts) == 2, attempts  # each attempt saved the round it ran
    third = _run(lake, {})
    assert third.returncode == 0, third.stderr[-2000:]
    assert "resuming after round 2/3" in third.stdout and "]: round 3/3" in third.stdout, third.stdout
    assert "]: round 1/3" not in third.stdout and "]: round 2/3" not in third.stdout, third.stdout
    assert _snapshot(cat) == reference
    _assert_no_orphans(cat)
    assert not [k for k in cat.listing() if "/compacted/state/" in k or ("/rounds/" in k and "-round-" in k)]


def test_worker_killed_inside_materialize_is_retried(pristine: Path, reference: list, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    shutil.copytree(pristine, lake)
    marker = tmp_path / "crashed-once"
    done = _run(lake, {"FLASH_CRASH_AT": "worker:materialize", "FLASH_CRASH_MARKER": str(marker)})
    assert marker.exists(), "the crash point was never reached"
    assert done.returncode == 0, done.stderr[-2000:]
    assert _snapshot(Catalog(lake)) == reference
    _assert_no_orphans(Catalog(lake))
