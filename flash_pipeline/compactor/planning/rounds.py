"""Rounds: a session's deltas split into serial rounds within the memory budget, and each round's plan.

A round's plan (``RoundPlan``) fixes everything its tasks need before any task runs: the source units (whole
files, or runs of Parquet row groups), which units each hash bucket task reads, which each materialize task
writes. Materialize groups depend only on the input and the budget, never on the cluster, so the compacted
files are deterministic.
"""

from __future__ import annotations

import functools
import uuid
from typing import Sequence

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.model import CompactedVersion, DataFile, Delta, schema_from_b64, schema_to_b64
from flash_pipeline.catalog.physical_names import physical_view
from flash_pipeline.catalog.schema_evolution import same_columns
from flash_pipeline.compactor.index.dead_entries import dead_pointers
from flash_pipeline.compactor.model.plans import RoundPlan, SessionSizing, SessionSpec, SourceFile, rank_of
from flash_pipeline.compactor.model.survivors import map_bytes
from flash_pipeline.compactor.planning.sizing import DECOMPRESSION_FACTOR, delta_round_bytes
from flash_pipeline.compactor.steps.source_io import (
    CONTENT_ERRORS,
    SMALL_UNIT_BYTES,
    UNIT_ROWS,
    UnitSpan,
    split_units,
    unreadable,
)
from flash_pipeline.errors import IntegrityError, InternalError
from flash_pipeline.faults import crash_settings

# materialize tasks read about max(1M rows, input/16) rows each (capped by rows per compacted file)
MATERIALIZE_MIN_ROWS = 1_000_000
MATERIALIZE_MAX_TASKS = 16
MATERIALIZE_IN_FLIGHT = 4
# a streaming materialize task holds about five task shares of decoded rows: the unit it takes from, the row
# group it fills (with the pieces it was taken in: steps/materialize.py), and the writer's encoded pages of that
# row group -- besides its Parquet reader's own pages. s5 in process (2 tasks, 99.6 MiB budget, scratch
# timeline of the Arrow pool and malloc): with four shares 101-106 MiB at most, with five 90-93 MiB.
MATERIALIZE_COPIES = 5
# what an open Parquet reader holds a column besides the rows it returns: a decompressed data page and dictionary
# page (about 1 MiB each as writers size them) and its read buffer; 17 MiB for s5's 9 columns
READER_BYTES_PER_COLUMN = 2 << 20
MIN_UNIT_ROWS = 10_000
# compacted Parquet files get row groups of at most this many rows, so later rounds can read them in units (a
# row group a unit: UNIT_ROWS). A materialize task holds the row group it fills and the writer's pages of it:
# 128Ki rows against 256Ki lowered a warm Ray's peak PSS on s1 by ~70 MiB (1,564-1,571 against 1,635-1,637),
# in the same time (in process, 4 alternating pairs: materialize 2.73-2.96 s against 2.76-2.94 s). DuckDB
# writes row groups of 122,880 rows.
COMPACTED_ROW_GROUP_ROWS = 128 * 1024
# a round that rewrites less than plans.MATERIALIZE_MIN_TASKS tasks' worth gets tasks of at least this many rows
MIN_TASK_ROWS = 256 * 1024


