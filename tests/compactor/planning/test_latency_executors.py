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
from hypothesis import assume, given, settings
from hypothesis import strategies as st

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


def _measured(c: latency.Coefficients, factor: float, w: latency.Workload = W) -> dict[str, float]:
    """Step seconds of ``w`` on a machine ``factor`` times as slow as ``c`` says."""
    steps = {k: factor * v for k, v in latency.step_seconds(c, w).items() if k in latency.STEPS}
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


@pytest.fixture
def learn_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tables are too small for some steps' rates to be learned (MIN_UNITS_TO_LEARN): here they are."""
    monkeypatch.setattr(latency, "MIN_UNITS_TO_LEARN", dict.fromkeys(latency.STEPS, 0))


def _session(cat: Catalog, executor: str) -> tuple[float, float]:
    """(expected, actual total) seconds of one compaction."""
    part = run_compact(cat, "L.E", ["k"], [("ts", "ascending")], executor=executor).partitions[0]
    assert part.expected_seconds is not None
    return part.expected_seconds, part.seconds["total"]


def _check_learned(cat: Catalog, executor: str, model: str, calibration: Path, first_total: float,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    """After one session, only ``model``'s set is stored, learned from it, and the same workload is predicted
    from that set."""
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
    # one observation: each step's rate is its measured time, the rounds' overhead what the session took beyond
    # them (at least 0.01 s), so the learned set reproduces the session
    assert latency.BUFFER * first_total - 0.002 <= expected <= latency.BUFFER * (first_total + 0.01) + 0.002


def test_an_in_process_compaction_calibrates_the_in_process_model(tmp_path: Path, calibration: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  learn_every_step: None) -> None:
    from flash_pipeline.compactor.kernels import jit

    jit.load()  # both sessions run the compiled kernels: neither loads Numba (the load is its own term, below)
    _, first_total = _session(_lake(tmp_path / "a"), "in-process")
    assert latency.load(latency.IN_PROCESS).hash_s_per_row != latency.DEFAULTS[latency.IN_PROCESS].hash_s_per_row
    _check_learned(_lake(tmp_path / "b"), "in-process", latency.IN_PROCESS, calibration, first_total, monkeypatch)


def test_a_compaction_on_ray_calibrates_rays_model(tmp_path: Path, calibration: Path,
                                                 monkeypatch: pytest.MonkeyPatch, learn_every_step: None) -> None:
    monkeypatch.setenv("FLASH_CALIBRATION_PATH", str(tmp_path / "warm-up.json"))  # Ray's workers started first:
    warm = Catalog(tmp_path / "warm")  # a cold first task's start-up is no round's overhead
    warm.append("L.E", (), "upsert", [pa.table({"k": np.arange(10), "ts": np.arange(10)})])
    _session(warm, "ray")
    monkeypatch.setenv("FLASH_CALIBRATION_PATH", str(calibration))
    _, first_total = _session(_lake(tmp_path / "a"), "ray")
    _check_learned(_lake(tmp_path / "b"), "ray", latency.RAY, calibration, first_total, monkeypatch)


def test_the_kernel_load_is_charged_and_learned_once_a_process(calibration: Path) -> None:
    w = latency.Workload(**{**asdict(W), "delta_rows": 400_000, "rewrite_bytes": 40 << 20})
    loading = latency.Workload(**{**asdict(w), "loads_kernels": True})
    local = latency.DEFAULTS[latency.IN_PROCESS]
    gap = latency.predict(loading, executor=latency.IN_PROCESS) - latency.predict(w, executor=latency.IN_PROCESS)
    assert gap == pytest.approx(latency.BUFFER * local.kernel_load_s)
    measured = _measured(local, 2.0, w)  # steps twice as slow as the rates say: the load stalled them
    measured["total"] += 1.5  # and 1.5 s more beyond the steps
    latency.observe(loading, measured, latency.IN_PROCESS)
    learned = latency.load(latency.IN_PROCESS)
    steps = sum(v for k, v in latency.step_seconds(local, w).items() if k in latency.STEPS)
    assert learned.kernel_load_s == pytest.approx(steps + local.round_overhead_s + 1.5)  # all of it: the load's
    assert (learned.hash_s_per_row, learned.round_overhead_s) == (local.hash_s_per_row, local.round_overhead_s)


def test_uncompiled_kernels_are_charged_learned_apart_and_teach_no_rate(calibration: Path) -> None:
    small = latency.Workload(**{**asdict(W), "uncompiled_s": 0.8})
    local = latency.DEFAULTS[latency.IN_PROCESS]
    gap = latency.predict(small, executor=latency.IN_PROCESS) - latency.predict(W, executor=latency.IN_PROCESS)
    assert gap == pytest.approx(latency.BUFFER * 0.8)  # jit's own estimate, before any was seen
    measured = _measured(local, 1.0)
    measured["hash_bucket"] += 1.6  # the NumPy forms ran inside the steps, twice as long as jit's estimate
    measured["total"] += 1.6 + 0.2  # and the rounds took 0.2 s more than the model's overhead
    latency.observe(small, measured, latency.IN_PROCESS)
    learned = latency.load(latency.IN_PROCESS)
    assert learned.hash_s_per_row == local.hash_s_per_row
    assert learned.round_overhead_s == pytest.approx(local.round_overhead_s + 0.2)
    assert learned.uncompiled_scale == pytest.approx(2.0)
    gap = latency.predict(small, executor=latency.IN_PROCESS) - latency.predict(W, executor=latency.IN_PROCESS)
    assert gap == pytest.approx(latency.BUFFER * 1.6)


def test_a_fresh_process_loads_numba_for_a_large_round_only() -> None:
    """jit.will_load, in a fresh process (Numba's load is per process): a large round's announced work would
    load it, a small one's runs uncompiled, and once loaded nothing loads it again or runs uncompiled."""
    code = """
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.numpy_forms import expected_round_ns
big, small = expected_round_ns(5_000_000, 0), expected_round_ns(1_000, 50_000)
print(jit.will_load(big), jit.will_load(small), jit.runs_uncompiled(), end=" ")
jit.load()
print(jit.will_load(big), jit.runs_uncompiled())
"""
    env = {k: v for k, v in os.environ.items() if k != "FLASH_KERNELS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "True", "False", "False"]
    forced = subprocess.run([sys.executable, "-c", code], env={**env, "FLASH_KERNELS": "compiled"},
                            capture_output=True, text=True, check=True).stdout
    assert forced.split() == ["False"] * 5  # a fixed form: no load, nothing uncompiled the planner can foresee


@settings(max_examples=40, deadline=None)
@given(fixed=st.floats(0.0, 0.5), scale=st.floats(0.3, 3.0), outside=st.floats(0.01, 0.3),
       sizes=st.lists(st.integers(100_000, 4_000_000), min_size=4, max_size=12))
def test_each_steps_fixed_cost_and_rate_are_fitted_from_sessions_of_several_sizes(
        tmp_path_factory: pytest.TempPathFactory, fixed: float, scale: float, outside: float, sizes: list[int]) -> None:
    """A machine whose steps each take ``fixed`` seconds plus ``scale`` times the default rate: once sessions of
    different sizes were seen, a small and a large one are predicted as that machine runs them."""
    assume(max(sizes) >= 3 * min(sizes))
    before = os.environ.get("FLASH_CALIBRATION_PATH")  # (hypothesis: no function-scoped monkeypatch)
    os.environ["FLASH_CALIBRATION_PATH"] = str(tmp_path_factory.mktemp("fit") / "calibration.json")
    local = latency.DEFAULTS[latency.IN_PROCESS]

    def truth(rows: int) -> tuple[latency.Workload, dict[str, float]]:
        w = latency.Workload(**{**asdict(W), "delta_rows": rows, "rewrite_bytes": rows * 60})
        steps = {k: fixed + scale * (v - getattr(local, latency._FIXED[k]))
                 for k, v in latency.step_seconds(local, w).items() if k in latency.STEPS}
        return w, {**steps, "total": sum(steps.values()) + outside}

    try:
        for rows in sizes:
            latency.observe(*truth(rows), latency.IN_PROCESS)
        for rows in (min(sizes), max(sizes), 150_000, 5_000_000):
            w, measured = truth(rows)
            assert latency.predict(w, executor=latency.IN_PROCESS) == pytest.approx(
                latency.BUFFER * measured["total"], rel=0.01)
    finally:
        if before is None:
            os.environ.pop("FLASH_CALIBRATION_PATH", None)
        else:
            os.environ["FLASH_CALIBRATION_PATH"] = before


def test_tiny_sessions_teach_no_rate_however_many(calibration: Path) -> None:
    """The paper's 16-row example run again and again: its steps' times are fixed costs, not work per row."""
    tiny = latency.Workload(**{**asdict(W), "delta_rows": 16, "rewrite_bytes": 2_000})
    for rows in (16, 16, 24, 40, 16):
        w = latency.Workload(**{**asdict(tiny), "delta_rows": rows})
        latency.observe(w, {"hash_bucket": 0.01, "dedupe": 0.005, "materialize": 0.01, "total": 0.05},
                        latency.IN_PROCESS)
    learned, local = latency.load(latency.IN_PROCESS), latency.DEFAULTS[latency.IN_PROCESS]
    assert [getattr(learned, latency._RATE[k]) for k in latency.STEPS] == [getattr(local, latency._RATE[k])
                                                                           for k in latency.STEPS]
    assert latency.predict(W, executor=latency.IN_PROCESS) < 1.1 * latency.predict(W, c=local)
