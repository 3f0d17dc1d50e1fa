"""Small-file compaction (Delta Lake's OPTIMIZE): pack a partition stream's small files into bigger ones.

What is packed, per partition stream (docs/optimize-and-read.md has the full description):

* a stream with a compacted version that has primary keys: the compacted version's files. The rewrite is a
  new compacted stream version with the same rows, the same ``last_position`` and a primary key index whose
  pointers are remapped from the old index (no table data is hashed): when a bin concatenates files
  ``a, b, c`` into file ``n``, the pointer ``(b, r)`` becomes ``(n, rows(a) + r)``.
* a stream without primary keys (never compacted, or only ever optimized): the latest compacted version's
  files (if any) plus the files of the upsert deltas committed after it, up to the last delta listed when the
  run starts (it stops before the first delete delta: deletes need primary keys). The new version holds all
  those rows and its ``last_position`` is the last delta packed; deltas appended while it runs stay pending.

Planning is Delta's ``groupFilesIntoBins``: files smaller than ``min_file_size`` sorted by size (ties by their
order in the version) are packed greedily into bins whose total stays within ``max_file_size``; a bin of one
file is left alone. A pure rewrite is committed with ``data_change=False`` (a rearrangement: a consumer of changes
since a position skips it); a version that absorbed deltas holds rows no earlier version held, so it is
``data_change=True`` (see ``_data_change``). A bin's planned size (the sum of its inputs) is remembered in the version's
stats and used as that file's size by the next run, so a second run right after the first changes nothing even
though Parquet usually writes the merged file a little smaller than the sum of its inputs.

Commits race like compaction rounds (flash_pipeline/catalog/commits.py): the rewrite commits exactly the version
after the one it planned on; if a compaction or another optimize commits that number first, this attempt's
files are removed and the partition is re-planned on the new latest version (bounded; then CommitConflict).
"""

from __future__ import annotations

import functools
import sys
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.checksums import write_arrow_checksummed
from flash_pipeline.catalog.commits import Attempt, retry_on_moved_base
from flash_pipeline.catalog.deletion_vectors import drop_dead_rows
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType, schema_to_json, write_table
from flash_pipeline.catalog.key_ranges import key_range_of
from flash_pipeline.catalog.model import DELETE, CompactedVersion, DataFile, Delta, schema_to_b64
from flash_pipeline.catalog.schema_evolution import same_columns
from flash_pipeline.errors import FlashError, InternalError
from flash_pipeline.index_remap import remap_index

if TYPE_CHECKING:  # imported where it is used, as the other planner helpers are
    from flash_pipeline.compactor.planning.keys import CompactedInto

from flash_pipeline.packing import (  # noqa: F401 - the results are part of this module's API
    DEFAULT_MAX_FILE_SIZE,
    DEFAULT_MIN_FILE_SIZE,
    ROW_GROUP_ROWS,
    BinPlan,
    OptimizeResult,
    PartitionOptimizeResult,
    check_sizes,
    plan_bins,
    with_purges,
)


# ----- running -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Input:
    """One file the new version will hold, kept or packed."""

    file: DataFile
    planned_bytes: int  # the size the planner uses (a packed file's inputs' total)


def optimize(
    catalog: Catalog | str,
    table_id: str,
    partitions: Sequence[Any] | None = None,
    min_file_size: int = DEFAULT_MIN_FILE_SIZE,
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    progress: Callable[[str], None] | None = None,
    _before_commit: Callable[[PartitionKeys], None] | None = None,
) -> OptimizeResult:
    """Pack the small files of every (or the named) partition stream of ``table_id``; see the module doc.

    ``table_id`` is the table holding the compacted versions (the source table unless compaction used a
    destination). Re-plans a partition when a concurrent writer took its version number; raises CommitConflict
    (exit 3) when that keeps happening (running again is safe).
    """
    started = time.perf_counter()
    say = progress or (lambda message: print(message, file=sys.stderr))
    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    check_sizes(min_file_size, max_file_size)
    parts = cat.chosen_partitions(table_id, partitions)
    result = OptimizeResult(table_id, int(min_file_size), int(max_file_size))
    from flash_pipeline.compactor.planning.keys import CompactedInto, sibling_keys_once

    compacted_into = CompactedInto(cat, table_id)  # a source compacted elsewhere: asked for a few partitions at most
    with sibling_keys_once(cat):  # the table's keys looked up once for its unkeyed partitions, not once each
        for part in parts:
            res = retry_on_moved_base(
                lambda: _skipping_late(part, lambda: optimize_partition(cat, table_id, part, min_file_size,
                                                                        max_file_size, _before_commit, compacted_into)),
                f"optimize {table_id} [{format_partition(part)}]", say,
            )
            say(f"{table_id} [{res.describe()}]")
            result.partitions.append(res)
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class _Gathered:
    """What one partition's optimize packs: the prior version's files (if kept) and the deltas it absorbs."""

    prior: CompactedVersion | None
    keyed: bool
    source_table: str
    stream_version: int | None
    inputs: list[_Input]
    absorbed: list[Delta]


