"""The latency model keeps one set of coefficients per executor (planning/latency.py): rounds in this process
calibrate the in-process set and predict from it, Ray rounds Ray's, and a calibration file from before the
split is Ray's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog
from flash_pipeline.compactor.planning import latency
from tests.compaction_helpers import run_compact

W = latency.Workload(delta_rows=2_000_000, indexed_rows=0, rewrite_bytes=400 << 20, rounds=1, cpus=2, buckets=2,
                     hash_tasks=2, materialize_tasks=2)


@pytest.fixture
def calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("FLASH_CALIBRATION_PATH", str(path))
    return path


def _measured(c: latency.Coefficients, factor: float) -> dict[str, float]:
    """Step seconds of a machine ``factor`` times as slow as ``c`` says."""
    steps = {k: factor * v for k, v in latency.step_seconds(c, W).items() if k != "overhead"}
    return {**steps, "total": sum(steps.values()) + factor * c.round_overhead_s}


def test_each_executor_learns_and_predicts_from_its_own_coefficients(calibration: Path) -> None:
    ray_default = latency.predict(W, executor=latency.RAY)
    local_default = latency.predict(W, executor=latency.IN_PROCESS)
    assert ray_default != local_default  # Ray rounds pay for scheduling and moving objects
    for _ in range(6):
        latency.observe(W, _measured(latency.DEFAULTS[latency.IN_PROCESS], 3.0), latency.IN_PROCESS)
    assert latency.predict(W, executor=latency.IN_PROCESS) > 2.5 * local_default
    assert latency.load(latency.RAY) == latency.DEFAULTS[latency.RAY]  # untouched by in-process rounds
    assert latency.predict(W, executor=latency.RAY) == ray_default
    learned = latency.load(latency.IN_PROCESS)
    latency.observe(W, _measured(latency.DEFAULTS[latency.RAY], 0.5), latency.RAY)
    assert latency.load(latency.IN_PROCESS) == learned  # and Ray's observation leaves the in-process set alone
    assert latency.predict(W, executor=latency.RAY) < 0.6 * ray_default
    assert set(json.loads(calibration.read_text())) == {latency.RAY, latency.IN_PROCESS}


def test_a_calibration_file_from_before_the_split_is_rays(calibration: Path) -> None:
    old = {**asdict(latency.DEFAULTS[latency.RAY]), "hash_s_per_row": 7e-6, "runs": 4}
    calibration.write_text(json.dumps(old))  # one flat set, learned from Ray rounds only
    assert latency.load(latency.RAY).hash_s_per_row == 7e-6 and latency.load(latency.RAY).runs == 4
    assert latency.load(latency.IN_PROCESS) == latency.DEFAULTS[latency.IN_PROCESS]
    latency.observe(W, _measured(latency.DEFAULTS[latency.IN_PROCESS], 1.0), latency.IN_PROCESS)
    assert latency.load(latency.RAY).hash_s_per_row == 7e-6  # kept, now under its executor's name
    assert json.loads(calibration.read_text())[latency.RAY]["runs"] == 4


@pytest.mark.parametrize("text", ["[1, 2]", "not json", '{"ray": 3, "in_process": {"runs": "x"}}'])
def test_an_unreadable_calibration_file_means_the_defaults(calibration: Path, text: str) -> None:
    calibration.write_text(text)
    for executor in latency.EXECUTORS:
        assert latency.load(executor).hash_s_per_row == latency.DEFAULTS[executor].hash_s_per_row


def _lake(root: Path) -> Catalog:
    """The same two deltas in every lake (250,000 rows, a fifth of them updated): the same workload."""
    rng = np.random.default_rng(5)
    n = 250_000
    cat = Catalog(root)
    cat.append("L.E", (), "upsert", [pa.table({"k": np.arange(n), "ts": rng.integers(0, 9, n)})])
    keys = rng.choice(n, n // 5, replace=False)
    cat.append("L.E", (), "upsert", [pa.table({"k": keys, "ts": rng.integers(9, 19, len(keys))})])
    return cat


def _session(cat: Catalog, executor: str) -> tuple[float, float]:
    """(expected, actual total) seconds of one compaction."""
    part = run_compact(cat, "L.E", ["k"], [("ts", "ascending")], executor=executor).partitions[0]
    assert part.expected_seconds is not None
    return part.expected_seconds, part.seconds["total"]


def _check_learned(cat: Catalog, executor: str, model: str, calibration: Path, first_total: float,
                   monkeypatch: pytest.MonkeyPatch) -> float:
    """After one session, only ``model``'s set is stored, learned from it, and the same workload is predicted
    from that set, which never predicts less than the session took. Returns the prediction."""
    stored = json.loads(calibration.read_text())
    assert set(stored) == {model} and stored[model]["runs"] == 1
    used: list[str] = []
    predict = latency.predict

    def spy(w: latency.Workload, c: latency.Coefficients | None = None, executor: str = latency.RAY) -> float:
        used.append(executor)
        return predict(w, c, executor)

    monkeypatch.setattr(latency, "predict", spy)
    expected, _ = _session(cat, executor)
    assert used == [model]
    assert expected >= latency.BUFFER * first_total - 0.002
    return expected


def test_an_in_process_compaction_calibrates_the_in_process_model(tmp_path: Path, calibration: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from flash_pipeline.compactor.kernels import jit

    jit.load()  # both sessions run the compiled kernels: neither loads Numba (the load is its own term, below)
    _, first_total = _session(_lake(tmp_path / "a"), "in-process")
    assert latency.load(latency.IN_PROCESS).hash_s_per_row != latency.DEFAULTS[latency.IN_PROCESS].hash_s_per_row
    expected = _check_learned(_lake(tmp_path / "b"), "in-process", latency.IN_PROCESS, calibration, first_total,
                              monkeypatch)
    # its steps each outlast their share of the 0.05 s round overhead, so the learned set reproduces the session:
    # the overhead is what it took beyond its steps (at least 0.05 s)
    assert expected <= latency.BUFFER * (first_total + 0.05) + 0.002


def test_a_compaction_on_ray_calibrates_rays_model(tmp_path: Path, calibration: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASH_CALIBRATION_PATH", str(tmp_path / "warm-up.json"))  # Ray's workers started first:
    warm = Catalog(tmp_path / "warm")  # a cold first task's start-up is no round's overhead
    warm.append("L.E", (), "upsert", [pa.table({"k": np.arange(10), "ts": np.arange(10)})])
    _session(warm, "ray")
    monkeypatch.setenv("FLASH_CALIBRATION_PATH", str(calibration))
    _, first_total = _session(_lake(tmp_path / "a"), "ray")
    _check_learned(_lake(tmp_path / "b"), "ray", latency.RAY, calibration, first_total, monkeypatch)


def test_the_kernel_load_is_charged_and_learned_once_a_process(calibration: Path) -> None:
    loading = latency.Workload(**{**asdict(W), "loads_kernels": True})
    local = latency.DEFAULTS[latency.IN_PROCESS]
    gap = latency.predict(loading, executor=latency.IN_PROCESS) - latency.predict(W, executor=latency.IN_PROCESS)
    assert gap == pytest.approx(latency.BUFFER * local.kernel_load_s)
    measured = _measured(local, 1.0)
    measured["total"] += 1.5  # a session that waited 1.5 s for Numba on top of its usual time
    latency.observe(loading, measured, latency.IN_PROCESS)
    learned = latency.load(latency.IN_PROCESS)
    # (the steps' rates are learned net of their share of the round overhead, which the load then takes up)
    assert learned.kernel_load_s == pytest.approx(1.5, abs=local.round_overhead_s + 0.01)
    assert learned.round_overhead_s == local.round_overhead_s  # the load is not a round's overhead


def test_a_fresh_process_loads_numba_for_a_large_round_only() -> None:
    """jit.will_load, in a fresh process (Numba's load is per process): a large round's announced work would
    load it, a small one's not, and once loaded nothing loads it again."""
    code = """
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.numpy_forms import expected_round_ns
big, small = expected_round_ns(5_000_000, 0), expected_round_ns(1_000, 50_000)
print(jit.will_load(big), jit.will_load(small), end=" ")
jit.load()
print(jit.will_load(big))
"""
    env = {k: v for k, v in os.environ.items() if k != "FLASH_KERNELS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "False"]
    forced = subprocess.run([sys.executable, "-c", code], env={**env, "FLASH_KERNELS": "compiled"},
                            capture_output=True, text=True, check=True).stdout
    assert forced.split() == ["False", "False", "False"]  # a fixed form is no load the planner can foresee
