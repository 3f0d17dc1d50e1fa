"""Step 3, materialize: read only surviving rows (all columns) of each source file and write compacted files.

A prior compacted unit that lost rows keeps the rest in their order (a filter by the layout's lost rows); a
delta file's survivors come from the dedupe output, bucket by bucket."""

from __future__ import annotations

import json
from bisect import bisect_left
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flash_pipeline.catalog.files import ContentType, conform_to_schema, write_table
from flash_pipeline.catalog.model import DataFile, schema_from_b64, write_arrow_checksummed
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.kernels.layout import Layout
from flash_pipeline.compactor.model.plans import ROW_BITS, RoundPlan, SourceFile, row_of, src_of
from flash_pipeline.compactor.steps.hash_bucket import as_materialized
from flash_pipeline.compactor.steps.source_io import SMALL_UNIT_BYTES, check_unit_rows, read_units
from flash_pipeline.errors import IntegrityError


def _rows_of_run(bucket_ranks: list[np.ndarray], srcs: list[int], sizes: list[int]) -> np.ndarray:
    """Indices into the concatenation of the delta units ``srcs`` (ascending, ``sizes`` rows each) of their
    survivors in the layout's order: unit by unit, and within a unit bucket by bucket, ascending.

    One vectorized pass for a run of units instead of a bisect and a take per unit: thousands of small deltas
    cost a take each otherwise (0.75 s of sampled thread time, GIL waits included, for s4's 2,881 units). ``bucket_ranks`` may be strided
    field views: a Python bisect reads ~40 elements where np.searchsorted would copy the whole view."""
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


def _take_rows(units: list[pa.Table], rows: pa.Array) -> pa.Table:
    """``rows`` of the concatenation of ``units`` (same schema): one take on the chunked table, which copies
    only the rows taken. Concatenating each column first copied every row of the run (s4's 2,881 units,
    876,000 rows, 39% taken: 0.10 s against 0.055 s a call once warm, and 0.25-0.41 s against 0.08-0.39 s as a
    process's first, where this VM charges for every page first touched)."""
    if len(units) == 1:
        return units[0].take(rows)
    return pa.concat_tables(units).take(rows)


def _read_by_column(plan: RoundPlan, source: SourceFile) -> bool:
    """Whether materialize reads ``source`` a column at a time: a Parquet unit with more rows than a task's share
    of the round budget (``plan.materialize_rows``), which happens when one row group is larger than that share
    (s5's deltas: one 500k-row group each, ~80 MiB decoded, against a 100 MiB budget shared by the tasks)."""
    return source.content_type is ContentType.PARQUET and source.rows > plan.materialize_rows


def _select_by_column(storage: Storage, plan: RoundPlan, source: SourceFile, schema: pa.Schema,
                      select: Callable[[pa.ChunkedArray], pa.ChunkedArray] | None) -> pa.Table:
    """The rows ``select`` keeps of a large unit, reading and selecting one column at a time: the task holds
    its output and one decoded column of the unit, not the whole unit beside its output."""
    pf = pq.ParquetFile(storage.arrow_source(source.key))
    groups = list(source.row_groups) or list(range(pf.num_row_groups))
    selected = []
    for name in plan.spec.columns:
        column = pf.read_row_groups(groups, columns=[name], use_threads=False)
        if column.num_rows != source.rows:
            check_unit_rows(source, column.num_rows)
        column = conform_to_schema(column, schema).column(0)
        selected.append(column if select is None else select(column))
        del column
    return as_materialized(pa.Table.from_arrays(selected, names=list(plan.spec.columns)), plan, schema)


