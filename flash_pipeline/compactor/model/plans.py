"""Small typed plans handed to Ray tasks: which source files a round reads and how work is split.

A round's *source files* are numbered ``src = 0..S-1``: first the prior compacted files (in file-number order,
so ``src = file_number - 1``), then the new delta files in (stream position, file number) order. A row's
*rank* is ``src << 40 | row index``: ascending rank is the paper's arrival order, so prior compacted rows rank
below every new delta and ties on the sort key go to the later (position, file number, row index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flash_pipeline.catalog.deletion_vectors import DeletionVector
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.key_ranges import KeyRange, KeyRangeBuilder
from flash_pipeline.catalog.model import CompactedVersion, Delta, IndexVersion

ROW_BITS = 40
ROW_MASK = (1 << ROW_BITS) - 1


# a round that rewrites little is still split into this many materialize tasks (of at least the plan's
# materialize_min_rows rows each)
MATERIALIZE_MIN_TASKS = 4


def materialize_task_rows(rewritten_rows: int, target: int, min_rows: int) -> int:
    """The rows a materialize task aims at when a round rewrites ``rewritten_rows``: ``target``, or -- below
    MATERIALIZE_MIN_TASKS tasks' worth -- a quarter of the rows, but at least ``min_rows`` (see
    RoundPlan.materialize_tasks; the latency model counts tasks with the same rule)."""
    if rewritten_rows < MATERIALIZE_MIN_TASKS * target:
        return min(target, max(min_rows, -(-rewritten_rows // MATERIALIZE_MIN_TASKS)))
    return target


def contiguous_groups(weights: list[int], target: int, max_groups: int | None = None,
                      joined: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """Split items 0..n-1 into contiguous [start, end) ranges of about ``target`` total weight each; never
    between item i-1 and item i where ``joined[i]`` (parts of one Parquet row group: SourceFile.continues)."""
    n = len(weights)
    if n == 0:
        return []
    target = max(1, target)
    if max_groups is not None:
        target = max(target, -(-sum(weights) // max(1, max_groups)))
    groups = []
    start = 0
    acc = 0
    for i, w in enumerate(weights):
        acc += w
        if acc >= target and i + 1 < n and not (joined is not None and joined[i + 1]):
            groups.append((start, i + 1))
            start = i + 1
            acc = 0
    groups.append((start, n))
    return groups


def rank_of(src: np.ndarray | int, row: np.ndarray | int) -> np.ndarray:
    return (np.asarray(src, dtype=np.int64) << ROW_BITS) | np.asarray(row, dtype=np.int64)


def src_of(rank: np.ndarray) -> np.ndarray:
    return rank >> ROW_BITS


def row_of(rank: np.ndarray) -> np.ndarray:
    return rank & ROW_MASK


@dataclass(frozen=True)
class SessionSpec:
    """What the job run asks of one partition stream."""

    source_table_id: str
    destination_table_id: str
    partition: PartitionKeys
    stream_version: int
    primary_keys: tuple[str, ...]
    sort_keys: tuple[tuple[str, str], ...]
    sort_key_width: int
    columns: tuple[str, ...]
    schema_b64: str
    rows_per_file: int
    rows_per_index_file: int
    content_type: ContentType
    rebuild: bool
    # carry files that lose few rows with a deletion vector (catalog/deletion_vectors.py)
    deletion_vectors: bool = False
    max_dead_fraction: float = 0.0  # with vectors: carry a file with a vector while at most this fraction is dead
    # False when the schema changed since the prior version (catalog/schema_evolution.py): every prior file is
    # rewritten in the new schema, so that each version's files share one schema, as every reader expects
    carry_prior: bool = True
    schema_entry: int = 0  # the stream's schema entry whose names the session's version has (catalog/schema_names.py)


@dataclass(frozen=True)
class SessionSizing:
    """How the job sized a planned session: hash buckets, the round budget, the rounds and the base version.

    ``base_version`` is the latest version number when the session was planned (or the rehash it committed
    first): round k commits exactly ``base_version + k``, conditionally."""

    bucket_count: int
    max_round_bytes: int
    rounds: tuple[tuple[Delta, ...], ...]
    base_version: int
    previous: CompactedVersion | None = None  # what the session's schema changes are told against (planning)


@dataclass(frozen=True)
class SourceFile:
    """A unit of input: a whole file, a run of Parquet row groups of a large file, or a part of one row group
    larger than a unit.

    Large files are split into units so that hash bucket and materialize work spreads over all CPUs; units
    of one file follow each other in src order, so ranks still follow (position, file number, row index).
    """

    src: int
    key: str
    content_type: ContentType
    rows: int
    bytes: int
    position: int  # -1 for prior compacted files
    file_number: int
    is_delete: bool
    prior: bool
    row_groups: tuple[int, ...] = ()  # empty: the whole file
    row_start: int = 0  # index in its file of the unit's first row
    # a part of one row group larger than a unit (a delta written as one 500k-row group): the group's rows, and
    # how many of them come before this unit; 0, 0 for a unit that is its row groups whole
    group_rows: int = 0
    skip: int = 0
    # the schema recorded for the file when it is not the session's (the stream's schema evolved since it was
    # written): read as recorded, then given the session's columns and types (schema_evolution.conform)
    schema_b64: str = ""

    def continues(self, previous: "SourceFile") -> bool:
        """Whether this unit is the part of a row group right after ``previous``: one reader streams both
        (steps/source_io.py), so hash bucket and materialize keep them in one task."""
        return (bool(self.group_rows) and self.skip > 0 and previous.key == self.key
                and previous.row_groups == self.row_groups and previous.skip + previous.rows == self.skip)


@dataclass(frozen=True)
class RoundPlan:
    """Everything the tasks of one session's commit need; immutable and cheap to ship.

    ``spec`` says what the session compacts (keys, columns, file sizes, format); the rest is this commit's:
    its attempt, the version it commits, its source units and how the steps' tasks split them. When the input
    exceeds the memory budget, hash bucket and dedupe run in several *rounds* (``hash_groups[k]`` are round
    k's hash bucket tasks), each round's dedupe state saved per bucket under ``state_prefix``; materialize and
    the index writers run once, after the last round, so the table is written once per session."""

    round_id: str
    version: int  # the compacted stream version this round commits
    spec: SessionSpec
    bucket_count: int
    sources: tuple[SourceFile, ...]
    prior_index: IndexVersion | None
    hash_groups: tuple[tuple[tuple[int, ...], ...], ...]  # per round: the delta units of each hash bucket task
    # rows a materialize task reads (about; a unit is never split); the tasks are formed once dedupe has decided
    # which prior files are carried (materialize_tasks)
    materialize_rows: int
    data_prefix: str  # where this attempt writes compacted files
    index_prefix: str  # where this attempt writes index files
    prior_file_rows: tuple[int, ...] = ()  # rows and bytes of prior compacted file n at index n - 1
    prior_file_bytes: tuple[int, ...] = ()
    prior_file_checksums: tuple[str, ...] = ()  # recorded at commit; a carried file keeps its checksum
    prior_file_row_group_rows: tuple[int, ...] = ()  # as recorded (DataFile.row_group_rows); a carried file keeps it
    prior_file_key_ranges: tuple[KeyRange | None, ...] = ()  # as recorded (DataFile.key_range); a carried file keeps it
    # DataFile.columns of each prior file once carried into this version
    prior_file_columns: tuple[tuple[str, ...], ...] = ()
    materialize_min_rows: int = 1  # the least rows of a task cut finer than materialize_rows (materialize_tasks)
    row_group_rows: int = 128 * 1024  # the planner sets it (planning/rounds.py COMPACTED_ROW_GROUP_ROWS)
    crash: tuple[str, str] | None = None  # resilience tests only (faults.py)
    state_prefix: str = ""  # where this attempt saves each round's dedupe state (multi-round sessions)
    resume: tuple[int, tuple[str, ...]] | None = None  # (rounds already done, the state prefix of each)
    notes: tuple[str, ...] = ()  # what the user should know of this plan (a budget it cannot keep)
    # small delta units that hash bucket reads whole and hands to materialize, which then does not open them
    # again (one-round sessions only; planning/rounds.py decides)
    coalesced: frozenset[int] = frozenset()
    # deletion vectors of the prior compacted files (by file number - 1) and the ranks of the rows they mark dead
    prior_vectors: tuple[DeletionVector | None, ...] = ()
    dead_ranks: np.ndarray | None = None
    # the same rows as index pointers (file number << 40 | row), ascending: prior index rows pointing at one are
    # dead (carried index files keep them; index/dead_entries.py)
    dead_pointers: np.ndarray | None = None
    cpus: int = 0  # the CPUs a step's tasks run on at once (0: not known)

    @property
    def rounds(self) -> int:
        return len(self.hash_groups)

    @property
    def probes_by_key_range(self) -> bool:
        """Whether the hash bucket step gathers its deltas' key range for dedupe's probe to skip index files by
        (catalog/key_ranges.py): with a prior index, some of whose compacted files record a range."""
        return self.prior_index is not None and any(r is not None for r in self.prior_file_key_ranges)

    def key_range_builder(self) -> KeyRangeBuilder:
        return KeyRangeBuilder(self.spec.primary_keys[0])

    def decodes_on_threads(self, tasks: int) -> bool:
        """Whether a task of a step of ``tasks`` tasks decodes Parquet columns on Arrow's thread pool: only when the
        step has fewer tasks than CPUs. With a task per CPU, each decoding its own units keeps every core busy,
        and Arrow's pool on top of them only hands work between threads: s1's materialize step took 2.66-2.96 s
        decoding on its own threads against 2.69-3.03 s on Arrow's (8 alternating pairs in process, faster in 6;
        2.54-2.68 against 2.64-2.75 s on a warm Ray, 3 pairs). An object store's units use the pool whatever this
        says (source_io._on_threads: its column chunks are GETs, fetched side by side there)."""
        return self.cpus <= 0 or tasks < self.cpus

    @property
    def releases_memory(self) -> bool:
        """Whether each step returns the pages it freed to the system at its end (runtime/memory.py): in a
        session under a memory budget (several rounds), so that the steps' peaks do not add up."""
        return self.rounds > 1

    def state_key(self, round_number: int, bucket: int) -> str:
        """Where the dedupe state of ``bucket`` after round ``round_number`` lives (a resumed session reads the
        state of the rounds it skips from the interrupted attempt's prefix)."""
        return f"{self.state_prefix_of(round_number)}/round-{round_number:04d}/bucket-{bucket:06d}.state"

    def state_prefix_of(self, round_number: int) -> str:
        """The attempt prefix holding round ``round_number``'s state: a skipped round's is the interrupted
        attempt's (which may itself have resumed an earlier one)."""
        if self.resume is not None and round_number <= self.resume[0]:
            return self.resume[1][round_number - 1]
        return self.state_prefix

    @property
    def where(self) -> str:
        """The round in error messages: table, partition and attempt."""
        return f"{self.spec.destination_table_id} [{format_partition(self.spec.partition)}] round {self.round_id}"

    def materialize_tasks(self, materialized: np.ndarray) -> tuple[tuple[int, ...], ...]:
        """The units each materialize task rewrites: the ``materialized`` ones (a mask by src: upserts not carried
        by reference), in src order, cut into runs of about ``materialize_rows`` input rows.

        Formed after dedupe, so that carried files leave no half-empty task behind, and deterministic (the
        input and the budget decide, never the cluster). A round that rewrites less than MATERIALIZE_MIN_TASKS
        tasks' worth -- an incremental one, whose few rewritten files were otherwise one task on one CPU
        while the others idled -- is cut finer, into tasks of at least ``materialize_min_rows`` rows each (one
        compacted row group): one more file per extra task (benchmarks/results.md, scenario 3). Both numbers
        come with the plan: a Ray worker computing the layout uses the driver's. Parts of one row group
        (SourceFile.continues) stay in one task, whose single reader decodes the group once."""
        srcs = [int(s) for s in np.flatnonzero(materialized)]
        weights = [self.sources[s].rows for s in srcs]
        joined = [i > 0 and self.sources[s].continues(self.sources[srcs[i - 1]]) for i, s in enumerate(srcs)]
        target = materialize_task_rows(sum(weights), self.materialize_rows, self.materialize_min_rows)
        return tuple(tuple(srcs[a:b]) for a, b in contiguous_groups(weights, target, joined=joined))

    def prior_unit_keys(self) -> np.ndarray:
        """(file number << 40 | first row) of every prior unit, ascending: maps index pointers to units."""
        return np.array([(s.file_number << ROW_BITS) | s.row_start for s in self.sources if s.prior], dtype=np.int64)

    def src_row_start(self) -> np.ndarray:
        return np.array([s.row_start for s in self.sources], dtype=np.int64)

    @property
    def prior_file_count(self) -> int:
        return sum(1 for s in self.sources if s.prior)

    def is_delete_by_src(self) -> np.ndarray:
        return np.array([s.is_delete for s in self.sources], dtype=bool)
