"""Reading round inputs: whole files, or the Parquet row groups of one unit of a large delta file."""

from __future__ import annotations

import functools
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from flash_pipeline.catalog.files import ContentType, conform_to_schema, read_table, written_by_compactor
from flash_pipeline.catalog.model import DataFile, schema_from_b64
from flash_pipeline.catalog.parquet_footers import read_footer
from flash_pipeline.catalog.physical_names import physical_view
from flash_pipeline.catalog.schema_evolution import conform
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.model.plans import SourceFile
from flash_pipeline.compactor.runtime.memory import note_pool_thread
from flash_pipeline.errors import NotFound, SchemaConflict, UnreadableInput

# a delta file with more rows than this is split into units of about this many rows (by Parquet row groups; a
# larger group into parts that one reader streams). A materialize task holds a unit's every column decoded, so
# the unit bounds its memory: s1's 500k-row deltas (row groups of 131,072 rows) read whole in 1M-row units
# peaked at 1,153-1,187 MiB RSS in process and 1,978-2,047 MiB PSS on a warm Ray, a row group at a time at
# 1,022-1,028 and 1,901-1,926 MiB, in about the same time (4 alternating pairs in process: 4.34-4.52 s against
# 4.27-4.51 s; materialize 3.02-3.16 s against 2.99-3.07 s: more, smaller reads and takes)
UNIT_ROWS = 128 * 1024
# units smaller than this are read whole into memory and several at a time (per-file latency, not bandwidth,
# bounds small files)
SMALL_UNIT_BYTES = 4 << 20


def read_source(storage: Storage, source: SourceFile, columns: Sequence[str] | None, schema: pa.Schema | None = None,
                threads: bool = True) -> pa.Table:
    """One unit's rows. ``threads``: a large unit's columns are decoded on Arrow's thread pool (for a step with
    fewer tasks than CPUs: RoundPlan.decodes_on_threads); otherwise on the calling thread, except from an object
    store, whose column chunks are ranged GETs that the pool fetches side by side (_on_threads)."""
    threads = _on_threads(storage, threads)
    if source.group_rows:  # a part of a row group read on its own (read_units streams consecutive parts)
        return _GroupParts(storage, threads).read(source, columns, schema)
    if source.row_groups:
        return _read_row_groups(pq.ParquetFile(storage.arrow_source(source.key)), source, columns, schema, threads)
    # the recorded schema gives every format its exact types back (CSV carries none, ORC lacks some)
    large = source.bytes > SMALL_UNIT_BYTES
    return read_table(_opened(storage, source), source.content_type, columns, schema, written_by_compactor(source.key),
                      use_threads=large and threads)


def _on_threads(storage: Storage, threads: bool) -> bool:
    """Decode on Arrow's thread pool: when asked, and always from an object store (``read_ahead`` > 0), where a
    column chunk read one after another on the calling thread is a network round trip each."""
    return threads or storage.read_ahead > 0


def _read_row_groups(pf: pq.ParquetFile, source: SourceFile, columns: Sequence[str] | None, schema: pa.Schema | None,
                     threads: bool = True) -> pa.Table:
    table = pf.read_row_groups(list(source.row_groups), columns=list(columns) if columns is not None else None,
                               use_threads=threads)
    return conform_to_schema(table, schema) if schema is not None else table


def _opened(storage: Storage, source: SourceFile) -> object:
    """A small file as one buffer read whole (one GET on S3; on a local disk half the per-file cost of handing
    Arrow a path to resolve and seek in: 0.18 vs 0.31 ms a file measured on s4's 3,000 deltas); a large one as
    what Arrow reads by ranges."""
    if source.bytes <= SMALL_UNIT_BYTES:
        return pa.BufferReader(storage.read(source.key))
    return storage.arrow_source(source.key)


