"""Expected latency (the paper's "expected SLA") from input statistics and a calibrated throughput model.

Each step's cost is linear in what it touches, spread over the CPUs it can use:
    hash bucket   c_hash  * delta rows                     / min(cpus, hash tasks)
    dedupe        c_dedupe * (delta rows + indexed rows)   / min(cpus, buckets)
    materialize   c_mat   * bytes of rewritten input       / min(cpus, materialize tasks of the rewritten units)
    per round     overhead
    kernel load   once, when an in-process session makes its process load Numba (kernels/jit.py: a fresh
                  command of a large input does; a long-lived process only once)
Coefficients start from defaults measured on a 2-core machine and are refined after every compaction from
its measured step times (exponential moving average), stored per installation in a small JSON file
(``FLASH_CALIBRATION_PATH`` or ``~/.cache/flash-compactor/calibration.json``). The prediction carries the
paper's 10% buffer.

Rounds in this process and rounds on Ray keep separate coefficients (``EXECUTORS``): a Ray round pays for
scheduling and moving objects (its per-round overhead is about 0.3 s here, an in-process round's a few
hundredths), so either's observations would skew the other's model. Before, only Ray rounds calibrated and the
in-process path -- the command's default for inputs that fit this machine -- always showed the defaults.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from flash_pipeline.catalog.key_ranges import KeyRange, files_miss
from flash_pipeline.catalog.model import UPSERT
from flash_pipeline.compactor.model.plans import contiguous_groups, materialize_task_rows
from flash_pipeline.compactor.planning.rounds import COMPACTED_ROW_GROUP_ROWS, MIN_TASK_ROWS, materialize_target_rows
from flash_pipeline.compactor.steps.source_io import UNIT_ROWS

if TYPE_CHECKING:
    from flash_pipeline.catalog.model import CompactedVersion, Delta
    from flash_pipeline.compactor.model.plans import SessionSizing

BUFFER = 1.10
ALPHA = 0.3
_lock = threading.Lock()


@dataclass
class Coefficients:
    """Seconds per unit of work on one CPU; the defaults are Ray's (see DEFAULTS)."""

    hash_s_per_row: float = 1.2e-6
    dedupe_s_per_row: float = 0.35e-6
    materialize_s_per_byte: float = 25e-9
    round_overhead_s: float = 0.35
    runs: int = 0
    kernel_load_s: float = 0.4


RAY, IN_PROCESS = "ray", "in_process"
EXECUTORS = (RAY, IN_PROCESS)
# Uncalibrated starting points. In process: what a fresh calibration learned from s1 (6.26M rows, 404 MB of
# Parquet, 2 threads: 0.56-0.75 us a row to hash, 0.17-0.23 to dedupe, 18-20 ns a byte to materialize, in three
# commands) and from 1,500-row tables (0.05 s a round) on this project's 2-core VM.
DEFAULTS = {
    RAY: Coefficients(),
    IN_PROCESS: Coefficients(hash_s_per_row=0.6e-6, dedupe_s_per_row=0.2e-6, materialize_s_per_byte=18e-9,
                             round_overhead_s=0.05, kernel_load_s=0.4),
}


@dataclass(frozen=True)
class Workload:
    delta_rows: int
    indexed_rows: int
    rewrite_bytes: int
    rounds: int
    cpus: int
    buckets: int
    hash_tasks: int
    materialize_tasks: int
    loads_kernels: bool = False  # this session will make its process load Numba (in process only)


