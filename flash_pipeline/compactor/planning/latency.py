"""Expected latency (the paper's "expected SLA") from input statistics and a calibrated throughput model.

Each step's cost is a fixed part plus a part linear in what it touches, spread over the CPUs it can use:
    hash bucket   f_hash + c_hash  * delta rows                   / min(cpus, hash tasks)
    dedupe        f_dedupe + c_dedupe * (delta rows + indexed rows) / min(cpus, buckets)
    materialize   f_mat + c_mat   * bytes of rewritten input     / min(cpus, materialize tasks of the rewritten units)
    per round     overhead (planning, commit: a session's time outside its steps)
    kernel load   once, when an in-process session makes its process load Numba (kernels/jit.py: a fresh
                  command of a large input does; a long-lived process only once)
    uncompiled    an in-process session whose process runs its kernels uncompiled: jit's own estimate
Coefficients start from defaults measured on a 2-core machine and are refined after every compaction from
its measured step times (each step's fixed part and rate fitted to its recent sessions, :func:`_fit`), stored
per installation in a small JSON file (``FLASH_CALIBRATION_PATH`` or
``~/.cache/flash-compactor/calibration.json``). The prediction carries the paper's 10% buffer.

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

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
    """Seconds per unit of work on one CPU and fixed seconds per step; the defaults are Ray's (see DEFAULTS).
    ``history``: each step's last observations (units per CPU, seconds), from which its rate and fixed cost are
    fitted (:func:`_fit`)."""

    hash_s_per_row: float = 1.2e-6
    dedupe_s_per_row: float = 0.35e-6
    materialize_s_per_byte: float = 25e-9
    round_overhead_s: float = 0.35
    runs: int = 0
    kernel_load_s: float = 0.4
    hash_fixed_s: float = 0.0
    dedupe_fixed_s: float = 0.0
    materialize_fixed_s: float = 0.0
    uncompiled_scale: float = 1.0  # measured over jit's estimate of uncompiled kernels' time
    history: dict[str, list[list[float]]] = field(default_factory=dict)


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
    uncompiled_s: float = 0.0  # its kernels' expected seconds in their uncompiled forms (kernels/jit.py), if so


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


def with_kernel_forms(w: Workload) -> Workload:
    """``w`` with the kernels this process will run it on (kernels/jit.py's rent-or-buy rule): a process that has
    not loaded Numba runs a small round's kernels uncompiled (NumPy forms: charged jit's own estimate of their
    time), and a large round makes it load Numba first (a fresh command of s1 does, ~0.4 s; a process only once)."""
    from flash_pipeline.compactor.kernels import jit
    from flash_pipeline.compactor.kernels.numpy_forms import expected_round_ns

    ns = expected_round_ns(w.delta_rows, w.indexed_rows)
    if jit.will_load(ns):
        return replace(w, loads_kernels=True)
    return replace(w, uncompiled_s=ns / 1e9) if jit.runs_uncompiled() else w


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
        values = {k: type(v)(data[k]) for k, v in asdict(default).items() if k in data and k != "history"}
        raw = data.get("history", {})
        history = {step: [[float(x), float(y)] for x, y in raw[step]][-HISTORY:] for step in STEPS if raw.get(step)}
        return replace(default, **values, history=history)
    except (TypeError, ValueError, AttributeError):
        return replace(default, history={})


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


STEPS = ("hash_bucket", "dedupe", "materialize")
_RATE = {"hash_bucket": "hash_s_per_row", "dedupe": "dedupe_s_per_row", "materialize": "materialize_s_per_byte"}
_FIXED = {"hash_bucket": "hash_fixed_s", "dedupe": "dedupe_fixed_s", "materialize": "materialize_fixed_s"}


def step_units(w: Workload) -> dict[str, float]:
    """What each step does per CPU: delta rows hashed, rows deduplicated, bytes rewritten."""
    return {"hash_bucket": w.delta_rows / _par(w.cpus, w.hash_tasks),
            "dedupe": (w.delta_rows + w.indexed_rows) / _par(w.cpus, w.buckets),
            "materialize": w.rewrite_bytes / _par(w.cpus, w.materialize_tasks)}


def step_seconds(c: Coefficients, w: Workload) -> dict[str, float]:
    units = step_units(w)
    return {
        **{step: getattr(c, _FIXED[step]) + getattr(c, _RATE[step]) * units[step] for step in STEPS},
        "overhead": c.round_overhead_s * max(1, w.rounds),
        "kernel_load": c.kernel_load_s if w.loads_kernels else 0.0,
        "uncompiled_kernels": c.uncompiled_scale * w.uncompiled_s,
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


HISTORY = 16  # observations kept per step
MIN_UNCOMPILED_TO_LEARN = 0.05  # seconds of jit's estimate below which uncompiled time is mostly noise
# a step's history must span this ratio of sizes before a fixed cost is fitted to it (else the rate alone)
MIN_SPREAD = 2.0
# below this much work per CPU a step's time is mostly its fixed part: no rate is learned until a session of a
# step did at least this much (a few runs of the paper's 16-row example would otherwise teach ~600 us a row)
MIN_UNITS_TO_LEARN = {"hash_bucket": 100_000, "dedupe": 100_000, "materialize": 8 << 20}


def _fit(points: Sequence[Sequence[float]], min_units: float) -> tuple[float, float] | None:
    """(fixed seconds, seconds per unit) of a step by least squares over its observations (units, seconds): a
    step's time is a fixed part (starting tasks, opening files) plus a part per unit. A rate alone (the model
    before) learned from a large session under-predicted a small one and over-predicted the next large one (the
    in-process latency benchmark: 400k rows 0.41 s predicted for 0.51 s, 2M rows 1.65 s for 1.42 s). None until
    the observations span ``MIN_SPREAD`` of sizes, the largest at least ``min_units``."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(points) < 3 or min(xs) <= 0 or max(xs) < max(MIN_SPREAD * min(xs), min_units):
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = min(max(0.0, my - slope * mx), min(ys))
    slope = sum(x * (y - fixed) for x, y in zip(xs, ys)) / sum(x * x for x in xs)  # through the clamped fixed part
    return (fixed, slope) if slope > 0 else None