class _GroupParts:
    """Reads the parts of a large row group (SourceFile.group_rows) in order with one streaming reader, so a
    task that reads all of them decodes the group once and holds one part at a time: the Parquet reader
    decodes a group's pages as it goes and reads the compressed bytes through a bounded buffer. Units of whole
    row groups of one file share one opened file (read_groups)."""

    # the compressed bytes read at a time per column: on a local disk 256 KiB held 27 MiB at most decoding s5's
    # 500k-row group in 62.5k-row parts, 1 MiB 32 MiB, in the same time; an object store gets 1 MiB (a ranged
    # GET each)
    LOCAL_BUFFER_BYTES = 256 << 10
    REMOTE_BUFFER_BYTES = 1 << 20

    def __init__(self, storage: Storage, threads: bool = True) -> None:
        self.storage = storage
        self.threads = _on_threads(storage, threads)  # decode on Arrow's thread pool (read_source)
        self.at: tuple[str, tuple[int, ...], tuple[str, ...] | None] | None = None
        self.batches: Iterator[pa.RecordBatch] = iter(())
        self.position = 0  # rows of the group consumed
        self.pending: pa.Table | None = None
        self.file: tuple[str, pq.ParquetFile] | None = None  # the last file read_groups opened

    def _open(self, source: SourceFile, columns: tuple[str, ...] | None) -> None:
        buffer = self.REMOTE_BUFFER_BYTES if self.storage.read_ahead > 0 else self.LOCAL_BUFFER_BYTES
        pf = pq.ParquetFile(self.storage.arrow_source(source.key), buffer_size=buffer, pre_buffer=False)
        groups = list(source.row_groups)
        rows = sum(pf.metadata.row_group(g).num_rows for g in groups if g < pf.metadata.num_row_groups)
        if rows != source.group_rows:
            raise UnreadableInput(
                f"{source.key}: row groups {groups} hold {rows} rows but its manifest's split says "
                f"{source.group_rows}; was the file replaced after it was committed?", key=source.key,
                position=source.position, prior=source.prior)
        self.at = (source.key, source.row_groups, columns)
        # a batch a part: smaller batches would need concatenating (a take from a many-chunk table was 20x
        # slower), and decoding s5's 500k-row group in 125k-row batches held 27 MiB at most, in 32k-row ones
        # concatenated 45 MiB, and took no less time
        self.batches = pf.iter_batches(batch_size=max(1, source.rows), row_groups=groups,
                                       columns=list(columns) if columns is not None else None, use_threads=self.threads)
        self.position, self.pending = 0, None

    def _take(self, source: SourceFile, rows: int) -> pa.Table:
        """The next ``rows`` rows of the open group."""
        parts, have = [], 0
        while have < rows:
            if self.pending is None:
                batch = next(self.batches, None)
                if batch is None:  # the group ended early: the file changed under the plan
                    raise UnreadableInput(
                        f"{source.key}: row groups {list(source.row_groups)} end after {self.position + have} rows but "
                        f"its manifest's split says {source.group_rows}; was the file replaced after it was committed?",
                        key=source.key, position=source.position, prior=source.prior)
                self.pending = pa.Table.from_batches([batch])
            need = rows - have
            if self.pending.num_rows <= need:
                parts.append(self.pending)
                have += self.pending.num_rows
                self.pending = None
            else:
                parts.append(self.pending.slice(0, need))
                self.pending = self.pending.slice(need)
                have = rows
        self.position += rows
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()

    def read_groups(self, source: SourceFile, columns: Sequence[str] | None, schema: pa.Schema | None) -> pa.Table:
        """A unit of whole row groups, from the file the previous such unit opened when it is the same one: a
        large file's units follow each other, and its footer is read (on S3 fetched) once, not once a unit."""
        if self.file is None or self.file[0] != source.key:
            self.file = (source.key, pq.ParquetFile(self.storage.arrow_source(source.key)))
        return _read_row_groups(self.file[1], source, columns, schema, self.threads)

    def read(self, source: SourceFile, columns: Sequence[str] | None, schema: pa.Schema | None) -> pa.Table:
        wanted = tuple(columns) if columns is not None else None
        if self.at != (source.key, source.row_groups, wanted) or source.skip < self.position:
            self._open(source, wanted)
        if source.skip > self.position:
            self._take(source, source.skip - self.position)  # decoded and dropped: a task starting mid-group
        table = self._take(source, source.rows)
        return conform_to_schema(table, schema) if schema is not None else table