@dataclass
class _Packed:
    """The new version's files, and where each input's rows went (for the index remap)."""

    files: list[DataFile]
    planned: dict[str, int]  # a packed file's key -> its inputs' planned total
    target: np.ndarray  # input index -> new file number
    offset: np.ndarray  # input index -> row offset in that file
    dead: dict[int, np.ndarray]  # old file number -> rows its deletion vector dropped (binned files)


def optimize_partition(
    cat: Catalog,
    table_id: str,
    part: PartitionKeys,
    min_file_size: int,
    max_file_size: int,
    before_commit: Callable[[PartitionKeys], None] | None = None,
    compacted_into: "CompactedInto | None" = None,
) -> PartitionOptimizeResult:
    """One partition's optimize (see optimize); raises _CompactedElsewhere when, just before an unkeyed commit,
    the partition is found compacted into another table (optimize turns that into a skipped result)."""
    res = PartitionOptimizeResult(part, "nothing-to-do")
    cat.settle_compacted(table_id, part)  # a Delta commit whose writer died: completed before planning
    got = _gather(cat, table_id, part, res, compacted_into)
    if got is None:
        return res
    prior, inputs, absorbed = got.prior, got.inputs, got.absorbed
    plan = with_purges(plan_bins([i.planned_bytes for i in inputs], min_file_size, max_file_size),
                       [i.file for i in inputs])
    res.files_considered = plan.considered
    res.files_skipped = plan.skipped
    if not plan.bins:
        res.notes.append(f"{plan.candidates} file(s) below the minimum size, no bin of two or more")
        return res

    base_version = cat.latest_version_number(table_id, part) if prior is None else prior.version
    attempt = f"{base_version + 1:010d}-{uuid.uuid4().hex[:12]}"
    data_prefix = f"{cat.deltalake_root(table_id, part)}/{attempt}"
    index_prefix = f"{cat.compacted_prefix(table_id, part)}/index/{attempt}"
    schema, content_type = _version_schema(cat, got)
    # files are removed on failure only when this attempt is known not to be committed (see Attempt)
    with Attempt(cat, table_id, part, base_version, lambda: _remove_prefixes(cat, data_prefix, index_prefix)) as txn:
        packed = _pack(cat, got, plan, schema, content_type, data_prefix, res)
        index = None
        if prior is not None and prior.index is not None:
            index = remap_index(cat, prior, [i.file.file_number for i in inputs], packed.target, packed.offset,
                                index_prefix, packed.dead)
        stats = {
            "optimize": {
                "min_file_size": int(min_file_size),
                "max_file_size": int(max_file_size),
                "bins": [[inputs[k].file.key for k in b] for b in plan.bins],
                "files_considered": plan.considered,
                "files_skipped": plan.skipped,
                "files_removed": res.files_removed.to_json(),
                "files_added": res.files_added.to_json(),
                "deltas_absorbed": [d.position for d in absorbed],
                "planned_bytes": packed.planned,
            }
        }
        new = _new_version(table_id, part, got, base_version + 1, schema, content_type,
                           dict(files=tuple(packed.files), index=index, stats=stats))
        if not got.keyed:  # asked again, afresh: a compaction into another table may have committed since planning
            from flash_pipeline.compactor.planning.keys import CompactedInto

            late = CompactedInto(cat, table_id).of(part)
            if late is not None:
                raise _CompactedElsewhere(late)  # the attempt's files are removed (never sent)
        if before_commit is not None:
            before_commit(part)
        txn.commit(new)
    res.status = "optimized"
    res.compacted_version = new.version
    res.last_position = new.last_position
    res.bins = len(plan.bins)
    res.deltas_absorbed = len(absorbed)
    res.data_change = new.data_change
    return res


