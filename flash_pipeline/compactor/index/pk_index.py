"""The primary key index: fixed-width rows, one set of files per hash bucket.

Byte layout of one index row (all integers big-endian; documented in docs/catalog-layout.md):

    offset  size  field
    0       20    SHA-1 digest of the framed primary key bytes
    20      4     compacted file number (uint32, 1-based, in the compacted stream version)
    24      4     row index inside that compacted file (uint32, 0-based)
    28      k     sort key bytes (k = sum over sort keys of 1 flag byte + the value width; 0 without sort keys)

An index file (``.pki``) is nothing but these rows back to back, so ``np.frombuffer`` reads it without a copy.
28 bytes a row without sort keys: the paper's "20-byte digest plus pointers" (Figure 3-1 implies ~29 bytes a
record). Indexes written before the row index shrank to 4 bytes (rows of ``32 + k`` bytes, row index uint64)
are still read: read_bucket tells them apart by their recorded bytes per row.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np

from flash_pipeline.catalog.checksums import checksum_of
from flash_pipeline.catalog.model import IndexFile, IndexVersion
from flash_pipeline.catalog.numpy_sets import sorted_union
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.index.dead_entries import dead_mask
from flash_pipeline.compactor.index.survivor_rows import reusable_envelopes, survivor_rows
from flash_pipeline.compactor.kernels.digest import hash_buckets
from flash_pipeline.compactor.kernels.index_kernels import (
    merged_index_rows_kernel,
    pointers_ascending_kernel,
    repoint_chunk_kernel,
    reverse_rows_kernel,
)
from flash_pipeline.compactor.kernels.layout import Layout, index_pointers, prior_index_pointers
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.model.rows import concat_rows, take_rows
from flash_pipeline.compactor.model.survivors import MaskedSurvivors
from flash_pipeline.errors import IntegrityError, InternalError

INDEX_EXTENSION = ".pki"


# a compacted file's rows are numbered by the uint32 row index of an index row
MAX_ROWS_PER_FILE = (1 << 32) - 1


def index_dtype(sort_key_width: int) -> np.dtype:
    fields: list[tuple[str, object]] = [("digest", "S20"), ("file", ">u4"), ("row", ">u4")]
    if sort_key_width:
        fields.append(("sort", f"S{sort_key_width}"))
    return np.dtype(fields)


def legacy_index_dtype(sort_key_width: int) -> np.dtype:
    """The first layout's rows (row index uint64, 32 + k bytes), read from indexes written before."""
    fields: list[tuple[str, object]] = [("digest", "S20"), ("file", ">u4"), ("row", ">u8")]
    if sort_key_width:
        fields.append(("sort", f"S{sort_key_width}"))
    return np.dtype(fields)


