"""Which files of a compacted version a verification may take as verified: those unchanged since a version of
the same stream verified before (``verify(..., unchanged_since=...)``; a compaction run's ``files_intact``
check passes the last version it passed on).

Cost follows change: re-reading every file of a 5M-row stream after each incremental compaction cost that check
~1 s (495 MB) of which the compaction changed 31 MB. Files are never rewritten in place, so:

- a data file is unchanged when the earlier version lists the very same entry (key, size, rows, checksum,
  deletion vector, key range, row groups): its bytes were checked then;
- an index file is unchanged when the earlier version's same bucket lists the same file (key, size, rows,
  checksum, dead rows), with its compacted file range (``first_file``..``last_file``) recorded in both, and each
  compacted file number of the earlier range names the same unchanged data file as the number the file's
  ``file_shift`` maps it to now (carrying renumbers files: the bytes stay, the shift changes): its pointers then
  resolve to the very rows they resolved to, its live rows are its recorded ones, and no pointer of it can
  meet a pointer of another unchanged index file (they did not meet before). It is still read when the range of
  an index file that is read meets its own: two rows pointing at one row are only found among files read.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from flash_pipeline.catalog.model import CompactedVersion, DataFile, IndexFile


def _entry(f: DataFile) -> tuple[Any, ...]:
    return (f.key, f.bytes, f.rows, f.checksum, f.deletion_vector, f.key_range, f.row_group_rows)


def unchanged_data_keys(version: CompactedVersion, since: CompactedVersion | None) -> set[str]:
    """Keys of ``version``'s data files listed identically (their numbers aside) by ``since``."""
    if since is None or (since.table_id, since.partition) != (version.table_id, version.partition):
        return set()
    before = {_entry(f) for f in since.files}
    return {f.key for f in version.files if _entry(f) in before}


def _spans(files: list[IndexFile]) -> tuple[list[int], list[int]]:
    """Merged [first_file, last_file] intervals of ``files``, as sorted starts and their ends."""
    starts: list[int] = []
    ends: list[int] = []
    for f in sorted(files, key=lambda f: f.first_file):
        if starts and f.first_file <= ends[-1] + 1:
            ends[-1] = max(ends[-1], f.last_file)
        else:
            starts.append(f.first_file)
            ends.append(f.last_file)
    return starts, ends


def _meets(f: IndexFile, starts: list[int], ends: list[int]) -> bool:
    i = bisect_right(starts, f.last_file) - 1
    return i >= 0 and ends[i] >= f.first_file


def index_files_to_read(version: CompactedVersion, since: CompactedVersion | None,
                        unchanged_data: set[str]) -> tuple[list[tuple[int, IndexFile]], list[IndexFile]]:
    """``version``'s (bucket, index file) pairs to read, and the index files taken as verified in ``since``."""
    index = version.index
    assert index is not None
    flat = [(b, f) for b, files in enumerate(index.buckets) for f in files]
    old = since.index if since is not None else None
    if (old is None or not unchanged_data or (old.hash_bucket_count, old.sort_key_width)
            != (index.hash_bucket_count, index.sort_key_width)):
        return flat, []
    now = {f.file_number: f.key for f in version.files}
    then = {f.file_number: f.key for f in since.files} if since is not None else {}
    before = {f.key: f for files in old.buckets for f in files}
    buckets_before = {f.key: b for b, files in enumerate(old.buckets) for f in files}

    def skippable(b: int, f: IndexFile) -> bool:
        e = before.get(f.key)
        if (e is None or buckets_before[f.key] != b or not (f.first_file and e.first_file)
                or (f.rows, f.bytes, f.checksum, f.dead_rows) != (e.rows, e.bytes, e.checksum, e.dead_rows)):
            return False
        moved = f.file_shift - e.file_shift  # carrying renumbered its files by this much
        if (f.first_file - e.first_file, f.last_file - e.last_file) != (moved, moved):
            return False
        return all(now.get(n + moved) == then.get(n) and (then.get(n) is None or then[n] in unchanged_data)
                   for n in range(e.first_file, e.last_file + 1))

    keep = {id(f) for b, f in flat if skippable(b, f)}
    read = [f for _, f in flat if id(f) not in keep]
    if any(not f.first_file for f in read):
        return flat, []  # a file read points anywhere: every pointer may meet one of it
    starts, ends = _spans(read)
    keep = {id(f) for _, f in flat if id(f) in keep and not _meets(f, starts, ends)}
    return [(b, f) for b, f in flat if id(f) not in keep], [f for _, f in flat if id(f) in keep]