def materialize_target_rows(input_rows: int, rows_per_file: int | None = None) -> int:
    """Rows a materialize task reads, before the memory budget's cap: max(1M rows, input / 16), at most a
    compacted file's rows. The latency model counts tasks with it too (latency.materialize_tasks)."""
    target = max(MATERIALIZE_MIN_ROWS, -(-input_rows // MATERIALIZE_MAX_TASKS))
    return min(rows_per_file, target) if rows_per_file else target


def balanced_groups(weights: list[int], parts: int, joined: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """At most ``parts`` contiguous ranges (hash bucket tasks) whose heaviest is as light as it can be, never cut
    before an item that is ``joined`` to the one before it (parts of one row group).

    The tasks run side by side and the step ends with the last, so the heaviest range is what counts. Closing a
    range once it reached the mean (contiguous_groups) overshot: s1's two tasks got 3.5M and 2.76M rows where
    3.0M and 3.26M were possible. Here the least feasible limit is found by bisection, each candidate checked by
    a greedy split over the prefix sums (``searchsorted`` a range, so a few thousand small deltas cost nothing)."""
    n = len(weights)
    if n == 0:
        return []
    parts = max(1, min(parts, n))
    # where a range may start or end
    cuts = [0] + [i for i in range(1, n) if not (joined is not None and joined[i])] + [n]
    prefix = np.cumsum([0] + [w or 1 for w in weights], dtype=np.int64)[cuts]

    def split(limit: int) -> list[tuple[int, int]] | None:
        """Ranges from the left, each as heavy as ``limit`` allows; None when more than ``parts`` are needed."""
        out: list[tuple[int, int]] = []
        at = 0
        while at < len(cuts) - 1:
            end = int(np.searchsorted(prefix, prefix[at] + limit, side="right")) - 1
            if end <= at or len(out) == parts:
                return None
            out.append((cuts[at], cuts[end]))
            at = end
        return out

    lo, hi = int(np.diff(prefix).max()), int(prefix[-1])  # the heaviest unbreakable run .. everything in one range
    while lo < hi:
        mid = (lo + hi) // 2
        if split(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    groups = split(lo)
    if groups is None:  # lo is feasible: hi only ever took feasible values, and the total always is
        raise InternalError(f"no split of {n} hash bucket units into {parts} ranges within {lo}")
    return groups


def split_rounds(deltas: Sequence[Delta], max_round_bytes: int, sort_key_width: int = 0) -> list[list[Delta]]:
    """Consecutive deltas per round, each round's estimated intermediate memory within the budget.

    Greedy from the first delta, so a resumed session splits its remaining deltas exactly as the interrupted
    one would have. A single delta above the budget forms a round of its own (a delta is never split: round K
    may only hold positions after round K-1).
    """
    weights = [delta_round_bytes(d.rows, sort_key_width) for d in deltas]
    rounds: list[list[Delta]] = []
    current: list[Delta] = []
    used = 0
    for d, w in zip(deltas, weights):
        if current and used + w > max_round_bytes:
            rounds.append(current)
            current, used = [], 0
        current.append(d)
        used += w
    if current:
        rounds.append(current)
    return rounds


def _units(catalog: Catalog, f: DataFile, unit_rows: int, position: int, prior: bool) -> list[UnitSpan]:
    """split_units, a footer that cannot be read (the file gone, not Parquet) named as the round's reads name it:
    the job then says which delta blocks the stream and the commands that unblock it (it was a bare "not found")."""
    try:
        return split_units(catalog.storage, f, unit_rows)
    except CONTENT_ERRORS as exc:
        raise unreadable(f.key, exc, position, prior) from None


def build_round_plan(
    catalog: Catalog, spec: SessionSpec, sizing: SessionSizing, prior: CompactedVersion | None,
    rounds: Sequence[Sequence[Delta]], version: int, cpus: int,
) -> RoundPlan:
    """The plan of the session that commits ``version`` from ``prior`` and the deltas of ``rounds``; its files
    go under a fresh attempt folder ``<version>-<id>`` (see catalog.commits)."""
    attempt = f"{version:010d}-{uuid.uuid4().hex[:12]}"
    deltas = [d for round_deltas in rounds for d in round_deltas]
    prior_files = sorted(prior.files, key=lambda f: f.file_number) if prior is not None else []
    if [f.file_number for f in prior_files] != list(range(1, len(prior_files) + 1)):
        raise IntegrityError(f"compacted version {prior.version if prior else '-'} file numbers are not 1..n")
    delta_files = [(d, f) for d in deltas for f in sorted(d.files, key=lambda f: f.file_number)]
    upsert_files = prior_files + [f for d, f in delta_files if d.operation == "upsert"]
    total_rows = sum(f.rows for f in upsert_files)
    target = materialize_target_rows(total_rows, spec.rows_per_file)
    notes = _oversized_rounds(rounds, sizing.max_round_bytes, spec.sort_key_width)
    if total_rows:
        mapped_rows = sum(f.rows for f in prior_files) + sum(f.rows for _, f in delta_files) if len(rounds) > 1 else 0
        share = _MaterializeShare(sizing, spec, upsert_files, mapped_rows, cpus)
        target = min(target, share.rows())
        if share.fitting_rows() < share.least_rows:
            notes.append(share.over_budget_note(sizing.max_round_bytes, len(spec.columns)))
    unit_rows = min(UNIT_ROWS, target)

    sources: list[SourceFile] = []
    for f in prior_files:
        # a file whose row groups the manifest records is split at each (free: no footer to read), so that a
        # round rewriting one large file can give its row groups to several materialize tasks
        prior_unit_rows = min(unit_rows, f.row_group_rows) if f.row_group_rows else unit_rows
        for row_groups, rows, size, row_start, group_rows, skip in _units(catalog, f, prior_unit_rows, -1, True):
            sources.append(SourceFile(len(sources), f.key, f.content_type, rows, size, -1, f.file_number, False, True,
                                      row_groups, row_start, group_rows, skip,
                                      own_schema(file_schema_b64(prior, f), spec.schema_b64)))
    n_prior = len(sources)
    for d, f in delta_files:
        for row_groups, rows, size, row_start, group_rows, skip in _units(catalog, f, unit_rows, d.position, False):
            sources.append(SourceFile(len(sources), f.key, f.content_type, rows, size, d.position, f.file_number,
                                      d.operation == "delete", False, row_groups, row_start, group_rows, skip,
                                      own_schema(d.arrow_schema, spec.schema_b64)))
    hash_groups = []
    for round_deltas in rounds:
        positions = {d.position for d in round_deltas}
        round_sources = [s for s in sources[n_prior:] if s.position in positions]
        first = round_sources[0].src if round_sources else n_prior
        hash_groups.append(tuple(
            tuple(range(first + a, first + b)) for a, b in balanced_groups(
                [s.bytes for s in round_sources], cpus,
                [i > 0 and s.continues(round_sources[i - 1]) for i, s in enumerate(round_sources)])
        ))
    base = f"{catalog.compacted_prefix(spec.destination_table_id, spec.partition)}"
    coalesced = coalesced_units(sources[n_prior:], len(rounds), sizing.max_round_bytes)
    return RoundPlan(
        round_id=attempt,
        version=version,
        spec=spec,
        bucket_count=sizing.bucket_count,
        sources=tuple(sources),
        prior_index=prior.index if prior is not None else None,
        hash_groups=tuple(hash_groups),
        materialize_rows=target,
        materialize_min_rows=MIN_TASK_ROWS,
        # the Delta root (usually base/data)
        data_prefix=f"{catalog.deltalake_root(spec.destination_table_id, spec.partition)}/{attempt}",
        index_prefix=f"{base}/index/{attempt}",
        prior_file_rows=tuple(f.rows for f in prior_files),
        prior_file_bytes=tuple(f.bytes for f in prior_files),
        prior_file_checksums=tuple(f.checksum for f in prior_files),
        prior_file_row_group_rows=tuple(f.row_group_rows for f in prior_files),
        prior_file_key_ranges=tuple(f.key_range for f in prior_files),
        prior_file_columns=tuple(carried_columns(prior, f, spec) for f in prior_files),
        row_group_rows=max(MIN_UNIT_ROWS, min(COMPACTED_ROW_GROUP_ROWS, target)),
        crash=crash_settings(),
        state_prefix=f"{base}/state/{attempt}",
        coalesced=coalesced,
        prior_vectors=tuple(f.deletion_vector for f in prior_files),
        dead_ranks=dead_ranks(dead := _dead_rows(catalog, prior_files), sources[:n_prior]),  # vectors read once
        dead_pointers=dead_pointers(dead),
        notes=tuple(notes),
        cpus=cpus,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _oversized_rounds(rounds: Sequence[Sequence[Delta]], max_round_bytes: int, sort_key_width: int) -> list[str]:
    """A note for each delta whose round alone exceeds the budget (a delta is never split: see split_rounds)."""
    return [f"the delta at position {d.position} alone needs about {_mib(delta_round_bytes(d.rows, sort_key_width))} "
            f"of hash bucket and dedupe memory, above the {_mib(max_round_bytes)} budget of a round: its round runs "
            "whole (a delta is never split)"
            for r in rounds if len(r) == 1 for d in r if delta_round_bytes(d.rows, sort_key_width) > max_round_bytes]


class _MaterializeShare:
    """What a materialize task may hold within the round budget: the budget, less the survivor map of a session of
    several rounds (``mapped_rows`` input rows), over the tasks that run at once; each holds its Parquet reader's
    pages and MATERIALIZE_COPIES units' worth of decoded rows. The units (and so the resumable state) depend on
    the CPUs: a session resumed on another cluster redoes its rounds (session.sources_fingerprint)."""

    def __init__(self, sizing: SessionSizing, spec: SessionSpec, upsert_files: Sequence[DataFile], mapped_rows: int,
                 cpus: int) -> None:
        total_rows = sum(f.rows for f in upsert_files)
        self.row_bytes = max(1.0, DECOMPRESSION_FACTOR * sum(f.bytes for f in upsert_files) / total_rows)
        self.held = map_bytes(mapped_rows, sizing.bucket_count)
        self.tasks = max(1, min(MATERIALIZE_IN_FLIGHT, cpus))
        # a reader holds a page or so per column, never more than its file decoded: 1,000 columns of a 40 MB
        # table were charged 2 GiB, and every compaction of it told the user to raise the budget to 7 GB
        largest = max((f.bytes for f in upsert_files), default=0)
        self.reader = min(READER_BYTES_PER_COLUMN * len(spec.columns), DECOMPRESSION_FACTOR * largest)
        # the smallest unit the plan makes: MIN_UNIT_ROWS rows, or a whole file when no file has as many
        self.least_rows = min(MIN_UNIT_ROWS, max((f.rows for f in upsert_files), default=0))
        self.budget = sizing.max_round_bytes

    def over_budget_note(self, max_round_bytes: int, columns: int) -> str:
        """The plan's note when the budget is below what materialize needs at its smallest units."""
        return (f"the memory budget ({_mib(max_round_bytes)} a round) is below what materialize needs at its smallest "
                f"units ({_mib(self.least_budget())}: {self.tasks} task(s) at once, each with a Parquet reader of "
                f"{columns} columns and units of {MIN_UNIT_ROWS} rows); the session runs, but its memory may exceed "
                f"the budget: raise --max-round-bytes to at least {self.least_budget()}")

    def fitting_rows(self) -> float:
        """Rows of a unit that the share holds (below MIN_UNIT_ROWS, the budget cannot be kept)."""
        return ((self.budget - self.held) / self.tasks - self.reader) / MATERIALIZE_COPIES / self.row_bytes

    def rows(self) -> int:
        """Rows of a unit (and of a compacted row group): as many as fit, never below MIN_UNIT_ROWS."""
        return max(MIN_UNIT_ROWS, int(self.fitting_rows()))

    def least_budget(self) -> int:
        """The least budget whose share holds the smallest units (rounded up to a MiB)."""
        least = self.held + self.tasks * (self.reader + MATERIALIZE_COPIES * self.least_rows * self.row_bytes)
        return -(-int(least) // 2**20) * 2**20


def _dead_rows(catalog: Catalog, files: Sequence[DataFile]) -> dict[int, np.ndarray]:
    return {f.file_number: catalog.dead_rows(f) for f in files if f.deletion_vector is not None}


def dead_ranks(dead_by_file: dict[int, np.ndarray], prior_units: Sequence[SourceFile]) -> np.ndarray:
    """Ranks (unit src << 40 | row inside the unit) of the prior rows deletion vectors mark dead (``dead_by_file``:
    by file number), ascending: the layout counts them with the rows this round's dedupe removes (compute_layout)."""
    parts = []
    for number, dead in dead_by_file.items():
        for s in prior_units:
            if s.file_number == number:
                inside = dead[(dead >= s.row_start) & (dead < s.row_start + s.rows)] - s.row_start
                parts.append(rank_of(s.src, inside))
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def coalesced_units(delta_sources: Sequence[SourceFile], rounds: int, max_round_bytes: int) -> frozenset[int]:
    """The small upsert units that hash bucket reads whole, so that materialize need not open them again.

    A small file costs its per-file latency (open, footer, decode), not bandwidth: thousands of small deltas
    read twice (keys for hash bucket, every column for materialize) cost twice that latency, and reading every
    column in hash bucket costs little more than reading the keys. Their decoded rows are held until
    materialize, so only when the session has one round (the rows of earlier rounds would outlive their
    budget) and they fit in half of the round budget."""
    if rounds != 1:
        return frozenset()
    # a unit of a large file (some of its row groups) is never one: one file pays its latency once, and holding
    # a large file's every column from hash bucket to materialize is what the units are there to avoid
    small = [s for s in delta_sources if not s.is_delete and s.bytes <= SMALL_UNIT_BYTES and not s.row_groups]
    if len(small) < 2 or DECOMPRESSION_FACTOR * sum(s.bytes for s in small) > max_round_bytes // 2:
        return frozenset()
    return frozenset(s.src for s in small)


@functools.lru_cache(maxsize=256)
def own_schema(recorded_b64: str, session_b64: str) -> str:
    """The schema a unit is read with when it is not the session's: ``recorded_b64`` when its columns or types
    differ (the stream's schema evolved since the file was written), else "" (the session's, as always; a file
    whose schema differs only in metadata or column order reads the same). Cached: thousands of deltas share one."""
    if not recorded_b64 or recorded_b64 == session_b64:
        return ""
    recorded = schema_from_b64(recorded_b64)
    if physical_view(recorded) is not None:  # its files have older column names (catalog/schema_names.py)
        return recorded_b64
    return "" if same_columns(recorded, schema_from_b64(session_b64)) else recorded_b64


def file_schema_b64(prior: CompactedVersion | None, f: DataFile) -> str:
    """The schema a prior compacted file was written with: its version's, less the columns added after it was
    written (``DataFile.columns``: a file carried across a schema change)."""
    if prior is None or not prior.arrow_schema:
        return ""
    if not f.columns:
        return prior.arrow_schema
    return _restricted(prior.arrow_schema, f.columns)


@functools.lru_cache(maxsize=64)
def _restricted(schema_b64: str, columns: tuple[str, ...]) -> str:
    schema = schema_from_b64(schema_b64)
    return schema_to_b64(pa.schema([schema.field(c) for c in columns if c in schema.names]))


def carried_columns(prior: CompactedVersion | None, f: DataFile, spec: SessionSpec) -> tuple[str, ...]:
    """``DataFile.columns`` of prior file ``f`` carried into the session's version: its own when it has them,
    else the prior version's columns when the session's schema added some (schema evolution), else none."""
    if f.columns:
        return f.columns
    if prior is None or not prior.arrow_schema or prior.arrow_schema == spec.schema_b64:
        return ()
    names = tuple(schema_from_b64(prior.arrow_schema).names)
    return () if set(names) >= set(spec.columns) else names
