"""Step 3, materialize: read only surviving rows (all columns) of each source file and write compacted files.

A prior compacted unit that lost rows keeps the rest in their order (a filter by the layout's lost rows); a
delta file's survivors come from the dedupe output, bucket by bucket. A task streams: it reads a unit (no
unit holds more than a task's share of the budget: source_io.split_units), takes its survivors and writes
them a row group at a time."""

from __future__ import annotations

import functools
import json
from bisect import bisect_left
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.arrow_arrays import indices_array, mask_array
from flash_pipeline.catalog.checksums import write_arrow_checksummed
from flash_pipeline.catalog.files import ContentType, write_chunks
from flash_pipeline.catalog.key_ranges import KeyRangeBuilder
from flash_pipeline.catalog.model import DataFile, schema_from_b64
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.kernels.layout import Layout
from flash_pipeline.compactor.model.plans import ROW_BITS, RoundPlan, row_of, src_of
from flash_pipeline.compactor.model.survivors import SurvivorMap
from flash_pipeline.compactor.steps.hash_bucket import as_materialized
from flash_pipeline.compactor.steps.source_io import SMALL_UNIT_BYTES, read_units
from flash_pipeline.errors import IntegrityError

# rows of a delta unit's output taken at a time (at most a quarter of a row group): the task holds the unit and
# one such piece beside the row group being filled, not the unit's whole output
PIECE_ROWS = 32 * 1024


def _rows_of_run(bucket_ranks: list[np.ndarray], srcs: list[int], sizes: list[int]) -> np.ndarray:
    """Indices into the concatenation of the delta units ``srcs`` (ascending, ``sizes`` rows each) of their
    survivors in the layout's order: unit by unit, and within a unit bucket by bucket, ascending.

    One vectorized pass for a run of units instead of a bisect and a take per unit: thousands of small deltas
    cost a take each otherwise (0.75 s of sampled thread time, GIL waits included, for s4's 2,881 units).
    ``bucket_ranks`` may be strided field views: a Python bisect reads ~40 elements where np.searchsorted would copy
    the whole view."""
    lo, hi = srcs[0] << ROW_BITS, (srcs[-1] + 1) << ROW_BITS
    parts = []
    for ranks in bucket_ranks:
        a, b = bisect_left(ranks, lo), bisect_left(ranks, hi)
        if b > a:
            parts.append(np.asarray(ranks[a:b], dtype=np.int64))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    ranks = np.concatenate(parts)  # bucket by bucket, each ascending
    if len(srcs) == 1:
        return row_of(ranks)
    src = src_of(ranks)
    order = np.argsort(src, kind="stable")  # unit by unit, keeping the bucket order inside each unit
    ranks, src = ranks[order], src[order]
    run = np.asarray(srcs, dtype=np.int64)
    at = np.searchsorted(run, src)
    inside = (at < len(run)) & (run[np.minimum(at, len(run) - 1)] == src)  # ranks of units outside the run
    starts = np.concatenate(([0], np.cumsum(np.asarray(sizes, dtype=np.int64))[:-1]))
    return starts[at[inside]] + row_of(ranks[inside])


