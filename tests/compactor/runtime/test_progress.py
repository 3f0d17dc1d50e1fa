"""Progress inside a round (runtime/progress.py): every task of every step is counted, in this process and on
Ray; people get throttled lines (quick steps say nothing) or, on a terminal, tqdm bars (cli/progress_bars.py)."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from compaction_helpers import assert_compact_command_refused
from flash_pipeline import Catalog
from flash_pipeline.cli.progress_bars import StepBars, terminal_bars
from flash_pipeline.compactor.runtime import progress as progress_mod
from flash_pipeline.compactor.runtime.progress import StepReporter
from tests.compaction_helpers import run_compact

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("payload", pa.string())])
STEPS = ("hash bucket", "dedupe", "materialize")


def _lake(tmp_path, deltas: int = 6, rows: int = 4000) -> Catalog:
    rng = np.random.default_rng(3)
    cat = Catalog(tmp_path / "lake")
    for _ in range(deltas):
        keys = rng.integers(0, rows * 2, rows)
        cat.append("P.T", (), "upsert", [pa.table({"k": keys, "ts": rng.integers(0, 100, rows),
                                                   "payload": [f"p{i}" * 20 for i in range(rows)]}, schema=SCHEMA)])
    return cat


def _check_counts(events: list[dict[str, Any]], rounds: int, buckets: int) -> None:
    """Each (round, step) counts from 0 to its total without going back; every round hashes and dedupes,
    materialize runs once, after the last round, with one task per output group plus one index writer per bucket."""
    seen: dict[tuple[int, str], list[int]] = defaultdict(list)
    totals: dict[tuple[int, str], set[int]] = defaultdict(set)
    order: list[tuple[int, str]] = []
    for e in events:
        key = (e["round"], e["step"])
        if key not in seen:
            order.append(key)
        seen[key].append(e["done"])
        totals[key].add(e["total"])
        assert e["rounds"] == rounds
    expected_order = [(k, s) for k in range(1, rounds + 1) for s in ("hash bucket", "dedupe")] + [(rounds, "materialize")]
    assert order == expected_order
    for key, done in seen.items():
        (total,) = totals[key]
        assert done[0] == 0 and done[-1] == total and done == sorted(done), (key, done)
    for k in range(1, rounds + 1):
        assert totals[(k, "dedupe")] == {buckets}
    assert min(totals[(rounds, "materialize")]) > buckets


@pytest.mark.parametrize("executor", ["in-process", "ray"])
def test_every_task_of_every_step_is_counted(tmp_path, executor: str) -> None:
    cat = _lake(tmp_path)
    events: list[dict[str, Any]] = []
    result = run_compact(cat, "P.T", ["k"], [("ts", "ascending")], hash_bucket_count=3, max_round_bytes=1 << 20,
                         executor=executor, on_step=events.append)
    part = result.partitions[0]
    assert part.rounds >= 2  # several rounds, so that round numbers are checked too
    _check_counts(events, part.rounds, 3)
    assert all(e["partition"] == [] for e in events)


def test_lines_are_throttled_and_quick_steps_say_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock: a step over in less than the interval prints nothing; a long one prints at most once per
    interval and always its completion."""
    now = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: now[0])
    lines: list[str] = []
    tick = StepReporter("T [p]", (), 2, lines.append, interval=1.0)
    tick(1, "hash bucket", 0, 4)
    now[0] += 0.3
    tick(1, "hash bucket", 4, 4)
    assert lines == []  # quick
    tick(1, "dedupe", 0, 10)
    for done in range(1, 11):
        now[0] += 0.4
        tick(1, "dedupe", done, 10)
    # 4.0 s in steps of 0.4: a line at >= 1 s after the start, then one at least 1 s after each, and the end
    assert [line.split(": ", 2)[-1].split(" tasks")[0] for line in lines] == ["3/10", "6/10", "9/10", "10/10"]
    assert lines[-1] == "T [p]: round 1/2 dedupe: 10/10 tasks done (4.0s)"


def test_terminal_bars_draw_the_real_steps(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the CLI draws one tqdm bar per step from the engine's on_step dicts; off a terminal none."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert terminal_bars(io.StringIO()) == (None, None)
    monkeypatch.setenv("FLASH_PROGRESS_SECONDS", "0")
    stream = Terminal()
    on_step, bars = terminal_bars(stream)
    assert isinstance(bars, StepBars) and on_step is bars
    cat = _lake(tmp_path, deltas=2, rows=500)
    run_compact(cat, "P.T", ["k"], [("ts", "ascending")], hash_bucket_count=2, executor="in-process", on_step=on_step)
    bars.close()
    drawn = stream.getvalue()
    for step in STEPS:
        assert f"round 1/1 {step}" in drawn
    assert "task" in drawn and not bars.bars  # every bar closed when its step finished


@pytest.mark.parametrize("value", ["x", "-1"])
def test_a_bad_flash_progress_seconds_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    """It was silently ignored (the default used) where every other FLASH_* setting is refused."""
    assert_compact_command_refused(tmp_path, {"FLASH_PROGRESS_SECONDS": value}, "FLASH_PROGRESS_SECONDS must be a number of seconds")


@pytest.mark.parametrize("value", ["bogus", "0", "2.5"])
def test_a_bad_flash_ray_num_cpus_is_refused_in_one_line_before_ray_starts(tmp_path: Path, value: str) -> None:
    """It was a bare int() where Ray starts: "unexpected ValueError", exit 1, where every FLASH_* setting is exit 2."""
    assert_compact_command_refused(tmp_path, {"FLASH_EXECUTOR": "ray", "FLASH_RAY_NUM_CPUS": value},
                                   "FLASH_RAY_NUM_CPUS must be a whole number of CPUs")