def _delta_runs(wanted: list[int], plan: RoundPlan) -> list[list[int]]:
    """``wanted`` split into runs: consecutive small delta units together (their concatenation is a copy of a
    few MiB each), every other unit alone (a large one is taken from directly, as one copy; one read by column
    too, even when its bytes are few)."""
    def joins(src: int) -> bool:
        source = plan.sources[src]
        return not source.prior and source.bytes <= SMALL_UNIT_BYTES and not _read_by_column(plan, source)

    runs: list[list[int]] = []
    for src in wanted:
        if runs and joins(src) and joins(runs[-1][-1]):
            runs[-1].append(src)
        else:
            runs.append([src])
    return runs


def annotations(plan: RoundPlan, file_number: int) -> dict[str, str]:
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


def materialize_task(storage: Storage, plan: RoundPlan, layout: Layout, task: int, survivors: list[np.ndarray],
                     coalesced: Mapping[int, pa.Table] | None = None) -> list[DataFile]:
    """The compacted files of materialize task ``task``; units in ``coalesced`` (read whole by hash bucket) are
    not read again."""
    schema = schema_from_b64(plan.spec.schema_b64)
    kept = coalesced or {}
    tables = []
    # survivors per bucket: envelopes (one round) or their ranks alone (several rounds)
    bucket_ranks = [bucket_rows["rank"] if bucket_rows.dtype.names else bucket_rows for bucket_rows in survivors]
    wanted = [src for src in layout.task_groups[task] if layout.src_survivors[src]]
    columns = list(plan.spec.columns)
    by_column = {src for src in wanted if src not in kept and _read_by_column(plan, plan.sources[src])}
    read = read_units(storage, [plan.sources[src] for src in wanted if src not in kept and src not in by_column],
                      lambda source: columns, schema)
    units = (kept[src] if src in kept else None if src in by_column else as_materialized(next(read), plan, schema) for src in wanted)
    for run in _delta_runs(wanted, plan):
        read_run = [next(units) for _ in run]
        source = plan.sources[run[0]]
        if source.prior:
            lost = layout.lost_rows(run[0])
            keep = None
            if len(lost):
                keep = np.ones(source.rows, dtype=bool)
                keep[lost] = False
                keep = pa.array(keep)
            if read_run[0] is None:
                tables.append(_select_by_column(storage, plan, source, schema, None if keep is None else (lambda c, k=keep: c.filter(k))))
            else:
                tables.append(read_run[0] if keep is None else read_run[0].filter(keep))
        elif read_run[0] is None:  # a large unit (always a run of its own)
            rows = pa.array(_rows_of_run(bucket_ranks, run, [source.rows]))
            tables.append(_select_by_column(storage, plan, source, schema, lambda c: c.take(rows)))
        else:
            rows = _rows_of_run(bucket_ranks, run, [t.num_rows for t in read_run])
            tables.append(_take_rows(read_run, pa.array(rows)))
    expected = int(layout.task_rows[task])
    if not tables:
        if expected:
            raise IntegrityError(f"{plan.where}: materialize task {task} found no rows where the recorded row counts promise {expected}; run flash-compactor verify")
        return []
    result = pa.concat_tables(tables)
    if result.num_rows != expected:
        raise IntegrityError(f"{plan.where}: materialize task {task} read {result.num_rows} rows where the recorded row counts promise {expected}; run flash-compactor verify")
    out = []
    R = plan.spec.rows_per_file
    for j, start in enumerate(range(0, result.num_rows, R)):
        file_number = int(layout.task_file_base[task]) + j
        chunk = result.slice(start, R)
        if plan.spec.content_type is not ContentType.CSV:
            chunk = chunk.replace_schema_metadata(annotations(plan, file_number))
        key = compacted_file_key(plan, file_number)
        size, checksum = write_arrow_checksummed(
            storage, key, lambda sink, c=chunk: write_table(c, sink, plan.spec.content_type, row_group_size=plan.row_group_rows)
        )
        row_groups = plan.row_group_rows if plan.spec.content_type is ContentType.PARQUET else 0
        out.append(DataFile(file_number, key, chunk.num_rows, size, plan.spec.content_type, checksum, row_group_rows=row_groups))
    return out