def file_rows(data: bytes | memoryview, index_file: IndexFile, sort_key_width: int) -> np.ndarray:
    """The rows of one index file's bytes, in today's layout (a legacy file is converted; see the docstring)."""
    legacy = legacy_index_dtype(sort_key_width)
    if index_file.rows and index_file.bytes == index_file.rows * legacy.itemsize and len(data) % legacy.itemsize == 0:
        rows = np.frombuffer(data, dtype=legacy).astype(index_dtype(sort_key_width))
    else:
        dtype = index_dtype(sort_key_width)
        rows = np.frombuffer(data, dtype=dtype, count=len(data) // dtype.itemsize)
    if index_file.file_shift:  # carried by reference into a version that renumbered its compacted files
        rows = rows if rows.flags.writeable else rows.copy()  # a chunk in a reader's own buffer is shifted in place
        rows["file"] = rows["file"].astype(np.int64) + index_file.file_shift
    return rows


def make_rows(digests: np.ndarray, files: np.ndarray, rows: np.ndarray, sort_bytes: np.ndarray) -> np.ndarray:
    width = sort_bytes.shape[1] if sort_bytes.ndim == 2 else 0
    out = np.empty(len(files), dtype=index_dtype(width))
    out["digest"] = np.ascontiguousarray(digests).view("S20").reshape(-1)
    out["file"] = files
    out["row"] = rows
    if width:
        out["sort"] = np.ascontiguousarray(sort_bytes).view(f"S{width}").reshape(-1)
    return out


def next_bucket_rows(plan: RoundPlan, layout: Layout, bucket: int, survivors: np.ndarray, prior: np.ndarray,
                     lost_at: np.ndarray) -> np.ndarray:
    """A bucket's rows in the next index version, in pointer order: the live prior rows that did not lose, re-pointed
    into the new layout (their digest and sort bytes copied as they are), plus the surviving new rows."""
    keep = ~dead_mask(prior, plan.dead_pointers)  # the dead entries of carried index files go too
    keep[lost_at] = False
    pointers = prior_index_pointers(plan, layout, prior, keep)
    if pointers is None:  # rows not in pointer order (not written by us): sort them, with their kept mask
        order = pointer_order(prior)
        prior, keep = take_rows(prior, order), keep[order]
        pointers = prior_index_pointers(plan, layout, prior, keep)
        if pointers is None:
            raise InternalError(f"{plan.where}: index rows still out of pointer order after sorting")
    new_files, new_rows = index_pointers(layout, bucket, survivors["rank"])
    files = np.concatenate([pointers[0], new_files])
    rows = np.concatenate([pointers[1], new_rows])
    key = (files << 40) | rows
    if len(key) > 1 and not bool(np.all(key[1:] > key[:-1])):
        order = np.argsort(key, kind="stable")  # carried files come first, rewritten and new rows after
    else:
        order = np.arange(len(key), dtype=np.int64)
    width = plan.spec.sort_key_width
    out = np.empty(len(key), dtype=index_dtype(width))
    if len(out):
        prior_raw = np.ascontiguousarray(prior).view(np.uint8).reshape(len(prior), prior.dtype.itemsize)
        env = np.ascontiguousarray(survivors).view(np.uint8).reshape(len(survivors), survivors.dtype.itemsize)
        merged_index_rows_kernel(prior_raw, np.flatnonzero(keep), env, order, files, rows, width,
                                 out.view(np.uint8).reshape(len(out), out.dtype.itemsize))
    return out


# the index writer streams a prior bucket in chunks of this many rows (28 MiB at 28 bytes a row)
CHUNK_ROWS = 1 << 20


class ChunkBuffer:
    """The bytes a streaming index reader reuses for each chunk, grown to the largest chunk asked for. A fresh
    allocation per chunk touched new pages each time: dedupe streams every index file of a bucket (scenario
    3's 176 MiB), and a chunk read into a reused buffer took 1 ms where a new one took 4-6 ms."""

    def __init__(self) -> None:
        self._data = np.empty(0, dtype=np.uint8)

    def view(self, nbytes: int) -> memoryview:
        if len(self._data) < nbytes:
            self._data = np.empty(nbytes, dtype=np.uint8)  # not zeroed: the read writes every byte used
        return self._data.data[:nbytes]


def file_chunks(storage: Storage, f: IndexFile, width: int, chunk_rows: int | None = None,
                buffer: ChunkBuffer | None = None) -> Iterator[np.ndarray]:
    """One index file's rows, ``chunk_rows`` (default CHUNK_ROWS) at a time (ranged reads into ``buffer``, one
    of its own if not given): a chunk is valid until the next is asked for."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    buffer = buffer or ChunkBuffer()
    legacy = legacy_index_dtype(width).itemsize
    row_bytes = legacy if f.rows and f.bytes == f.rows * legacy else index_dtype(width).itemsize
    for start in range(0, f.rows, chunk_rows):
        n = min(chunk_rows, f.rows - start)
        data = buffer.view(n * row_bytes)
        if storage.read_range_into(f.key, start * row_bytes, data) != n * row_bytes:
            raise IntegrityError(f"index file {f.key} holds fewer than its recorded {f.rows} rows; run flash-compactor "
                                 "verify")
        yield file_rows(data, f, width)


def carryable_index_files(plan: RoundPlan, layout: Layout, bucket: int) -> dict[int, IndexFile]:
    """The prior index files of ``bucket`` (by position) that the next version carries by reference, with the
    entry it records for each: every compacted file their rows point to was carried (so none of their rows lost
    and each keeps its row index) under consecutive new numbers, so the rows are the same bytes read with a new
    ``file_shift``. Clustered changes leave most index files, like most compacted files, untouched."""
    if plan.prior_index is None:
        return {}
    new_of = {s.file_number: int(layout.carried_file_number[s.src]) for s in plan.sources if s.prior}
    out = {}
    for i, f in enumerate(plan.prior_index.buckets[bucket]):
        if not f.first_file or not f.rows:
            continue  # written before index files recorded their compacted files
        a, b = f.first_file, f.last_file
        numbers = [new_of.get(n, 0) for n in range(a, b + 1)]
        if min(numbers) > 0 and numbers[-1] - numbers[0] == b - a:
            out[i] = replace(f, first_file=numbers[0], last_file=numbers[-1], file_shift=f.file_shift + numbers[0] - a)
    return out


def stream_next_bucket_rows(storage: Storage, plan: RoundPlan, layout: Layout, bucket: int,
                            survivors: np.ndarray | MaskedSurvivors,
                            lost_at: np.ndarray, carry: dict[int, IndexFile] | None = None
                            ) -> tuple[np.ndarray, list[tuple[int, IndexFile]]] | None:
    """next_bucket_rows without holding the prior bucket: its files are read in chunks and each kept row is
    re-pointed straight into the output (index_kernels.repoint_chunk_kernel), so the writer's memory is the output,
    28 + k bytes an index row, plus one chunk -- the paper's fixed cost per row. Kept rows of carried files come
    first, then those of rewritten units, then the new survivors: None when that is not pointer order (or the
    prior rows are not, as an index from elsewhere may be); the caller then sorts (next_bucket_rows).

    The prior files in ``carry`` (carryable_index_files) are neither read nor copied: the result is (the rows
    to write, [(slot, entry)]) where each carried entry's rows belong before row ``slot`` of the rows to write."""
    width = plan.spec.sort_key_width
    dtype = index_dtype(width)
    prior_files = plan.prior_index.buckets[bucket] if plan.prior_index is not None else ()
    n_prior = sum(f.rows for f in prior_files)
    lost = np.ascontiguousarray(lost_at, dtype=np.int64)
    starts = np.cumsum([0] + [f.rows for f in prior_files])
    lost_in = np.searchsorted(lost, starts)  # lost_in[i]..lost_in[i+1]: the lost positions inside file i
    # a carried file's rows that lost stay in its bytes as dead entries: only where its compacted files were carried
    # with a deletion vector that marks their rows dead (vectors on); without vectors, a file whose compacted files
    # were all carried lost no row, and should dedupe say otherwise, the file is read and re-pointed like the others
    carry = {i: replace(e, dead_rows=e.dead_rows + int(lost_in[i + 1] - lost_in[i])) for i, e in (carry or {}).items()
             if plan.spec.deletion_vectors or lost_in[i] == lost_in[i + 1]}
    streamed = [i for i in range(len(prior_files)) if i not in carry]
    # prior rows this writer copies: those of the files it reads, less their rows that lost and their dead entries
    n_kept = sum(prior_files[i].live_rows - int(lost_in[i + 1] - lost_in[i]) for i in streamed)
    reused = reusable_envelopes(survivors, dtype) if n_kept == 0 else None
    out = reused[: len(survivors)] if reused is not None else np.empty(n_kept + len(survivors), dtype=dtype)
    raw_out = out.view(np.uint8).reshape(len(out), dtype.itemsize)
    placed: list[tuple[int, IndexFile]] = []
    if n_prior:
        state = np.array([0, -1, 0, 0, 0, n_kept - 1, -1, -1], dtype=np.int64)
        unit_keys, block_start0 = plan.prior_unit_keys(), np.ascontiguousarray(layout.block_start[0])
        first, buffer, skipped = 0, ChunkBuffer(), 0
        for i, f in enumerate(prior_files):
            if i in carry:
                placed.append((int(state[4]), carry[i]))
                first += f.rows
                continue
            for chunk in file_chunks(storage, f, width, buffer=buffer):
                raw = np.ascontiguousarray(chunk).view(np.uint8).reshape(len(chunk), dtype.itemsize)
                skip = lost[np.searchsorted(lost, first):np.searchsorted(lost, first + len(chunk))]
                if f.dead_rows:  # its dead entries are dropped like the rows that lost: folded in
                    dead_at = first + np.flatnonzero(dead_mask(chunk, plan.dead_pointers))
                    skipped += len(dead_at)
                    skip = sorted_union(skip, dead_at)
                state[3] = 0
                status = repoint_chunk_kernel(
                    raw, first, skip, unit_keys, layout.lost_ranks, layout.lost_src_first, layout.carried_file_number,
                    block_start0, layout.task_of_src, layout.task_file_base, layout.rows_per_file, width, raw_out,
                    state,
                )
                if status == -2:
                    raise IntegrityError(f"{plan.where}: a primary key index pointer lies outside the compacted files; "
                                         "run flash-compactor verify, then rebuild the index (compact --rebuild)")
                if status < 0 or state[3] != len(skip):
                    return None
                first += len(chunk)
        dead_recorded = sum(prior_files[i].dead_rows for i in streamed)
        if first != n_prior or state[4] != state[5] + 1 or skipped != dead_recorded:
            return None  # the recorded rows or the lost positions do not add up: let the general path decide
        reverse_rows_kernel(raw_out, int(state[4]), n_kept)
    survivor_rows(layout, bucket, survivors, width, raw_out[n_kept:])
    if pointers_ascending_kernel(raw_out):
        return out, placed
    # the envelopes became these rows: no general path can read them again, so sort them as it would
    return (take_rows(out, pointer_order(out)), placed) if reused is not None else None


# an index file is cut where the compacted file its rows point to changes, once it holds this many rows (so that
# changes clustered in a few compacted files leave the other index files to be carried), and at rows_per_file
MIN_INDEX_FILE_ROWS = 1 << 16


def _segments(file_numbers: np.ndarray, start: int, end: int, rows_per_file: int) -> list[tuple[int, int]]:
    """(start, end) of the index files that rows ``start..end-1`` (pointer order) are written as."""
    if end <= start:
        return []
    rows_per_file = max(1, rows_per_file)
    cuts = start + 1 + np.flatnonzero(file_numbers[start + 1 : end] != file_numbers[start : end - 1])
    out = []
    s = start
    while s < end:
        limit = min(end, s + rows_per_file)
        i = int(np.searchsorted(cuts, s + min(MIN_INDEX_FILE_ROWS, rows_per_file)))
        e = int(cuts[i]) if i < len(cuts) and cuts[i] < limit else limit
        out.append((s, e))
        s = e
    return out


def write_bucket(
    storage: Storage, prefix: str, bucket: int, rows: np.ndarray, rows_per_file: int, in_pointer_order: bool = False,
    carried: list[tuple[int, IndexFile]] | None = None,
) -> tuple[IndexFile, ...]:
    """Write one bucket's index rows as files of at most ``rows_per_file`` rows (an empty bucket has none), cut
    where the compacted file changes (_segments); ``carried`` prior files (slot, entry) are listed in place,
    not written (stream_next_bucket_rows)."""
    # concatenation may hand back native-endian fields: always write the documented big-endian layout
    width = rows.dtype["sort"].itemsize if rows.dtype.names and "sort" in rows.dtype.names else 0
    rows = rows.astype(index_dtype(width), copy=False)
    if not in_pointer_order:
        rows = take_rows(rows, pointer_order(rows))
    file_numbers = rows["file"]  # a view: a copy would cost the writer 8 more bytes an index row
    files: list[IndexFile] = []
    n = 0
    at = 0
    for slot, entry in [*(carried or []), (len(rows), None)]:
        for s, e in _segments(file_numbers, at, slot, rows_per_file):
            key = f"{prefix}/bucket-{bucket:06d}/{n:06d}{INDEX_EXTENSION}"
            data = np.ascontiguousarray(rows[s:e]).view(np.uint8).data  # no copy of the rows
            storage.write_data(key, data)
            files.append(IndexFile(key, e - s, len(data), checksum_of(data), int(file_numbers[s]),
                                   int(file_numbers[e - 1])))
            n += 1
        if entry is not None:
            files.append(entry)
        at = slot
    return tuple(files)


def write_next_bucket(storage: Storage, plan: RoundPlan, layout: Layout, bucket: int,
                      survivors: np.ndarray | MaskedSurvivors, lost_at: np.ndarray) -> tuple[IndexFile, ...]:
    """The index writer of one bucket: its rows in the next index version, written in pointer order, the prior
    files whose compacted files were all carried carried too (carryable_index_files). Streams the prior bucket
    (stream_next_bucket_rows); an index whose order that cannot keep is read whole, in pointer order as dedupe
    read it (``lost_at`` refers to that order), sorted and written whole."""
    streamed = stream_next_bucket_rows(storage, plan, layout, bucket, survivors, lost_at,
                                       carryable_index_files(plan, layout, bucket))
    if streamed is None:
        if isinstance(survivors, MaskedSurvivors):
            survivors = survivors.envelopes()
        prior = (read_bucket(storage, plan.prior_index, bucket) if plan.prior_index is not None
                 else np.empty(0, dtype=index_dtype(plan.spec.sort_key_width)))
        rows = next_bucket_rows(plan, layout, bucket, survivors, in_pointer_order(prior), lost_at)
        return write_bucket(storage, plan.index_prefix, bucket, rows, plan.spec.rows_per_index_file,
                            in_pointer_order=True)
    rows, carried = streamed
    return write_bucket(storage, plan.index_prefix, bucket, rows, plan.spec.rows_per_index_file, in_pointer_order=True,
                        carried=carried)


def read_bucket(storage: Storage, index: IndexVersion, bucket: int) -> np.ndarray:
    dtype = index_dtype(index.sort_key_width)
    parts = [file_rows(storage.read(f.key), f, index.sort_key_width) for f in index.buckets[bucket]]
    return concat_rows(parts, dtype)


def read_all(storage: Storage, index: IndexVersion) -> np.ndarray:
    parts = [read_bucket(storage, index, b) for b in range(index.hash_bucket_count)]
    dtype = index_dtype(index.sort_key_width)
    return concat_rows(parts, dtype)


def pointer_order(rows: np.ndarray) -> np.ndarray:
    """Permutation that sorts index rows by (file number, row index): the order index files are written in."""
    key = (rows["file"].astype(np.int64) << 40) | rows["row"].astype(np.int64)
    return np.argsort(key, kind="stable")


def _raw(rows: np.ndarray) -> np.ndarray:
    width = rows.dtype["sort"].itemsize if "sort" in (rows.dtype.names or ()) else 0
    rows = np.ascontiguousarray(rows.astype(index_dtype(width), copy=False))  # the big-endian layout kernels read
    return rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)


def pointers_ascending(rows: np.ndarray) -> bool:
    """Are the rows' (file, row) pointers strictly ascending, as every index this engine writes?"""
    return len(rows) < 2 or bool(pointers_ascending_kernel(_raw(rows)))


def first_pointer(rows: np.ndarray) -> int:
    return (int(rows["file"][0]) << 40) | int(rows["row"][0])


def last_pointer(rows: np.ndarray) -> int:
    return (int(rows["file"][-1]) << 40) | int(rows["row"][-1])


def in_pointer_order(rows: np.ndarray) -> np.ndarray:
    """``rows`` as they are when already in pointer order (every index this engine writes), else sorted."""
    return rows if pointers_ascending(rows) else take_rows(rows, pointer_order(rows))


def bucket_of_rows(rows: np.ndarray, bucket_count: int) -> np.ndarray:
    digests = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)
    return hash_buckets(digests, bucket_count)