def read_unit(storage: Storage, source: SourceFile, columns: Sequence[str], schema: pa.Schema,
              parts: _GroupParts | None = None, threads: bool = True) -> pa.Table:
    """``read_source`` that also checks the unit's row count against its manifest: rows are addressed by their
    index in the unit, so a file replaced after it was committed must stop the round, not shift rows. A file
    that cannot be read as its manifest says raises UnreadableInput naming it (the job names the fix)."""
    wanted, logical = columns, None
    if source.schema_b64:  # written under an older schema of the stream: read what it has, as recorded
        recorded = _schema(source.schema_b64)
        wanted, session, schema = [c for c in columns if c in recorded.names], schema, recorded
        view = physical_view(recorded)
        if view is not None:  # and under older column names (evolve --rename/--drop): read those
            schema, logical = view
            by_logical = {v: k for k, v in logical.items()}
            wanted = [by_logical[c] for c in wanted]
    try:
        if parts is not None and source.group_rows:
            table = parts.read(source, wanted, schema)
        elif parts is not None and source.row_groups:
            table = parts.read_groups(source, wanted, schema)
        else:
            table = read_source(storage, source, wanted, schema, threads)
        if table.num_rows != source.rows:
            check_unit_rows(source, table.num_rows)
        present = set(table.column_names)  # built once: the property builds a list per call (wide tables)
        missing = [c for c in wanted if c not in present]
        if missing:  # a file replaced by one of another schema: Arrow reads it, and the step would fail on a column
            raise UnreadableInput(f"{source.key}: has no column(s) {missing} that its manifest records; was the file "
                                  "replaced after it was committed?", key=source.key, position=source.position,
                                  prior=source.prior)
        if logical is not None:
            table = table.rename_columns([logical.get(n, n) for n in table.column_names])
        if source.schema_b64:
            table = conform(table, session, columns)
    except CONTENT_ERRORS as exc:
        raise unreadable(source.key, exc, source.position, source.prior) from None
    return table


@functools.lru_cache(maxsize=64)
def _schema(b64: str) -> pa.Schema:
    return schema_from_b64(b64)


# what a file's content (not the disk or the store) raises when read as its manifest says: an I/O error (OSError,
# an S3 outage) is not the file's fault and stays as it is; KeyError is a recorded column the file lacks
CONTENT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, pa.ArrowKeyError, KeyError, NotFound,
                  SchemaConflict)


def unreadable(key: str, exc: BaseException, position: int, prior: bool) -> UnreadableInput:
    """The UnreadableInput of file ``key`` for a content error, its reason on one line (the key said once)."""
    reason = " ".join(str(exc).split()).strip("'\"")
    if reason.startswith(key):
        reason = reason[len(key):].lstrip(": ")
    return UnreadableInput(f"{key}: {reason}", key=key, position=position, prior=prior)


def check_unit_rows(source: SourceFile, rows: int) -> None:
    """A one-line error when a unit read back holds other than its manifest's row count."""
    if rows != source.rows:
        manifest = "compacted version" if source.prior else "delta"
        raise UnreadableInput(
            f"{source.key}: holds {rows} rows but its {manifest} manifest says {source.rows}; "
            "was the file replaced after it was committed?", key=source.key, position=source.position,
            prior=source.prior)


def read_units(storage: Storage, sources: Sequence[SourceFile], columns: Callable[[SourceFile], Sequence[str]],
               schema: pa.Schema, threads: bool = True) -> Iterator[pa.Table]:
    """``read_unit`` of each source, in order; small units are read up to ``storage.read_ahead`` at a time on
    threads.

    Thousands of small deltas cost a round their per-file latency, which one reader pays serially; on an object
    store that is a network round trip per file, which a bounded read-ahead overlaps while holding at most
    ``read_ahead`` small tables beyond the one being used. A local disk has no such latency (its storage says
    ``read_ahead = 0``): there the threads only fight the step's own thread for the GIL. Large units are read
    one at a time. ``columns`` gives the columns to read of each source (deletes carry only the keys);
    ``threads``: see read_source."""
    read_ahead = storage.read_ahead
    parts = _GroupParts(storage, threads)  # parts of one row group: read in order by one stream, never ahead
    if read_ahead <= 0 or sum(1 for s in sources if _small(s)) < 2:
        for source in sources:
            yield read_unit(storage, source, columns(source), schema, parts, threads)
        return
    with ThreadPoolExecutor(max_workers=read_ahead, thread_name_prefix="flash-read",
                            initializer=note_pool_thread) as pool:
        pending: deque[Future[pa.Table] | SourceFile] = deque()
        it = iter(sources)

        def top_up() -> None:
            while len(pending) < read_ahead:
                source = next(it, None)
                if source is None:
                    return
                pending.append(pool.submit(read_unit, storage, source, columns(source), schema) if _small(source)
                               else source)

        top_up()
        while pending:
            head = pending.popleft()
            table = (head.result() if isinstance(head, Future)
                     else read_unit(storage, head, columns(head), schema, parts, threads))
            top_up()
            yield table