def _take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``rows`` of ``table``: one take, which copies only the rows taken (and, from a column of several
    chunks, first concatenates it if it is a string column: see :func:`_taken_pieces`). For a run of small
    units, one take on their chunked concatenation beat concatenating each column first, which copied every
    row of the run (s4's 2,881 units, 876,000 rows, 39% taken: 0.10 s against 0.055 s a call once warm)."""
    return table.take(indices_array(rows))


def _taken_pieces(units: list[pa.Table], rows: np.ndarray, piece_rows: int) -> Iterator[pa.Table]:
    """``rows`` of the concatenation of ``units`` (same schema), in their order, as tables of at most
    ``piece_rows`` rows.

    Arrow's take from a column of several chunks concatenates the chunks of a string column first, on every
    call: taking a 500,000-row s1 unit (4 row groups) in 32K-row pieces cost 0.15 s against 0.05 s taken
    record batch by record batch, where its ``comment`` column alone cost 0.09 s. So a unit read alone (large:
    several row groups) is taken a batch at a time; its survivors come bucket by bucket, each ascending, so
    they change batch about (buckets x batches) times. Were they scattered (a change every 1,024 rows or more
    often), or for a run of small units (one take on the chunked run: a take per unit cost s4 more, and the
    run is a few MiB to concatenate), the take is from the whole table. Concatenating a large unit's columns
    once instead would hold as much memory again as the unit."""
    table = units[0] if len(units) == 1 else pa.concat_tables(units)
    batches = table.to_batches() if len(units) == 1 else []  # zero-copy, cut where any column's chunk ends
    if len(batches) > 1 and len(rows):
        ends = np.cumsum([b.num_rows for b in batches])
        batch_of = np.searchsorted(ends, rows, side="right")
        cuts = np.flatnonzero(batch_of[1:] != batch_of[:-1]) + 1
        if len(cuts) <= len(rows) // 1024:
            starts = np.concatenate(([0], cuts)).tolist()
            for a, b in zip(starts, [*starts[1:], len(rows)]):
                k = int(batch_of[a])
                batch = pa.Table.from_batches([batches[k]], schema=table.schema)
                local = rows[a:b] - (int(ends[k - 1]) if k else 0)
                for start in range(0, len(local), piece_rows):
                    yield _take_rows(batch, local[start:start + piece_rows])
            return
    for start in range(0, len(rows), piece_rows):
        yield _take_rows(table, rows[start:start + piece_rows])


def _delta_runs(wanted: list[int], plan: RoundPlan) -> list[list[int]]:
    """``wanted`` split into runs: consecutive small delta units together (their concatenation is a copy of a
    few MiB each), every other unit alone (a large one is taken from directly, as one copy; a part of a row
    group too, or a task would hold the group's parts at once)."""
    def joins(src: int) -> bool:
        source = plan.sources[src]
        return not source.prior and source.bytes <= SMALL_UNIT_BYTES and not source.group_rows

    runs: list[list[int]] = []
    for src in wanted:
        if runs and joins(src) and joins(runs[-1][-1]):
            runs[-1].append(src)
        else:
            runs.append([src])
    return runs


def output_annotations(plan: RoundPlan, file_number: int) -> dict[str, str]:
    """The paper's output annotations, carried in the file's schema metadata (kept by Parquet and Feather; ORC
    and CSV files rely on the version manifest, which records the same facts)."""
    return {
        "flash.compacted_table_id": plan.spec.destination_table_id,
        "flash.partition_keys": json.dumps([[n, v] for n, v in plan.spec.partition]),
        "flash.compacted_stream_version": str(plan.version),
        "flash.lifecycle_state": "active",
        "flash.compacted_stream_position": "1",
        "flash.compacted_file_number": str(file_number),
        "flash.operation_type": "upsert",
    }


def compacted_file_key(plan: RoundPlan, file_number: int) -> str:
    return f"{plan.data_prefix}/{file_number:06d}{plan.spec.content_type.extension}"


# per bucket its survivors (envelopes or ranks, one round), or the survivor map (several rounds)
Survivors = list[np.ndarray] | SurvivorMap


def _pieces(storage: Storage, plan: RoundPlan, layout: Layout, task: int, survivors: Survivors,
            kept: Mapping[int, pa.Table]) -> Iterator[pa.Table]:
    """The task's output rows in the layout's order, a unit (or a run of small delta units) at a time: the
    task never holds more than one unit's input and output beside the rows not yet written."""
    schema = schema_from_b64(plan.spec.schema_b64)
    rows_of: Callable[[list[int], list[pa.Table]], np.ndarray]  # a run's survivors, as indices into its rows
    if isinstance(survivors, SurvivorMap):  # several rounds: a bucket number per input row
        rows_of = lambda run, tables: survivors.rows_of_run(run)  # noqa: E731
    else:  # one round: each bucket's envelopes (or ranks), ascending
        bucket_ranks = [b["rank"] if b.dtype.names else b for b in survivors]
        rows_of = lambda run, tables: _rows_of_run(bucket_ranks, run, [t.num_rows for t in tables])  # noqa: E731
    piece_rows = max(1024, min(PIECE_ROWS, plan.row_group_rows // 4))
    wanted = [src for src in layout.task_groups[task] if layout.src_survivors[src]]
    columns = list(plan.spec.columns)
    read = read_units(storage, [plan.sources[src] for src in wanted if src not in kept], lambda source: columns, schema,
                      threads=plan.decodes_on_threads(len(layout.task_groups)))
    units = (kept[src] if src in kept else as_materialized(next(read), plan, schema) for src in wanted)
    for run in _delta_runs(wanted, plan):
        read_run = [next(units) for _ in run]
        if plan.sources[run[0]].prior:
            lost = layout.lost_rows(run[0])
            if len(lost):
                keep = np.ones(read_run[0].num_rows, dtype=bool)
                keep[lost] = False
                yield read_run[0].filter(mask_array(keep))
            else:
                yield read_run[0]
        else:
            yield from _taken_pieces(read_run, rows_of(run, read_run), piece_rows)  # a piece at a time
        del read_run


class _RowStream:
    """The rows of a stream of tables, handed out as tables of at most a given number of rows."""

    def __init__(self, pieces: Iterator[pa.Table]) -> None:
        self.pieces = pieces
        self.head: pa.Table | None = None
        self.rows = 0  # rows handed out

    def take(self, rows: int) -> pa.Table | None:
        """The next ``rows`` rows (fewer at the end of the stream; None once it is exhausted)."""
        parts, have = [], 0
        while have < rows:
            if self.head is None or self.head.num_rows == 0:
                self.head = next(self.pieces, None)
                if self.head is None:
                    break
                continue
            part = self.head.slice(0, rows - have)
            self.head = self.head.slice(part.num_rows)
            parts.append(part)
            have += part.num_rows
        self.rows += have
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def exhausted(self) -> bool:
        return self.take(1) is None


def _file_chunks(stream: _RowStream, rows: int, group: int) -> Iterator[pa.Table]:
    """One compacted file's rows as tables of ``group`` rows (a Parquet row group each), the last one shorter."""
    left = rows
    while left > 0:
        chunk = stream.take(min(group, left))
        if chunk is None:
            return
        left -= chunk.num_rows
        yield chunk


def materialize_task(storage: Storage, plan: RoundPlan, layout: Layout, task: int, survivors: Survivors,
                     coalesced: Mapping[int, pa.Table] | None = None) -> list[DataFile]:
    """The compacted files of materialize task ``task``; units in ``coalesced`` (read whole by hash bucket) are
    not read again.

    Rows are written as they are produced, a row group at a time (Parquet; other formats a file at a time), so
    a task holds at most one unit and one row group of output: a task may rewrite several large units."""
    expected = int(layout.task_rows[task])
    stream = _RowStream(_pieces(storage, plan, layout, task, survivors, coalesced or {}))
    out = []
    R = plan.spec.rows_per_file
    parquet = plan.spec.content_type is ContentType.PARQUET
    group = plan.row_group_rows if parquet else R
    for j in range(-(-expected // R)):
        file_number = int(layout.task_file_base[task]) + j
        metadata = output_annotations(plan, file_number) if plan.spec.content_type is not ContentType.CSV else None
        key_range = KeyRangeBuilder(plan.spec.primary_keys[0])  # recorded: a later round's probe skips by it
        chunks = key_range.watching(_file_chunks(stream, min(R, expected - j * R), group))
        first = next(chunks, None)
        if first is None:
            break
        key = compacted_file_key(plan, file_number)
        written = stream.rows
        size, checksum = write_arrow_checksummed(
            storage, key, functools.partial(_write_file, first, chunks, plan.spec.content_type, metadata)
        )
        rows = stream.rows - written + first.num_rows
        row_groups = plan.row_group_rows if parquet else 0
        out.append(DataFile(file_number, key, rows, size, plan.spec.content_type, checksum, row_group_rows=row_groups,
                            key_range=key_range.result()))
    if stream.rows != expected or not stream.exhausted():
        found = stream.rows if stream.rows != expected else f"more than {expected}"
        raise IntegrityError(f"{plan.where}: materialize task {task} read {found} rows where the recorded row counts "
                             f"promise {expected}; run flash-compactor verify")
    return out


def _write_file(first: pa.Table, rest: Iterable[pa.Table], content_type: ContentType, metadata: dict[str, str] | None,
                sink: Any) -> None:
    """One compacted file's chunks into ``sink`` (``write_arrow_checksummed`` gives the sink)."""
    write_chunks(first, rest, sink, content_type, metadata)