def _gather(cat: Catalog, table_id: str, part: PartitionKeys, res: PartitionOptimizeResult,
            compacted_into: "CompactedInto | None") -> _Gathered | None:
    """The files to pack, or None when there is nothing to do (``res`` then says why)."""
    prior = cat.latest_compacted(table_id, part)
    keyed = prior is not None and bool(prior.primary_keys)
    from flash_pipeline.compactor.planning.keys import CompactedInto, keys_of_another_partition

    if not keyed and prior is None:
        sibling = keys_of_another_partition(cat, table_id, part)
        if sibling is not None:  # keys are the table's: packing its raw upserts would publish duplicate keys
            res.status = "skipped"
            res.notes.append(f"not compacted yet, and the table's keys ({', '.join(sibling.primary_keys)}, recorded by "
                             f"[{format_partition(sibling.partition)}]) apply to it: compact it first")
            return None
    # also over an unkeyed version of its own: optimize packed it before the source was compacted elsewhere
    if not keyed:
        elsewhere = (compacted_into or CompactedInto(cat, table_id)).of(part)
        # a source compacted into another table: its deltas are upserts of keys recorded there
        if elsewhere is not None:
            _skipped_for(res, elsewhere)
            return None
    got = _Gathered(prior, keyed, prior.source_table_id if prior is not None else table_id,
                    prior.source_stream_version if prior is not None else None, [], [])
    if prior is not None:
        stream = cat.active_stream(prior.source_table_id, part)
        if not keyed and (stream is None or stream.version != prior.source_stream_version):
            got.prior = prior = None  # an unkeyed version of an older stream: start over from the active stream
    if prior is not None:
        planned = dict((prior.stats.get("optimize") or {}).get("planned_bytes", {}))
        got.inputs = [_Input(f, max(f.bytes, int(planned.get(f.key, 0))))
                      for f in sorted(prior.files, key=lambda f: f.file_number)]
    if not keyed:
        return _absorb_deltas(cat, part, got, res)
    return got


def _absorb_deltas(cat: Catalog, part: PartitionKeys, got: _Gathered, res: PartitionOptimizeResult) -> _Gathered | None:
    """An unkeyed optimize's inputs: the upsert deltas after ``got.prior``, up to the first delete delta or the
    first whose columns differ (schema evolution needs a compaction)."""
    stream = cat.active_stream(got.source_table, part)
    if stream is None:
        res.status = "skipped"
        res.notes.append("no active partition stream")
        return None
    prior, absorbed = got.prior, got.absorbed
    got.stream_version = stream.version
    after = prior.last_position if prior is not None else None
    for d in cat.deltas(got.source_table, part, stream.version, after_position=after):
        if d.operation == DELETE:
            res.notes.append(
                f"stopped before the delete delta at position {d.position}: deletes need primary keys, compact the "
                "stream"
            )
            break
        first = prior if prior is not None and prior.arrow_schema else (absorbed[0] if absorbed else None)
        if (first is not None and first.arrow_schema and d.arrow_schema
                and not same_columns(first.pa_schema(), d.pa_schema())):
            res.notes.append(f"stopped before the delta at position {d.position}: its columns differ from the "
                             "version's (schema evolution); compact the stream to take them on")
            break
        absorbed.append(d)
        got.inputs.extend(_Input(f, f.bytes) for f in sorted(d.files, key=lambda f: f.file_number))
    if prior is None and not absorbed:
        res.status = "skipped" if res.notes else "nothing-to-do"
        return None
    return got


def _version_schema(cat: Catalog, got: _Gathered) -> tuple[pa.Schema | None, ContentType]:
    """The new version's schema and file format: the prior version's, else the first absorbed delta's."""
    prior, absorbed = got.prior, got.absorbed
    if prior is not None and prior.arrow_schema:
        return prior.pa_schema(), prior.content_type
    schema = None
    if absorbed:
        schema = absorbed[0].pa_schema() if absorbed[0].arrow_schema else cat.read_file(absorbed[0].files[0]).schema
    return schema, prior.content_type if prior is not None else ContentType.PARQUET