# (row groups, rows, approx bytes at rest, first row, rows of the row group it is a part of, rows of it before)
UnitSpan = tuple[tuple[int, ...], int, int, int, int, int]


def _small(source: SourceFile) -> bool:
    """Whether read_units may read ``source`` ahead on a thread: a small unit, not a part of a row group."""
    return source.bytes <= SMALL_UNIT_BYTES and not source.group_rows


def split_units(storage: Storage, f: DataFile, unit_rows: int = UNIT_ROWS) -> list[UnitSpan]:
    """The units of a file, none of more than ``unit_rows`` rows: runs of whole row groups of a large Parquet
    file, each row group larger than ``unit_rows`` cut into parts of about equal rows; one unit otherwise.

    A file whose manifest records its row groups' size (``row_group_rows``: the compactor wrote it) is split
    without opening it; any other file's footer is read. Parts of a row group bound what a task holds at once:
    a 500k-row group is ~80 MiB decoded, most of a small budget (scenario s5); one reader streams the parts
    (read_units), so the group is still decoded once."""
    whole: list[UnitSpan] = [((), f.rows, f.bytes, 0, 0, 0)]
    if f.content_type is not ContentType.PARQUET or f.rows <= unit_rows:
        return whole
    if f.row_group_rows > 0:
        return _parts(_uniform_units(f, unit_rows), unit_rows)
    meta = read_footer(storage, f.key, f.bytes)
    sizes = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
    units = _runs([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], sizes, unit_rows)
    scale = f.bytes / max(1, sum(sizes))  # row group sizes are uncompressed: scale to bytes at rest
    return _parts([(g, r, int(b * scale), s, 0, 0) for g, r, b, s, _, _ in units], unit_rows)


def _runs(group_rows: list[int], group_bytes: list[int], unit_rows: int) -> list[UnitSpan]:
    """Consecutive row groups in runs of at most ``unit_rows`` rows (a larger group alone)."""
    units: list[UnitSpan] = []
    groups: list[int] = []
    rows = size = start = 0
    for g, (n, b) in enumerate(zip(group_rows, group_bytes)):
        if groups and rows + n > unit_rows:
            units.append((tuple(groups), rows, size, start, 0, 0))
            start += rows
            groups, rows, size = [], 0, 0
        groups.append(g)
        rows += n
        size += b
    if groups:
        units.append((tuple(groups), rows, size, start, 0, 0))
    return units


def _parts(units: list[UnitSpan], unit_rows: int) -> list[UnitSpan]:
    """``units`` with each single row group of more than ``unit_rows`` rows cut into parts of about equal rows."""
    out: list[UnitSpan] = []
    for groups, rows, size, start, _, _ in units:
        if len(groups) != 1 or rows <= unit_rows:
            out.append((groups, rows, size, start, 0, 0))
            continue
        n = -(-rows // unit_rows)
        step = -(-rows // n)
        for skip in range(0, rows, step):
            part = min(step, rows - skip)
            out.append((groups, part, size * part // rows, start + skip, rows, skip))
    return out


def _uniform_units(f: DataFile, unit_rows: int) -> list[UnitSpan]:
    """split_units of a file whose row groups hold ``f.row_group_rows`` rows each but the last: the same runs
    of row groups the footer would give, bytes in proportion to rows."""
    size = f.row_group_rows
    groups = max(1, -(-f.rows // size))
    rows = [size] * (groups - 1) + [f.rows - size * (groups - 1)]
    return [(g, r, f.bytes * r // max(1, f.rows), s, 0, 0) for g, r, _, s, _, _ in _runs(rows, rows, unit_rows)]
