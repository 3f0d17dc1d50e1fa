"""Lake verification: does storage hold what the committed documents say it holds?

A compacted version or delta manifest records, for every file it references, the key, size, row count and a
content checksum taken at commit (``model.DataFile.checksum``, ``model.IndexFile.checksum``). Files are never
rewritten in place, so any difference means a file was lost, truncated or replaced after its commit: readers
would silently get wrong rows, and the primary key index would point at the wrong rows. ``verify`` reads every
file of the latest (or every retained) compacted version and of every delta not yet compacted once, and
reports each damaged file as one line naming table, partition, version and key.

Checks per data file: present, size, checksum (when recorded), row count from the file's own footer (Parquet,
ORC metadata; Feather batch lengths; CSV parsed). Per index file: present, size, checksum, rows = size / row
width. Per index version: every pointer names a file of the version and a row inside it, no two rows point at
the same row, each row sits in the bucket its digest hashes to, and the index has one row per compacted row.
Per published version: its Delta table at that version, replayed by deltalake, holds exactly the version's files,
and its Iceberg snapshot's position delete files (one per deletion vector) exist.

``unchanged_since`` (a version verified before) skips reading the files unchanged since it (verify_scope.py); each
is still looked up for its recorded size, so one deleted or replaced since is found.

The compactor also checks, cheaply, before it commits a round: every prior file it carries by reference still
has its recorded size (compactor/carried_files.py's ``check_carried``, one HEAD/stat per file).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.checksums import checksum_of
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.model import DEPRECATED, CompactedVersion, DataFile
from flash_pipeline.errors import IntegrityError, InternalError, NotFound
from flash_pipeline.file_facts import FileFacts, data_facts, file_findings, key_range_findings, row_group_findings
from flash_pipeline.verify_scope import index_files_to_read, unchanged_data_keys

if TYPE_CHECKING:
    pass

IO_THREADS = 8  # files are fetched concurrently: S3 GETs are latency-bound; hashing and footers release the GIL


@dataclass(frozen=True)
class Problem:
    """One damaged file (all its findings in ``problem``), or one inconsistency of a version as a whole."""

    table_id: str
    partition: PartitionKeys
    where: str  # "compacted version 3", "compacted version 3 index" or "stream 1 delta 5"
    key: str  # the file's storage key (the version manifest's key for a version-wide problem)
    problem: str

    def line(self) -> str:
        return f"{self.table_id} [{format_partition(self.partition)}] {self.where}: {self.key}: {self.problem}"

    def to_json(self) -> dict[str, Any]:
        return {
            "table_id": self.table_id,
            "partition": [list(kv) for kv in self.partition],
            "where": self.where,
            "key": self.key,
            "problem": self.problem,
        }


@dataclass
class VerifyResult:
    problems: list[Problem] = field(default_factory=list)
    tables: int = 0
    partitions: int = 0
    versions: int = 0  # compacted versions checked
    deltas: int = 0  # uncompacted deltas checked
    files: int = 0  # distinct files read
    bytes: int = 0  # bytes read
    unchecksummed: int = 0  # file references without a recorded checksum (written before checksums existed)
    unchanged: int = 0  # files taken as verified: unchanged since ``unchanged_since`` (verify_scope.py)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (
            f"verified {self.tables} table(s), {self.partitions} partition(s), {self.versions} compacted version(s), "
            f"{self.deltas} uncompacted delta(s): {self.files} files, {self.bytes} B read in {self.seconds:.2f}s"
        )
        if self.unchecksummed:
            head += f" ({self.unchecksummed} file reference(s) without a recorded checksum: size and rows checked)"
        if self.unchanged:
            head += f" ({self.unchanged} file(s) unchanged since a version verified before: not read)"
        return f"{head}: ok" if self.ok else f"{head}: {len(self.problems)} problem(s)"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "summary": self.summary(),
            "problems": [p.to_json() for p in self.problems],
            "tables": self.tables,
            "partitions": self.partitions,
            "versions": self.versions,
            "deltas": self.deltas,
            "files": self.files,
            "bytes": self.bytes,
            "unchecksummed": self.unchecksummed,
            "unchanged": self.unchanged,
            "seconds": round(self.seconds, 4),
        }


def _unresolved(fn: np.ndarray, row: np.ndarray, limits: np.ndarray, numbers: set[int]) -> list[str]:
    """The finding for index pointers (file numbers ``fn``, rows ``row``) that name no row of the version
    (``limits``: rows of file n at n), if any."""
    max_fn = len(limits) - 1
    inside = fn <= max_fn
    limit = np.zeros(len(fn), dtype=np.uint64)
    limit[inside] = limits[fn[inside]]
    bad = np.flatnonzero(row >= limit)  # also catches file numbers not in the version (limit 0)
    if not len(bad):
        return []
    i = int(bad[0])
    n, r = int(fn[i]), int(row[i])
    what = (f"row {r} is beyond file {n}'s {int(limits[n])} rows" if n in numbers
            else f"file {n} is not a file of the version (its files: {len(numbers)}, numbered up to {max_fn})")
    return [f"{len(bad)} of {len(fn)} pointer(s) do not resolve, first at index row {i}: {what}"]


class _Verifier:
    def __init__(self, catalog: Catalog, result: VerifyResult, since: CompactedVersion | None = None) -> None:
        self.catalog = catalog
        self.since = since  # a version verified before: the latest version's files unchanged since are not read
        self.storage = catalog.storage
        self.result = result
        self.facts: dict[str, FileFacts] = {}  # by key: carried files belong to many versions, read once
        self._destinations: dict[str, list[str] | None] = {}  # by source table: its destination records
        # manifests whose record was checked (a source's and a destination's run)
        self._checked_records: set[str] = set()

    # ----- data files -------------------------------------------------------------------------------------
    def _fetch(self, files: Iterable[DataFile], schema: pa.Schema | None = None) -> None:
        """Facts of ``files`` not yet fetched; a file recording a key range has that column read in its recorded
        type (``schema``, the version's: ORC stores uint64 as int64, CSV has no types)."""
        def column(f: DataFile) -> pa.Field | str | None:
            if f.key_range is None:
                return None
            name = f.key_range.column
            return schema.field(name) if schema is not None and name in schema.names else name

        todo = {f.key: (f.content_type, column(f)) for f in files if f.key not in self.facts}
        if not todo:
            return
        items = list(todo.items())
        with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(items))) as pool:
            got = list(pool.map(lambda kv: data_facts(self.storage, kv[0], *kv[1]), items))
        for (key, _), (facts, nbytes) in zip(items, got):
            self.facts[key] = facts
            self.result.files += 1
            self.result.bytes += nbytes

    def data_files(self, table_id: str, partition: PartitionKeys, where: str, files: Sequence[DataFile],
                   schema: pa.Schema | None = None) -> None:
        self._fetch(files, schema)
        for f in files:
            if not f.checksum:
                self.result.unchecksummed += 1
            facts = self.facts[f.key]
            findings = (file_findings(f.bytes, f.rows, f.checksum, facts) + row_group_findings(f, facts)
                        + key_range_findings(f, facts))
            if findings:
                self.result.problems.append(Problem(table_id, partition, where, f.key,
                                                    f"data file {f.file_number}: " + "; ".join(findings)))

    # ----- index ------------------------------------------------------------------------------------------
    def index(self, v: CompactedVersion, manifest_key: str, unchanged: set[str]) -> None:
        from flash_pipeline.compactor.index import dead_entries, pk_index

        index = v.index
        if index is None:
            raise InternalError(f"compacted version {v.version}: index check called without an index")
        where = f"compacted version {v.version} index"
        legacy_width = pk_index.legacy_index_dtype(index.sort_key_width).itemsize
        numbers = {f.file_number for f in v.files}
        max_fn = max(numbers, default=0)
        limits = np.zeros(max_fn + 1, dtype=np.uint64)  # rows of file n at n; 0 for numbers not in the version
        for data_file in v.files:
            limits[data_file.file_number] = data_file.rows
        flat, taken = index_files_to_read(v, self.since, unchanged)
        self.result.unchanged += len(taken)
        self.still_there(v, where, taken)
        try:  # rows deletion vectors mark dead: index rows pointing at one are dead entries (IndexFile.dead_rows)
            dead_pointers = dead_entries.version_dead_pointers(self.catalog, v.files)
        except (NotFound, IntegrityError):
            dead_pointers = None  # the data check names the unreadable vector

        def fetch(item: tuple[int, Any]) -> bytes | None:
            try:
                return self.storage.read(item[1].key)
            except NotFound:
                return None

        with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(flat)))) as pool:
            blobs = list(pool.map(fetch, flat))
        pointer_keys = []
        total = sum(f.live_rows for f in taken)  # unchanged since self.since: their recorded live rows
        for (b, f), data in zip(flat, blobs):
            self.result.files += 1
            if not f.checksum:
                self.result.unchecksummed += 1
            if data is None:
                self._problem(v, where, f.key, f"bucket {b}: index file missing (recorded {f.bytes} B, {f.rows} rows)")
                continue
            self.result.bytes += len(data)
            findings = []
            if len(data) != f.bytes:
                findings.append(f"holds {len(data)} B, the manifest recorded {f.bytes} B")
            if f.checksum and checksum_of(data) != f.checksum:
                findings.append("content checksum differs from the recorded one (replaced or changed after its commit)")
            width = (legacy_width if f.rows and f.bytes == f.rows * legacy_width
                     else pk_index.index_dtype(index.sort_key_width).itemsize)
            if len(data) % width:
                findings.append(f"size {len(data)} B is not a multiple of the {width}-byte index row")
            rows = pk_index.file_rows(data[: len(data) - len(data) % width], f, index.sort_key_width)
            dead = int(dead_entries.dead_mask(rows, dead_pointers).sum()) if dead_pointers is not None else f.dead_rows
            total += len(rows) - dead
            if len(rows) != f.rows:
                findings.append(f"holds {len(rows)} index rows, the manifest recorded {f.rows}")
            if dead != f.dead_rows:
                findings.append(f"{dead} of its rows point at rows deletion vectors mark dead, the manifest recorded "
                                f"{f.dead_rows}")
            fn = rows["file"].astype(np.int64)
            row = rows["row"].astype(np.uint64)
            findings += _unresolved(fn, row, limits, numbers)
            if len(rows) and f.first_file and (int(fn.min()) < f.first_file or int(fn.max()) > f.last_file):
                findings.append(f"points into files {int(fn.min())}..{int(fn.max())}, the manifest recorded files "
                                f"{f.first_file}..{f.last_file}")
            if len(rows):
                wrong = np.flatnonzero(pk_index.bucket_of_rows(rows, index.hash_bucket_count) != b)
                if len(wrong):
                    findings.append(f"{len(wrong)} row(s) whose digest hashes to another bucket than {b}")
            if findings:
                self._problem(v, where, f.key, f"bucket {b}: " + "; ".join(findings))
            pointer_keys.append((fn << 40) | row.astype(np.int64))
        if total != v.rows:
            self._problem(v, where, manifest_key, f"the index holds {total} rows, the version's files {v.rows}")
        if pointer_keys:
            keys = np.sort(np.concatenate(pointer_keys))
            dup = int(np.count_nonzero(keys[1:] == keys[:-1])) if len(keys) > 1 else 0
            if dup:
                self._problem(v, where, manifest_key, f"{dup} index row(s) point at a row another index row points at")

    def still_there(self, v: CompactedVersion, where: str, files: Sequence[Any]) -> None:
        """Files taken as verified (unchanged since ``self.since``) are not read, but each must still be stored with
        its recorded size: one HEAD (stat) each, as a compaction checks the files it carries. A file deleted or
        replaced since the proof is a problem like any other."""
        def size(f: Any) -> int | None:
            try:
                return self.storage.size(f.key)
            except (NotFound, FileNotFoundError):
                return None

        if not files:
            return
        with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(files))) as pool:
            sizes = list(pool.map(size, files))
        for f, got in zip(files, sizes):
            name = f"data file {f.file_number}" if isinstance(f, DataFile) else "index file"
            if got is None:
                self._problem(v, where, f.key, f"{name}: missing (recorded {f.bytes} B, {f.rows} rows)")
            elif got != f.bytes:
                self._problem(v, where, f.key, f"{name}: holds {got} B, the manifest recorded {f.bytes} B")

    def _problem(self, v: CompactedVersion, where: str, key: str, text: str) -> None:
        self.result.problems.append(Problem(v.table_id, v.partition, where, key, text))

    # ----- versions and deltas ----------------------------------------------------------------------------
    def compacted(self, table_id: str, partition: PartitionKeys, all_versions: bool) -> None:
        numbers = self.catalog.compacted_versions(table_id, partition)
        if not all_versions:
            numbers = numbers[-1:]
        for n in numbers:
            manifest_key = self.catalog.version_key(table_id, partition, n)
            try:
                v = self.catalog.compacted_version(table_id, partition, n)
            except NotFound:
                continue  # expired between the listing and the read
            self.result.versions += 1
            self.destination_recorded(v, manifest_key)
            unchanged = unchanged_data_keys(v, self.since)
            self.result.unchanged += len(unchanged)
            self.still_there(v, f"compacted version {n}", [f for f in v.files if f.key in unchanged])
            self.data_files(table_id, partition, f"compacted version {n}",
                            [f for f in v.files if f.key not in unchanged], v.pa_schema() if v.arrow_schema else None)
            if v.index is not None:
                self.index(v, manifest_key, unchanged)
            if v.delta_log and self.catalog.deltalake_committed(v):  # an unpublished newest version is not visible yet
                mismatch = self.catalog.deltalake_mismatch(v)
                if mismatch:
                    self._problem(v, f"compacted version {n} Delta log",
                                  self.catalog.deltalake_commit_key(table_id, partition, n), mismatch)
            for key in self.catalog.iceberg_missing_deletes(v):  # what pyiceberg and DuckDB read the vectors from
                self._problem(v, f"compacted version {n} Iceberg snapshot", key, "missing")

    def destination_recorded(self, v: CompactedVersion, manifest_key: str) -> None:
        """A version compacted from another table must be among that table's destination records (written before
        every such commit): without it, reads and optimize of the source do not look here."""
        source = v.source_table_id
        if source == v.table_id or manifest_key in self._checked_records:
            return
        self._checked_records.add(manifest_key)
        if source not in self._destinations:
            self._destinations[source] = self.catalog.destinations_of(source)
        recorded = self._destinations[source]
        if recorded is not None and v.table_id not in recorded:
            self._problem(v, f"compacted version {v.version}", manifest_key,
                          f"it was compacted from {source!r}, which does not record {v.table_id!r} among its "
                          f"destinations (written by an older flash-compactor?): a read of {source!r} without "
                          f"--compacted-table {v.table_id} does not see it until the next compaction of {source!r} "
                          f"into {v.table_id!r} commits")

    def pending_deltas(self, table_id: str, partition: PartitionKeys, compacted_through: dict[int, int]) -> None:
        for stream in self.catalog.streams(table_id, partition):
            if stream.state == DEPRECATED:
                continue
            after = compacted_through.get(stream.version)
            for d in self.catalog.deltas(table_id, partition, stream.version, after_position=after):
                self.result.deltas += 1
                self.data_files(table_id, partition, f"stream {stream.version} delta {d.position}", d.files)