def _pack(cat: Catalog, got: _Gathered, plan: BinPlan, schema: pa.Schema | None, content_type: ContentType,
          data_prefix: str, res: PartitionOptimizeResult) -> _Packed:
    """Keep the unbinned inputs as they are and write each bin as one file (dead rows purged)."""
    inputs, prior = got.inputs, got.prior
    binned = {i for b in plan.bins for i in b}
    out = _Packed([], {}, np.zeros(len(inputs), dtype=np.int64), np.zeros(len(inputs), dtype=np.int64), {})
    for k in (k for k in range(len(inputs)) if k not in binned):
        f = inputs[k].file
        out.files.append(replace(f, file_number=len(out.files) + 1))
        out.target[k] = len(out.files)
        if inputs[k].planned_bytes != f.bytes:
            out.planned[f.key] = inputs[k].planned_bytes
    for b in plan.bins:
        number = len(out.files) + 1
        tables = []
        rows = 0
        for k in b:
            f = inputs[k].file
            # inputs: the prior version's files, then absorbed deltas'
            committed = prior is not None and k < len(prior.files)
            # damage, if it cannot be read
            with cat.committed_file(prior, f) if committed and prior is not None else nullcontext():
                gone = cat.dead_rows(f)  # a deletion vector's dead rows are purged here (read once)
                t = drop_dead_rows(cat.read_file(f, schema=schema), gone)
            if t.num_rows != f.live_rows:
                raise FlashError(f"{f.key} holds {t.num_rows} live rows but its manifest says {f.live_rows}: the lake "
                                 "is inconsistent")
            if len(gone):
                out.dead[f.file_number] = gone
            if schema is not None:
                t = t.select([n for n in schema.names]).cast(schema)
            tables.append(t)
            out.target[k], out.offset[k] = number, rows
            rows += f.live_rows
            res.files_removed.add(f.bytes)
        merged = pa.concat_tables(tables)
        key = f"{data_prefix}/{number:06d}{content_type.extension}"
        size, checksum = write_arrow_checksummed(cat.storage, key,
                                                 functools.partial(_write_merged, merged, content_type))
        out.files.append(DataFile(number, key, merged.num_rows, size, content_type, checksum,
                                  row_group_rows=ROW_GROUP_ROWS if content_type is ContentType.PARQUET else 0,
                                  key_range=key_range_of(merged, prior.primary_keys if prior else ())))
        out.planned[key] = sum(inputs[k].planned_bytes for k in b)
        res.files_added.add(size)
    return out


def _new_version(table_id: str, part: PartitionKeys, got: _Gathered, version: int, schema: pa.Schema | None,
                 content_type: ContentType, parts: dict[str, Any]) -> CompactedVersion:
    """The rewrite's compacted version: the prior one with new files (and absorbed deltas), or a first unkeyed one."""
    prior, absorbed, stream_version = got.prior, got.absorbed, got.stream_version
    common: dict[str, Any] = dict(version=version, commit_id=uuid.uuid4().hex, created_at=time.time(),
                                  data_change=_data_change(absorbed), **parts)
    if prior is not None:
        return prior.replace(
            last_position=absorbed[-1].position if absorbed else prior.last_position,
            source_stream_version=stream_version if stream_version is not None else prior.source_stream_version,
            **common,
        )
    if schema is None or stream_version is None:
        raise InternalError(f"{table_id}: an unkeyed optimize without a schema or stream version")
    return CompactedVersion(
        table_id=table_id,
        partition=part,
        source_table_id=got.source_table,
        source_stream_version=stream_version,
        last_position=absorbed[-1].position,
        primary_keys=(),
        sort_keys=(),
        content_type=content_type,
        schema=tuple(schema_to_json(schema)),
        arrow_schema=schema_to_b64(schema),
        **common,
    )


class _CompactedElsewhere(Exception):
    """Raised inside an unkeyed optimize's attempt when the partition turned out to be compacted into another table."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def _skipping_late(part: PartitionKeys, run: Callable[[], PartitionOptimizeResult]) -> PartitionOptimizeResult:
    """``run()``, or a skipped result when it found the partition compacted into another table just before its
    commit (its attempt's files were removed: nothing of it stays)."""
    try:
        return run()
    except _CompactedElsewhere as late:
        return _skipped_for(PartitionOptimizeResult(part, "skipped"), late.holder)


def _skipped_for(res: PartitionOptimizeResult, elsewhere: str) -> PartitionOptimizeResult:
    res.status = "skipped"
    res.notes.append(f"its deltas are compacted with primary keys into {elsewhere}; packing them raw would "
                     f"publish duplicate keys: optimize {elsewhere} instead")
    return res


def _data_change(absorbed: Sequence[Delta]) -> bool:
    """Whether the new version changes the table's rows: only when it absorbed deltas (new rows; Delta's
    ``dataChange=false`` promises the rows were already in the table, so streaming readers would skip them)."""
    return bool(absorbed)


def _remove_prefixes(cat: Catalog, *prefixes: str) -> None:
    for prefix in prefixes:
        cat.storage.delete_prefix(prefix)


def _write_merged(table: pa.Table, content_type: ContentType, sink: Any) -> None:
    write_table(table, sink, content_type, row_group_size=ROW_GROUP_ROWS)