def _learn_rates(c: Coefficients, w: Workload, measured: dict[str, float],
                 ewma: Callable[[float, float], float]) -> None:
    """Each step's fixed cost and rate, fitted to its recent observations (:func:`_fit`); until they span enough
    sizes, its rate alone from this one (less the fixed cost), as a moving average."""
    for step, units in step_units(w).items():
        if step not in measured or units <= 0:
            continue
        c.history[step] = (c.history.get(step, []) + [[units, measured[step]]])[-HISTORY:]
        fitted = _fit(c.history[step], MIN_UNITS_TO_LEARN[step])
        if fitted is not None:
            setattr(c, _FIXED[step], fitted[0])
            setattr(c, _RATE[step], fitted[1])
        elif units >= MIN_UNITS_TO_LEARN[step]:
            rate = max(0.0, measured[step] - getattr(c, _FIXED[step])) / units
            setattr(c, _RATE[step], ewma(getattr(c, _RATE[step]), rate))


def observe(w: Workload, measured: dict[str, float], executor: str = RAY) -> Coefficients:
    """Fold one session's measured step seconds into the stored coefficients of rounds run by ``executor``."""
    with _lock:
        c = load(executor)
        first = c.runs == 0

        def ewma(old: float, value: float) -> float:
            if not math.isfinite(value) or value <= 0:
                return old
            return value if first else (1 - ALPHA) * old + ALPHA * value

        if not w.loads_kernels and not w.uncompiled_s:  # only compiled kernels' step times are the steps' rates
            _learn_rates(c, w, measured, ewma)
        total = measured.get("total", sum(v for k, v in measured.items() if k != "total"))
        model = step_seconds(c, w)
        if w.loads_kernels:  # what the session took beyond its steps (as compiled) and rounds is the load
            steps = sum(model[k] for k in STEPS)
            c.kernel_load_s = ewma(c.kernel_load_s, min(5.0, max(0.0, total - steps - model["overhead"])) or 1e-9)
        else:  # planning, commit and the rest: the session's time outside its steps (uncompiled kernels inside)
            inside = sum(measured.get(k, model[k]) for k in STEPS)
            if w.uncompiled_s >= MIN_UNCOMPILED_TO_LEARN:  # the steps' time beyond the compiled model's
                c.uncompiled_scale = ewma(c.uncompiled_scale, min(10.0, max(0.1, (inside - sum(
                    model[k] for k in STEPS)) / w.uncompiled_s)))
            outside = total - inside
            c.round_overhead_s = ewma(c.round_overhead_s, min(5.0, max(0.01, outside / max(1, w.rounds))))
        c.runs += 1
        save(c, executor)
        return c