def _compacted_through(catalog: Catalog, table_id: str, partition: PartitionKeys, tables: list[str],
                       verifier: _Verifier | None = None) -> dict[int, int]:
    """Per stream version of (table, partition): the last position any table's latest compacted version covers
    (deltas up to it were compacted; the compacted table may be another, as with ``compact --destination``).
    Each such version in another table is checked against the source's destination records (``verify --table
    S`` checks S's, though the versions live elsewhere)."""
    out: dict[int, int] = {}
    for holder in tables:
        try:
            latest = catalog.latest_compacted(holder, partition)
        except NotFound:
            continue
        if latest is not None and latest.source_table_id == table_id:
            v = latest.source_stream_version
            out[v] = max(out.get(v, 0), latest.last_position)
            if verifier is not None and holder != table_id:
                verifier.destination_recorded(latest, catalog.version_key(holder, partition, latest.version))
    return out


def verify(
    catalog: Catalog,
    table_id: str | None = None,
    partitions: Sequence[object] | None = None,
    all_versions: bool = False,
    unchanged_since: CompactedVersion | None = None,
) -> VerifyResult:
    """Check every file of the latest (``all_versions``: every retained) compacted version and of every delta
    not yet compacted, of ``table_id`` (default: every table) and ``partitions`` (default: all of them).

    ``unchanged_since``: a version of one of those streams verified before; files of that stream's versions
    unchanged since it are taken as verified, not read (verify_scope.py: what a compaction run's check passes).
    Reads each referenced file once; writes nothing. Raises NotFound for an unknown table or partition."""
    started = time.perf_counter()
    result = VerifyResult()
    all_tables = catalog.tables()
    if table_id is not None:
        catalog.require_table(table_id)
        tables = [table_id]
    else:
        tables = all_tables
    wanted = [normalize_partition(p) for p in partitions] if partitions is not None else None
    verifier = _Verifier(catalog, result, unchanged_since)
    for t in tables:
        if wanted is not None:  # the named partitions only: every other partition's record is not read
            for p in wanted:
                catalog.require_partition(t, p)
            parts = wanted
        else:
            parts = catalog.partitions(t)
        result.tables += 1
        for p in parts:
            result.partitions += 1
            verifier.compacted(t, p, all_versions)
            verifier.pending_deltas(t, p, _compacted_through(catalog, t, p, all_tables, verifier))
    result.seconds = time.perf_counter() - started
    return result


__all__ = ["Problem", "VerifyResult", "verify"]