def estimate_workload(sizing: SessionSizing, deltas: Sequence[Delta], prior: CompactedVersion | None,
                      cpus: int, delta_range: KeyRange | None = None, vector_limit: float = -1.0) -> Workload:
    """What the session will touch, from catalog statistics (no row is read). ``delta_range``: the range of the
    deltas' first key column (planning/delta_ranges.py, from their footers), if known: the prior files whose
    recorded range misses it are neither rewritten nor probed (as dedupe skips their index files), so updates
    clustered in a few files are charged for those files, not for the table. ``vector_limit``: the dead
    fraction up to which a touched file is carried with a deletion vector instead of rewritten (-1: vectors off).
    """
    delta_rows = sum(d.rows for d in deltas)
    upsert_rows = sum(d.rows for d in deltas if d.operation == UPSERT)
    upsert_bytes = sum(d.bytes for d in deltas if d.operation == UPSERT)
    prior_rows = prior.rows if prior is not None else 0
    touched = touched_rows = 0
    index_rows = probed_rows = prior.index.rows if prior is not None and prior.index is not None else prior_rows
    if prior is not None and prior.files:
        touched, touched_rows = _rewritten(prior, delta_rows, delta_range, vector_limit)
        if prior.index is not None:
            ranges = [f.key_range for f in prior.files]
            probed_rows = sum(f.rows for files in prior.index.buckets for f in files
                              if not files_miss(ranges, f.first_file, f.last_file, delta_range))
    rounds = len(sizing.rounds)
    files = sum(len(d.files) for d in deltas)
    return Workload(
        delta_rows=delta_rows,
        indexed_rows=index_rows * (rounds - 1) + probed_rows,  # only the last round's probe skips index files
        rewrite_bytes=upsert_bytes + touched,
        rounds=rounds,
        cpus=cpus,
        buckets=sizing.bucket_count,
        hash_tasks=max(1, min(cpus, files + delta_rows // 1_000_000)),
        # the units a round rewrites: the touched prior rows in row groups, each upsert file in units of its own
        materialize_tasks=materialize_tasks(upsert_rows + prior_rows, _units(touched_rows, COMPACTED_ROW_GROUP_ROWS) + [
            u for d in deltas if d.operation == UPSERT for f in d.files for u in _units(f.rows, UNIT_ROWS)]),
    )


def with_kernel_load(w: Workload) -> Workload:
    """``w`` marked with whether running it in this process makes the process load Numba first (kernels/jit.py:
    a fresh command of a large input does, ~0.4 s; a small one runs NumPy forms; a process loads it once)."""
    from flash_pipeline.compactor.kernels import jit
    from flash_pipeline.compactor.kernels.numpy_forms import expected_round_ns

    return replace(w, loads_kernels=jit.will_load(expected_round_ns(w.delta_rows, w.indexed_rows)))


def _rewritten(prior: CompactedVersion, delta_rows: int, delta_range: KeyRange | None,
               vector_limit: float) -> tuple[int, int]:
    """(bytes, rows) of the prior files the deltas are expected to rewrite: those that may hold a delta key, each
    hit with probability 1 - exp(-u) for the u delta rows expected in it (spread in proportion to its rows);
    one that stays at most ``vector_limit`` dead is carried with a deletion vector instead."""
    near = [f for f in prior.files if _may_hold(f.key_range, delta_range)]
    near_rows = sum(f.rows for f in near)
    if not near_rows:
        return 0, 0
    hit_bytes = hit_rows = 0.0
    for f in near:
        expected = delta_rows * f.rows / near_rows
        if vector_limit >= 0 and f.rows and (f.rows - f.live_rows + expected) / f.rows <= vector_limit:
            continue
        hit = 1 - math.exp(-expected)
        hit_bytes += f.bytes * hit
        hit_rows += f.rows * hit
    return int(hit_bytes), int(hit_rows)


def _may_hold(file_range: KeyRange | None, delta_range: KeyRange | None) -> bool:
    """Whether a prior file may hold a key of the deltas (unknown ranges: it may)."""
    return file_range is None or delta_range is None or file_range.overlaps(delta_range)


def observed_workload(w: Workload, deltas: Sequence[Delta], prior: CompactedVersion | None, bytes_carried: int,
                      index_bytes_skipped: int) -> Workload:
    """``w`` with what the session actually rewrote and probed: the prior bytes it did not carry, the index it
    did not skip. Calibration learns each step's rate from these, never from the estimate: a clustered update
    estimated as spread would otherwise teach the model that rewriting a byte costs a tenth of what it does."""
    if prior is None:
        return w
    upsert_bytes = sum(d.bytes for d in deltas if d.operation == UPSERT)
    rewrite = upsert_bytes + max(0, prior.bytes - bytes_carried)
    indexed = w.indexed_rows
    if prior.index is not None and prior.index.bytes:
        skipped = int(prior.index.rows * min(1.0, index_bytes_skipped / prior.index.bytes))
        indexed = prior.index.rows * w.rounds - skipped
    return replace(w, rewrite_bytes=rewrite, indexed_rows=indexed)


def materialize_tasks(input_rows: int, unit_rows: Sequence[int]) -> int:
    """How many materialize tasks a round runs that rewrites units of ``unit_rows`` rows (of ``input_rows`` upsert
    and prior rows): the plan's target rows per task (planning/rounds.py, before the budget's cap), cut finer as
    the plan cuts a small rewrite (plans.materialize_task_rows), over the units in order as the plan groups them
    (plans.contiguous_groups). An incremental round that rewrites one file of a large table runs a few tasks, not
    one per million rows of the table."""
    per_task = materialize_task_rows(sum(unit_rows), materialize_target_rows(input_rows), MIN_TASK_ROWS)
    return max(1, len(contiguous_groups(list(unit_rows), per_task)))


def _units(rows: int, size: int) -> list[int]:
    """``rows`` in units of at most ``size`` rows."""
    return [size] * (rows // size) + ([rows % size] if rows % size else [])


def calibration_path() -> Path:
    return Path(os.environ.get("FLASH_CALIBRATION_PATH")
                or Path.home() / ".cache" / "flash-compactor" / "calibration.json")


def _stored() -> dict[str, dict]:
    """The calibration file's coefficient sets by executor. A file from before the split holds one flat set,
    learned from Ray rounds only: it is Ray's."""
    try:
        data = json.loads(calibration_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "runs" in data:
        return {RAY: data}
    return {k: v for k, v in data.items() if k in EXECUTORS and isinstance(v, dict)}


def load(executor: str = RAY) -> Coefficients:
    """The coefficients of rounds run by ``executor`` (RAY or IN_PROCESS): calibrated, else the defaults."""
    default = DEFAULTS[executor]
    data = _stored().get(executor, {})
    try:
        return replace(default, **{k: type(v)(data[k]) for k, v in asdict(default).items() if k in data})
    except (TypeError, ValueError):
        return replace(default)


def save(c: Coefficients, executor: str = RAY) -> None:
    """Store ``executor``'s coefficients beside the other executor's."""
    path = calibration_path()
    data = _stored()
    data[executor] = asdict(c)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs calibration


def _par(cpus: int, tasks: int) -> int:
    return max(1, min(cpus, max(1, tasks)))


def step_seconds(c: Coefficients, w: Workload) -> dict[str, float]:
    return {
        "hash_bucket": c.hash_s_per_row * w.delta_rows / _par(w.cpus, w.hash_tasks),
        "dedupe": c.dedupe_s_per_row * (w.delta_rows + w.indexed_rows) / _par(w.cpus, w.buckets),
        "materialize": c.materialize_s_per_byte * w.rewrite_bytes / _par(w.cpus, w.materialize_tasks),
        "overhead": c.round_overhead_s * max(1, w.rounds),
        "kernel_load": c.kernel_load_s if w.loads_kernels else 0.0,
    }


def predict(w: Workload, c: Coefficients | None = None, executor: str = RAY) -> float:
    """Expected seconds for a session whose rounds ``executor`` runs, buffer included."""
    return BUFFER * sum(step_seconds(c or load(executor), w).values())


def cpus_for(w: Workload, desired_seconds: float, c: Coefficients | None = None) -> int | None:
    """Smallest CPU count whose prediction meets ``desired_seconds`` (None: no CPU count can). More CPUs than
    this machine's means a Ray cluster, so the model is Ray's."""
    c = c or load(RAY)
    for cpus in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if predict(Workload(**{**asdict(w), "cpus": cpus, "hash_tasks": max(w.hash_tasks, cpus),
                               "materialize_tasks": max(w.materialize_tasks, 1),
                               "buckets": max(w.buckets, cpus)}), c) <= desired_seconds:
            return cpus
    return None


# below this many rows a step's time is mostly fixed cost, so only the per-round overhead is learned from it
MIN_ROWS_TO_LEARN_RATES = 200_000
MIN_BYTES_TO_LEARN_RATES = 16 << 20


def observe(w: Workload, measured: dict[str, float], executor: str = RAY) -> Coefficients:
    """Fold one session's measured step seconds into the stored coefficients of rounds run by ``executor``."""
    with _lock:
        c = load(executor)
        first = c.runs == 0

        def ewma(old: float, value: float) -> float:
            if not math.isfinite(value) or value <= 0:
                return old
            return value if first else (1 - ALPHA) * old + ALPHA * value

        share = c.round_overhead_s * max(1, w.rounds) / 3
        if "hash_bucket" in measured and w.delta_rows >= MIN_ROWS_TO_LEARN_RATES:
            c.hash_s_per_row = ewma(c.hash_s_per_row, max(0.0, measured["hash_bucket"] - share)
                                    * _par(w.cpus, w.hash_tasks) / w.delta_rows)
        if "dedupe" in measured and w.delta_rows + w.indexed_rows >= MIN_ROWS_TO_LEARN_RATES:
            c.dedupe_s_per_row = ewma(c.dedupe_s_per_row, max(0.0, measured["dedupe"] - share)
                                      * _par(w.cpus, w.buckets) / (w.delta_rows + w.indexed_rows))
        if "materialize" in measured and w.rewrite_bytes >= MIN_BYTES_TO_LEARN_RATES:
            c.materialize_s_per_byte = ewma(c.materialize_s_per_byte, max(0.0, measured["materialize"] - share)
                                            * _par(w.cpus, w.materialize_tasks) / w.rewrite_bytes)
        total = measured.get("total", sum(v for k, v in measured.items() if k != "total"))
        fixed = step_seconds(c, w)
        variable = sum(v for k, v in fixed.items() if k not in ("overhead", "kernel_load"))
        if w.loads_kernels:  # what the session took beyond its steps and rounds is the load
            c.kernel_load_s = ewma(c.kernel_load_s, min(5.0, max(0.0, total - variable - fixed["overhead"])) or 1e-9)
        else:
            c.round_overhead_s = ewma(c.round_overhead_s, min(5.0, max(0.05, (total - variable) / max(1, w.rounds))))
        c.runs += 1
        save(c, executor)
        return c
